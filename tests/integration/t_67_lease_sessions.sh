#!/usr/bin/env bash
# Lock mode lease, sessions (SPEC "Lock modes": a daemon uses a few sessions whatever its
# concurrency): 256 lease-mode slots all busy, and the daemon has three sessions in
# pg_stat_activity (listener, fence, lease; maintenance takes turns on the lease session),
# where lock mode transaction would need 256 + 3 (more than max_connections here). Every
# job ends once. `pgjobd status` lists the jobs running under leases with their
# deadlines, soonest first.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

write_conf "$T/a.ini" <<EOF
$(conf_header log_level=info)

[queue.wide]
command = exec flock -s '$T/gate' true
concurrency = 256
lock_mode = lease
lease = 20s
max_attempts = 1
EOF
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
is "$(psql_q "SHOW max_connections")" 200 "max_connections is 200: fewer than the slots"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

# Every command waits (as a process named flock, the daemon's child) until the test lets
# go of its lock on the gate: they run for as long as the checks take, however slow the
# machine is.
exec 8>"$T/gate"
flock 8
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'wide', '{}' FROM generate_series(1, 256)" >/dev/null
t0=$(now_ms)
wait_until 30 "[ \"\$(count_jobs \"status = 'running'\")\" = 256 ]"
ok $? "all 256 jobs run at once ($(($(now_ms) - t0)) ms to claim and start them)"
wait_until 30 "[ \"\$(pgrep -c -P $A -x flock)\" = 256 ]"
ok $? "256 commands run"
max=0
for i in 1 2 3 4 5 6 7 8 9 10; do
	n=$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'")
	[ "$n" -gt "$max" ] && max=$n
	sleep 0.3
done
is "$max" 3 "the daemon uses 3 sessions with 256 slots busy"
is "$(psql_q "SELECT string_agg(application_name, ',' ORDER BY application_name)
              FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'")" \
	"pgjobd fence,pgjobd lease,pgjobd listener" "listener, fence and lease"

out=$("$PGJOBD" status -c "$T/a.ini" 2>&1)
note "pgjobd status:" "$out"
like "$out" $'\nrunning under a lease: 256 ' "status: 256 jobs running under a lease"
row=$'\n +[0-9]+ +wide +[^ ]+:'"$A"$':wide\\.[0-9]+ +1 +[0-9]{4}-[0-9-]+ [0-9:.+]+ +[0-9.]+s\n'
like "$out" $'\n +JOB +QUEUE +WORKER +ATTEMPT +LEASE_UNTIL +LEFT'"$row" \
	"status: each with its worker, attempt, lease_until and the time left"
like "$out" $'\n  ... and 246 more$' "status: the soonest 10, then a count"
js=$("$PGJOBD" status --json-object -c "$T/a.ini" 2>/dev/null)
is "$(psql_q "WITH j(v) AS (SELECT $(sql_lit "$js")::jsonb)
              SELECT concat_ws(' ', v->'leases'->>'running', jsonb_array_length(v->'leases'->'soonest'),
                     (v->'leases'->'soonest'->0->>'lease_left')::numeric > 0) FROM j")" \
	"256 10 t" "status --json-object: leases.running, the soonest 10 with the time left"

exec 8>&-
wait_until 60 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 256 ]"
ok $? "all 256 jobs succeeded"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE attempts <> 1")" 0 "each in one attempt"
if grep -q "lost_lock\|lease lost\|outcome not recorded" "$T/a.log"; then
	fail "no lease was lost"
else
	pass "no lease was lost"
fi
out=$("$PGJOBD" status -c "$T/a.ini" 2>&1)
unlike "$out" "running under a lease" "status: no lease section once they have ended"
stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
