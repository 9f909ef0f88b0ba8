#!/usr/bin/env bash
# Lock mode lease under load: outcomes are gathered (src/hold_lease.c, gather()). With a
# backlog in the queue and commands still running, the outcome of the first command to
# end waits up to 3 ms for more, so that one statement (and one commit) writes several;
# finish_leases stamps every job of one statement with the same finished_at. Eight
# commands end while the daemon is stopped (SIGSTOP), so that it finds them all ended at
# once when it goes on: the first outcome is held for more (logged at debug), and the
# first outcome statement carries several of them. Then a lone job, with no backlog,
# runs as usual.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

write_conf "$T/a.ini" <<EOF2
$(conf_header)

[queue.g]
command = echo x >>'$T/waiting'; flock -s 9 9<'$T/gate'; echo x >>'$T/done'
concurrency = 8
lock_mode = lease
lease = 30s
EOF2
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"
# The test holds the lock (taken after the daemon started: it must not inherit it); the
# commands wait for it.
exec 9>"$T/gate"
flock -x 9 || bail_out "cannot lock the gate"
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'g', '{}' FROM generate_series(1, 16)" >/dev/null
wait_until 15 "[ \"\$(count_jobs \"status = 'running'\")\" = 8 ]"
ok $? "8 jobs running (a backlog of 8 behind them)"
# every command waits for the lock (each notes it just before)
wait_until 10 "[ \"\$(wc -l <'$T/waiting' 2>/dev/null)\" = 8 ]"
ok $? "their commands wait for the gate"
kill -STOP "$A"
exec 9>&-
wait_until 10 "[ \"\$(wc -l <'$T/done' 2>/dev/null)\" = 8 ]"
ok $? "the 8 commands ended while the daemon was stopped"
sleep 0.3
kill -CONT "$A"
wait_until 20 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 16 ]"
ok $? "all 16 jobs succeeded"
first=$(psql_q "SELECT count(*) FROM pgjobd.jobs
                WHERE finished_at = (SELECT min(finished_at) FROM pgjobd.jobs)")
cmp_ok "$first" -ge 2 "the first outcome statement wrote several of the 8"
# The content alone does not show the gathering: a batch also carries several outcomes
# when the session was busy (a maintenance pass due after the stop) as they came.
grep -q 'msg="batch held for more outcomes"' "$T/a.log"
ok $? "the first outcome was held for more"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE attempts <> 1")" 0 "each in one attempt"

# No backlog (the last claim came back short): a lone job.
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('g', '{}') RETURNING id")
wait_until 10 "[ \"\$(job_field "$id" status)\" = succeeded ]"
ok $? "a lone job succeeded"
grep -q "level=error" "$T/a.log" && fail "no error logged" || pass "no error logged"
stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
