#!/usr/bin/env bash
# Lock mode lease through PostgreSQL restarts (SPEC "Lock modes", guarantees 1 and 3):
# while lease jobs run (lease 10 s), PostgreSQL is restarted with -m fast, then stopped
# with -m immediate and started again after 3.5 s, longer than the daemon's fence
# (fence_timeout 2 s plus its margin), so that its instance is declared dead and it must
# register again. The commands survive both, each job ends once, succeeded, with
# attempts = 1; a job enqueued after the restarts runs too.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
write_conf "$T/a.ini" <<EOF
$(conf_header fence_timeout=2s)

[queue.r]
command = exec '$T/mark.sh'
concurrency = 4
lock_mode = lease
lease = 10s
max_attempts = 3
kill_grace = 1s
EOF
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

ids=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
              VALUES ('r', 'g1', '{\"sleep\": 16}'), ('r', 'g2', '{\"sleep\": 16}'),
                     ('r', NULL, '{\"sleep\": 16}'), ('r', 'g1', '{\"sleep\": 1}')
              RETURNING id" | tr '\n' ' ')
set -- $ids
wait_until 15 "mark_started $T/marks.log $1 1 && mark_started $T/marks.log $2 1 && mark_started $T/marks.log $3 1" ||
	bail_out "the jobs did not start"
pids="$(mark_pid "$T/marks.log" "$1" 1) $(mark_pid "$T/marks.log" "$2" 1) $(mark_pid "$T/marks.log" "$3" 1)"
alive() {
	local p
	for p in $pids; do pid_alive "$p" || return 1; done
}
worker0=$(psql_q "SELECT max(id) FROM pgjobd.workers")

ok_cmd "pg_ctl restart -m fast" pg_restart
wait_until 15 "psql_q 'SELECT 1' >/dev/null 2>&1" || bail_out "PostgreSQL did not come back"
sleep 1
alive
ok $? "fast restart: the three commands still run"

log_lines=$(wc -l <"$T/a.log")
as_pg "$PG_BINDIR/pg_ctl" -w -D "$T/pg" -m immediate stop >/dev/null
stopped_at=$(now_ms)
sleep 3.5
as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -o "$(pg_opts)" start >/dev/null ||
	bail_out "PostgreSQL did not start again"
note "PostgreSQL was down for $(($(now_ms) - stopped_at)) ms"
alive
ok $? "immediate stop for 3.5 s: the three commands still run"
wait_until 15 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.workers WHERE id > $worker0 AND alive_until > now()\")\" -ge 1 ]"
ok $? "the daemon registered a new instance (its old one was declared dead)"
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.jobs WHERE status = 'running' AND worker_id > $worker0\")\" = 3 ]"
ok $? "its next extension pointed the leases at the new instance"
# While PostgreSQL was down, the lease session tried to connect at least every second
# (a tenth of the lease): the default backoff, doubling to 10 s, could reconnect it after
# the leases ran out. From the stop on, the longest gap between two of its attempts (the
# last one connected); the default backoff's sixth wait, 1.6 to 3.2 s, starts within the
# 3.5 s outage.
gap=$(tail -n "+$((log_lines + 1))" "$T/a.log" | awk '
	function ms(ts, h) { split(substr(ts, 12, 12), h, ":"); return ((h[1] * 60 + h[2]) * 60 + h[3]) * 1000 }
	/app="pgjobd lease"/ && (/from=wait to=connect/ || /msg="database connected"/) {
		t = ms($1); if (prev != "" && t - prev > max) max = t - prev; prev = t
		if (/msg="database connected"/ && seen) exit
		if (/from=wait to=connect/) seen = 1 }
	END { print max + 0 }')
cmp_ok "$gap" -le 1500 "the lease session tried to connect at least every 1.5 s while the server was down (longest gap ${gap} ms)"
alive
ok $? "... and the commands still run"

wait_until 40 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 4 ]"
ok $? "all four jobs succeeded"
is "$(psql_q "SELECT string_agg(attempts::text, ' ' ORDER BY id) FROM pgjobd.jobs")" "1 1 1 1" \
	"each in one attempt"
is "$(awk '$1 == "start"' "$T/marks.log" | wc -l | tr -d ' ')" 4 "each command started once"
problems=$(check_markers "$T/marks.log")
is "$problems" "" "no overlap, group order kept"
if grep -q "lost_lock\|lease lost\|outcome not recorded\|giving up" "$T/a.log"; then
	fail "no lease was lost and every outcome was recorded"
else
	pass "no lease was lost and every outcome was recorded"
fi

after=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('r') RETURNING id")
wait_until 20 "[ \"\$(job_field $after status)\" = succeeded ]"
ok $? "a job enqueued after the restarts runs"
stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
