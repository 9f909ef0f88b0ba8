#!/usr/bin/env bash
# Lock mode lease, a long job (SPEC "Lock modes"): a job of 20 s under a lease of 2 s keeps
# its lease (extended about every 0.7 s), is never taken over by a second daemon, runs
# once with attempts = 1; no session of either daemon holds a transaction or a snapshot
# between statements while it runs (pg_stat_activity, sampled), so VACUUM removes the
# dead rows of another table meanwhile. Control: a job of lock mode transaction does hold
# them back, as pgjobd(8) says.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
for n in a b; do
	write_conf "$T/$n.ini" <<EOF
$(conf_header fence_timeout=2s)

[queue.long]
command = exec '$T/mark.sh'
concurrency = 2
lock_mode = lease
lease = 2s
max_attempts = 1
kill_grace = 1s

[queue.tx]
command = exec '$T/mark.sh'
EOF
done
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('long', 'g', '{\"sleep\": 20}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start"
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
fence=$(job_field "$id" fence)
is "$(job_field "$id" "status || ' ' || attempts || ' ' || lease_ms || ' ' || (lease_until > now())")" \
	"running 1 2000 true" "the job runs under a lease of 2 s"

psql_q "CREATE TABLE t67 (a int) WITH (autovacuum_enabled = off)" >/dev/null

# Sample every daemon session about 5 times a second for 12 s: one that is not running a
# statement must have no transaction and no snapshot (backend_xmin NULL). Meanwhile the
# lease must move: record lease_until each time.
samples=0 bad=0 leases=""
end=$(($(now_ms) + 12000))
while [ "$(now_ms)" -lt "$end" ]; do
	row=$(psql_q "SELECT count(*),
	                     count(*) FILTER (WHERE state <> 'active'
	                                      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL
	                                           OR xact_start IS NOT NULL)),
	                     (SELECT lease_until FROM pgjobd.jobs WHERE id = $id)
	              FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'")
	IFS='|' read -r n b lu <<<"$row"
	samples=$((samples + n))
	if [ "$b" != 0 ]; then
		bad=$((bad + b))
		diag "$(psql_q "SELECT application_name, state, backend_xmin, backend_xid, xact_start
		                FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'")"
	fi
	leases="$leases$lu"$'\n'
	sleep 0.2
done
note "sampled $samples daemon sessions"
cmp_ok "$samples" -ge 100 "the daemons' sessions were sampled ($samples)"
is "$bad" 0 "no daemon session held a transaction or a snapshot between statements"
nlease=$(sort -u <<<"$leases" | grep -c .)
cmp_ok "$nlease" -ge 10 "the lease was extended while the job ran ($nlease values in 12 s)"

# Dead rows of another table, made while the job runs, are removable.
psql_q "INSERT INTO t67 SELECT generate_series(1, 1000); DELETE FROM t67" >/dev/null
vac=$(psql -X -qAt -c "VACUUM (VERBOSE) t67" 2>&1)
kept=$(sed -n 's/.* \([0-9][0-9]*\) are dead but not yet removable.*/\1/p' <<<"$vac" | head -1)
removed=$(sed -n 's/.*tuples: \([0-9][0-9]*\) removed.*/\1/p' <<<"$vac" | head -1)
is "$kept $removed" "0 1000" "VACUUM removed all 1000 dead rows of another table while the job ran" ||
	diag "$vac"

wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "the job succeeded"
is "$(job_field "$id" "status || ' ' || attempts || ' ' || (fence = $fence) || ' ' || (lease_until IS NULL)")" \
	"succeeded 1 true true" "succeeded in one attempt under its first claim (same fencing token)"
is "$(grep -c "^start g $id " "$T/marks.log")" 1 "its command ran once"
if grep -q "job=$id .*lost_lock\|lease lost\|outcome not recorded" "$T/a.log" "$T/b.log"; then
	fail "no lease was lost"
else
	pass "no lease was lost"
fi
is "$(grep -c "msg=\"job started\".*job=$id " "$T/b.log")" 0 "daemon b never started it"

# Control: a job of lock mode transaction holds back the same VACUUM.
id2=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('tx', '{\"sleep\": 4}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id2 1" || fail "the transaction-mode job started"
sleep 0.5
psql_q "INSERT INTO t67 SELECT generate_series(1, 1000); DELETE FROM t67" >/dev/null
vac=$(psql -X -qAt -c "VACUUM (VERBOSE) t67" 2>&1)
kept=$(sed -n 's/.* \([0-9][0-9]*\) are dead but not yet removable.*/\1/p' <<<"$vac" | head -1)
cmp_ok "${kept:-0}" -gt 0 "control: with a transaction-mode job running, VACUUM keeps dead rows ($kept)"
wait_until 20 "[ \"\$(job_field $id2 status)\" = succeeded ]" || fail "the control job succeeded"

stop_daemon "$B"
is $? 0 "daemon b exits 0"
stop_daemon "$A"
is $? 0 "daemon a exits 0"
done_testing
