#!/usr/bin/env bash
# A network partition (guarantees 1, 5 and 7): daemon a reaches PostgreSQL through a TCP
# relay that the test stops (connections stay open, nothing flows), daemon b directly.
#  A. Partition, and the server ends a's sessions meanwhile: a (which runs on) kills its
#     command at its fence deadline, b starts the job only after that, a's outcome is
#     never recorded, and the job succeeds once.
#  B. Partition alone (a's sessions and locks stay): a's command still dies at the
#     deadline; the job is not lost and runs again after the partition heals.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start_relayed

make_mark_script "$T/mark.sh" "$T/marks.log"
write_p_conf() {
	write_conf "$1" <<EOF
$(conf_header fence_timeout=2s "database=$2")

[queue.p]
command = exec '$T/mark.sh'
concurrency = 1
max_attempts = 5
backoff = 100ms
backoff_max = 100ms
kill_grace = 1s
EOF
}
write_p_conf "$T/a.ini" "host=127.0.0.1 port=$RELAY_PORT dbname=$PGDATABASE user=postgres"
write_p_conf "$T/b.ini" "$DB_CONNINFO"
pgjobd_migrate "$T/b.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"


start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

# ---- A: partition, and the server ends a's sessions
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('p', 'g1', '{\"sleep\": 10}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on a"
p1=$(mark_pid "$T/marks.log" "$id" 1)
t_b=$(psql_q "SELECT now()")
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
kill -STOP "$RELAY"
cut_at=$(now_ms)
psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
        WHERE application_name LIKE 'pgjobd%' AND backend_start < '$t_b'" >/dev/null
wait_until 10 "! pid_alive $p1" || fail "A: a's command died during the partition"
killed=$(($(now_ms) - cut_at))
note "A: a's command was killed ${killed} ms after the partition began"
cmp_ok "$killed" -le 4000 "A: within the fence deadline (2 s) plus slack"
wait_until 20 "mark_started $T/marks.log $id 2" || fail "A: b ran the job"
problems=$(check_markers --lenient "$T/marks.log")
is "$problems" "" "A: never two commands of the group at once"
ok "$(pid_alive "$A" && echo 0 || echo 1)" "A: daemon a is alive (it was never stopped)"
kill -CONT "$RELAY"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "A: the job succeeded"
is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 2" "A: succeeded once, at attempt 2"
# a's outcome of attempt 1 (its command killed at the deadline: lost_lock, a retry) is
# written once the partition heals, with a's fencing token, after b took the job over:
# the database must refuse it. Attempt 1's history entry is then the takeover's, which
# knows no run time, not a's (which carries its command's duration_ms and cpu_ms).
wait_until 20 "grep -qE 'msg=\"(outcome already recorded, or the claim was taken over|outcome not recorded: the claim is no longer this slot.s)\" .*job=$id queue=p attempt=1' '$T/a.log'"
ok $? "A: daemon a wrote its outcome of attempt 1 once the partition healed, and was refused"
is "$(job_field "$id" "jsonb_array_length(history) || ' ' || (history->0->>'attempt') || ' ' ||
	coalesce(history->0->>'duration_ms', 'none') || ' ' || (coalesce(history->1->>'duration_ms', '') ~ '^[0-9]+$')")" \
	"2 1 none true" "A: a's outcome of attempt 1 was never recorded (its history entry is b's takeover)"
wait_until 20 "workers_alive 2" || fail "A: daemon a registered again after the partition"

# ---- B: partition alone; a's sessions (and locks) stay
stop_daemon "$B" >/dev/null
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('p', 'g2', '{\"sleep\": 30}') RETURNING id")
wait_until 20 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on a"
p1=$(mark_pid "$T/marks.log" "$id" 1)
kill -STOP "$RELAY"
cut_at=$(now_ms)
wait_until 10 "! pid_alive $p1" || fail "B: a's command died during the partition"
killed=$(($(now_ms) - cut_at))
note "B: a's command was killed ${killed} ms after the partition began"
cmp_ok "$killed" -le 4000 "B: within the fence deadline (2 s) plus slack"
kill -CONT "$RELAY"
wait_until 30 "mark_started $T/marks.log $id 2" || fail "B: the job ran again after the partition healed"
psql_q "SELECT pgjobd.cancel($id)" >/dev/null
wait_until 20 "[ \"\$(job_field $id status)\" = cancelled ]" || fail "B: cancelled"
problems=$(check_markers --lenient "$T/marks.log")
is "$problems" "" "B: never two commands of a group at once"

stop_daemon "$A"
is "$?" 0 "daemon a exits 0"
done_testing
