#!/usr/bin/env bash
# Lock mode lease, pg_terminate_backend (SPEC "Lock modes", guarantees 3 and 5): each of
# the daemon's sessions (listener, fence, lease) is terminated in turn while lease jobs
# run: the commands keep running, the daemon reconnects, the jobs end once each with
# attempts = 1, and the outcomes of jobs that ended while the lease session was gone are
# written once it is back. A daemon serving only lease-mode queues uses three sessions.
# Then a lock held on pgjobd.waiting (every claim needs it) for longer than a lease: the
# claims on the lease session fail after its lock_timeout instead of holding up the
# extensions behind them, so a running job keeps its lease of 2 s; and a job that ends
# meanwhile has its outcome written although the claims fail.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
write_conf "$T/a.ini" <<EOF
$(conf_header)

[queue.t]
command = exec '$T/mark.sh'
concurrency = 6
lock_mode = lease
lease = 8s
max_attempts = 3
kill_grace = 1s

[queue.t2]
command = exec '$T/mark.sh'
concurrency = 2
lock_mode = lease
lease = 2s
max_attempts = 1
EOF
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

# Three long jobs and a stream of short ones (each short one ends while some session is
# gone, or just after).
# The long ones wait for the gate file, made once every session has been terminated: they
# run through all of it, however long the reconnects take.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 't', 'long' || i, '{\"gate\": \"long\"}' FROM generate_series(1, 3) i" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 't', 'short' || (i % 2), '{\"sleep\": 0.3}' FROM generate_series(1, 30) i" >/dev/null
wait_until 15 "[ \"\$(count_jobs \"group_id LIKE 'long%' AND status = 'running'\")\" = 3 ]" ||
	bail_out "the long jobs did not start"
wait_until 10 "[ \"\$(awk '\$1 == \"start\" && \$2 ~ /^long/' '$T/marks.log' | wc -l)\" = 3 ]" ||
	bail_out "the long jobs' commands did not start"
pids=$(awk '$1 == "start" && $2 ~ /^long/ { print $5 }' "$T/marks.log" | tr '\n' ' ')
alive() {
	local p
	for p in $pids; do pid_alive "$p" || return 1; done
}
sessions() { psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'"; }
is "$(psql_q "SELECT string_agg(application_name, ',' ORDER BY application_name)
              FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'")" \
	"pgjobd fence,pgjobd lease,pgjobd listener" "three sessions: listener, fence, lease"

for s in lease listener fence lease; do
	n=$(psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	            WHERE application_name = 'pgjobd $s'")
	is "$n" 1 "the $s session was terminated"
	wait_until 15 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobd $s'\")\" = 1 ]"
	ok $? "the daemon connected its $s session again"
	sleep 0.7
	alive
	ok $? "the long jobs' commands still run"
done
touch "$T/gate.long"
wait_until 40 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 33 ]"
ok $? "all 33 jobs succeeded"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE attempts <> 1")" 0 "each in one attempt"
is "$(awk '$1 == "start"' "$T/marks.log" | wc -l | tr -d ' ')" 33 "each command started once"
problems=$(check_markers "$T/marks.log")
is "$problems" "" "no overlap, group order kept"
if grep -q "lost_lock\|lease lost\|giving up" "$T/a.log"; then
	fail "no lease was lost, no outcome given up"
else
	pass "no lease was lost, no outcome given up"
fi
# A lock that blocks every claim, for 5 s, while a job under a lease of 2 s runs.
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('t2', '{\"sleep\": 8}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id 1" || fail "the job under a lease of 2 s started"
p=$(mark_pid "$T/marks.log" "$id" 1)
psql -X -qAt -c "BEGIN; LOCK pgjobd.waiting IN SHARE MODE; SELECT pg_sleep(5); COMMIT" >/dev/null 2>&1 &
locker=$!
sleep 0.3
id2=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('t2', '{\"sleep\": 0.1}') RETURNING id")
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobd lease' AND wait_event_type = 'Lock'\")\" = 1 ]"
ok $? "a claim on the lease session waits for the lock"
wait "$locker"
pid_alive "$p"
ok $? "after 5 s of the lock, the job's command still runs"
wait_until 20 "[ \"\$(count_jobs \"id IN ($id, $id2) AND status = 'succeeded'\")\" = 2 ]"
ok $? "both jobs succeeded"
is "$(job_field "$id" attempts)" 1 "the long one in one attempt: its lease held throughout"
# The same lock while a job ends: its outcome and the claim for its slot go in one
# transaction, which the claim's lock_timeout fails. The outcome is then written on its
# own, while the lock is still held, and that failure is not counted against it.
id3=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('t2', '{\"sleep\": 1}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id3 1" || fail "the job of 1 s started"
undone0=$(grep -c "outcomes and claims of the batch undone" "$T/a.log")
psql -X -qAt -c "BEGIN; LOCK pgjobd.waiting IN SHARE MODE; SELECT pg_sleep(8); COMMIT" >/dev/null 2>&1 &
locker=$!
wait_until 7 "[ \"\$(count_jobs \"id = $id3 AND status = 'succeeded'\")\" = 1 ]"
ok $? "a job that ended while claims failed: its outcome is written"
kill -0 "$locker" 2>/dev/null
ok $? "while the lock that fails the claims is still held"
[ "$(grep -c "outcomes and claims of the batch undone" "$T/a.log")" -gt "$undone0" ]
ok $? "the failed transaction of outcome and claim is logged"
wait "$locker"
is "$(job_field "$id3" attempts)" 1 "in one attempt"
if grep -q "giving up" "$T/a.log"; then
	fail "no outcome given up"
else
	pass "no outcome given up"
fi

pid_alive "$A"
ok $? "the daemon is still running"
stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
