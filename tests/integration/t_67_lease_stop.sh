#!/usr/bin/env bash
# Lock mode lease, a daemon that stops (guarantees 1, 3, 6 and 7 in lease mode):
#  A. Daemon a is stopped (SIGSTOP) for longer than the lease (2 s) while it runs a job;
#     daemon b runs. a's supervisor kills the command at the lease's deadline, b takes the
#     job over only after that (the group's flock never clashes), and when a continues,
#     its late outcome is rejected and logged; the job ends once, at attempt 2.
#  B. A daemon that is dead for good (daemon and supervisor stopped, command gone):
#     SELECT pgjobd.release_worker('host:pid') makes its job claimable at once, not after
#     its lease (60 s).
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
for n in a b c; do
	write_conf "$T/$n.ini" <<EOF
$(conf_header fence_timeout=2s)

[queue.s]
command = exec '$T/mark.sh'
lock_mode = lease
lease = 2s
max_attempts = 5
backoff = 100ms
backoff_max = 100ms
kill_grace = 1s

[queue.long]
command = exec '$T/mark.sh'
lock_mode = lease
lease = 60s
max_attempts = 5
kill_grace = 1s
EOF
done
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# ---- A: stopped longer than the lease
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('s', 'g', '{\"sleep\": 8}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on a"
p1=$(mark_pid "$T/marks.log" "$id" 1)
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
kill -STOP "$A"
stopped_at=$(now_ms)
wait_until 10 "! pid_alive $p1" || fail "A: a's command died while a was stopped"
killed=$(($(now_ms) - stopped_at))
note "A: a's command was killed ${killed} ms after SIGSTOP"
cmp_ok "$killed" -le 4000 "A: at its lease's deadline (2 s) plus scheduling slack"
wait_until 20 "mark_started $T/marks.log $id 2" || fail "A: b took the job over"
took=$(($(now_ms) - stopped_at))
note "A: attempt 2 started on b ${took} ms after SIGSTOP of a"
cmp_ok "$took" -ge 2000 "A: not before the lease (2 s) could have run out"
ok "$(pid_alive "$p1" && echo 1 || echo 0)" "A: a's command was dead when b started the job"
sleep 1
kill -CONT "$A"
wait_until 20 "grep -q 'outcome not recorded: the claim was taken over.*job=$id ' '$T/a.log'"
ok $? "A: a's late outcome was rejected, and logged"
like "$(grep "msg=\"job finished\".*job=$id queue=s attempt=1" "$T/a.log")" "reason=lost_lock" \
	"A: a's outcome says lost_lock"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "A: the job succeeded on b"
is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 2" "A: succeeded once, at attempt 2"
is "$(job_field "$id" "worker")" "$(psql_q "SELECT name FROM pgjobd.workers WHERE name LIKE '%:$B'" | head -1):s.0" \
	"A: the outcome is b's"
problems=$(check_markers --lenient "$T/marks.log")
is "$problems" "" "A: never two commands of the group at once"
ok "$(pid_alive "$A" && echo 0 || echo 1)" "A: daemon a survived and goes on"
after=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('s', 'g') RETURNING id")
wait_until 20 "[ \"\$(job_field $after status)\" = succeeded ]"
ok $? "A: the group's next job runs"
stop_daemon "$A" >/dev/null
stop_daemon "$B" >/dev/null

# ---- B: release_worker
start_daemon c "$T/c.ini"
C=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon c did not register"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('long', 'h', '{\"sleep\": 60}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on c"
p1=$(mark_pid "$T/marks.log" "$id" 1)
guard=""
for p in $(pgrep -P "$C"); do
	[ "$(readlink /proc/"$p"/exe)" = "$(readlink /proc/"$C"/exe)" ] && guard=$p
done
isnt "$guard" "" "B: daemon c's supervisor found (pid $guard)"
echo "$guard" >"$T/guard.pid"
# A dead host: daemon and supervisor stopped for good, the command gone (the group's
# flock with it).
kill -STOP "$C" "$guard"
kill -KILL -- "-$p1"
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
sleep 1
is "$(job_field "$id" "status || ' ' || attempts")" "running 1" "B: before the release, the job stays c's"
name=$(psql_q "SELECT name FROM pgjobd.workers WHERE name LIKE '%:$C'" | head -1)
released_at=$(now_ms)
is "$(psql_q "SELECT pgjobd.release_worker('$name')")" 1 "B: release_worker('$name') released one instance"
wait_until 10 "mark_started $T/marks.log $id 2" || fail "B: b took the job over"
took=$(($(now_ms) - released_at))
note "B: attempt 2 started ${took} ms after release_worker"
cmp_ok "$took" -le 3000 "B: at once, not after the lease (60 s)"
kill -KILL "$C" "$guard"
forget_daemon "$C"
psql_q "SELECT pgjobd.cancel($id)" >/dev/null
wait_until 20 "[ \"\$(job_field $id status)\" = cancelled ]" || fail "B: cancelled"
stop_daemon "$B"
is $? 0 "daemon b exits 0"
done_testing
