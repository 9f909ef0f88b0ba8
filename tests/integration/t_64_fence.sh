#!/usr/bin/env bash
# Fencing (guarantees 1, 3, 6 and 7): a claim is bounded in time on both sides.
#  A. A daemon paused by SIGSTOP whose sessions the server ends: its supervisor kills the
#     command at the fence deadline, and no other daemon starts the job before that.
#  B. A daemon paused by SIGSTOP whose sessions stay: the command still dies at the
#     deadline; the job is not lost and runs again once.
#  C. kill -9 of the daemon's whole process group: the supervisor is not in it, kills the
#     command, and the job is taken over at once, without overlap.
#  D. A claim committed for a slot that lost its session before holding it: the job runs,
#     and the attempt that never started is not counted (max_attempts = 1).
#  E. PGJOBD_FENCE increases with every claim of a group.
#  F. The session is lost while the outcome is being written: the outcome is written again
#     from the next session; the command does not run again.
#  G. Heartbeats held up (a lock on the daemon's workers row) past half of fence_timeout,
#     not past all of it: a job enqueued meanwhile waits, and starts as soon as a heartbeat
#     gets through again, not at the next poll.
. "$(dirname "$0")/lib.sh"
require_pgjobd
shared_cluster # the sessions it ends are its own database's
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
# Each start also records the fencing token: "fence G ID ATTEMPT TOKEN".
cat >"$T/job.sh" <<EOF
#!/bin/bash
echo "fence \${PGJOBD_GROUP_ID:--} \$PGJOBD_JOB_ID \$PGJOBD_ATTEMPT \$PGJOBD_FENCE" >>'$T/fences.log'
exec '$T/mark.sh'
EOF
chmod +x "$T/job.sh"

write_f_conf() {
	write_conf "$1" <<EOF
$(conf_header fence_timeout=2s)

[queue.f]
command = exec '$T/job.sh'
concurrency = 1
max_attempts = 5
backoff = 100ms
backoff_max = 100ms
kill_grace = 1s
EOF
}
for n in a b c d; do write_f_conf "$T/$n.ini"; done
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# the pgjobd sessions that started before the time $1 (an SQL timestamptz literal)
terminate_before() {
	psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	        WHERE datname = current_database() AND application_name LIKE 'pgjobd%' AND backend_start < '$1'"
}

# ---- A: paused daemon, sessions ended by the server
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || fail "daemon a registered"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('f', 'ga', '{\"sleep\": 6}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on a"
p1=$(mark_pid "$T/marks.log" "$id" 1)
t_b=$(psql_q "SELECT now()")
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
kill -STOP "$A"
stopped_at=$(now_ms)
n=$(terminate_before "$t_b")
note "terminated $n sessions of daemon a"
wait_until 20 "mark_started $T/marks.log $id 2" || fail "A: the job ran again on b"
took=$(($(now_ms) - stopped_at))
note "A: attempt 2 started ${took} ms after SIGSTOP of a"
ok "$(pid_alive "$p1" && echo 1 || echo 0)" "A: a's command (pid $p1) was dead when b started the job"
cmp_ok "$took" -ge 2000 "A: no takeover before the fence deadline (2 s)"
kill -CONT "$A"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "A: the job succeeded"
is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 2" "A: succeeded at attempt 2"
problems=$(check_markers --lenient "$T/marks.log")
is "$problems" "" "A: no overlap, order kept"
sleep 1
is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 2" \
	"A: daemon a's late outcome changed nothing"
ok "$(pid_alive "$A" && echo 0 || echo 1)" "A: daemon a survived and goes on"

# ---- B: paused daemon whose sessions stay: its supervisor kills the command anyway
stop_daemon "$B" >/dev/null
wait_until 10 "! pid_alive $B"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('f', 'gb', '{\"sleep\": 30}') RETURNING id")
wait_until 15 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on a"
p1=$(mark_pid "$T/marks.log" "$id" 1)
kill -STOP "$A"
stopped_at=$(now_ms)
wait_until 10 "! pid_alive $p1" || fail "B: the command died while daemon a was stopped"
took=$(($(now_ms) - stopped_at))
note "B: command killed ${took} ms after SIGSTOP"
cmp_ok "$took" -le 4000 "B: killed within the fence deadline (2 s) plus scheduling slack"
ok "$(pid_alive "$A" && echo 0 || echo 1)" "B: daemon a is still there (stopped)"
kill -CONT "$A"
wait_until 20 "mark_started $T/marks.log $id 2" || fail "B: the job ran again"
is "$(job_field "$id" "status")" "running" "B: attempt 2 runs"
is "$(job_field "$id" "history->0->>'reason'")" lost_lock \
	"B: attempt 1 ended lost_lock (the supervisor killed it at the fence deadline), not as a death by a signal"
psql_q "SELECT pgjobd.cancel($id)" >/dev/null
wait_until 15 "[ \"\$(job_field $id status)\" = cancelled ]" || fail "B: cancelled"

# ---- C: kill -9 of the daemon's whole process group
stop_daemon "$A" >/dev/null
# Started from a subshell, so that this shell has no job to report "Killed" about.
(setsid "$PGJOBD" -c "$T/c.ini" >>"$T/c.log" 2>&1 </dev/null & echo $! >"$T/c.pid")
C=$(cat "$T/c.pid")
DAEMON_PIDS+=("$C")
wait_until 10 "workers_alive 1" || fail "daemon c registered"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('f', 'gc', '{\"sleep\": 30}') RETURNING id")
wait_until 15 "mark_started $T/marks.log $id 1" || bail_out "job $id did not start on c"
p1=$(mark_pid "$T/marks.log" "$id" 1)
start_daemon d "$T/d.ini"
D=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon d registered"
pgid=$(ps -o pgid= -p "$C" | tr -d ' ')
is "$pgid" "$C" "C: daemon c leads its own process group"
kill -9 -- "-$pgid"
killed_at=$(now_ms)
wait_until 10 "! pid_alive $p1" || fail "C: the command died with its daemon's group"
wait_until 15 "mark_started $T/marks.log $id 2" || fail "C: the job ran again on d"
took=$(($(now_ms) - killed_at))
note "C: attempt 2 started ${took} ms after kill -9 of the group"
problems=$(check_markers --lenient "$T/marks.log")
is "$problems" "" "C: no overlap"
cmp_ok "$took" -le 2500 "C: taken over at once (the supervisor released the claims), not after the deadline"
psql_q "SELECT pgjobd.cancel($id)" >/dev/null
wait_until 15 "[ \"\$(job_field $id status)\" = cancelled ]" || fail "C: cancelled"

# ---- D: a claim whose slot lost its session before holding it
psql -X -qAt -c "BEGIN; LOCK pgjobd.waiting IN SHARE MODE; SELECT pg_sleep(4); COMMIT" \
	>/dev/null 2>&1 &
locker=$!
sleep 0.5
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, max_attempts) VALUES ('f', 1) RETURNING id")
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgjobd claimer ' || left(encode(sha256('f'::bytea), 'hex'), 16) AND wait_event_type = 'Lock'\")\" -ge 1 ]" ||
	fail "D: the claim waits for the lock"
n=$(psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgjobd slot ' || left(encode(sha256('f'::bytea), 'hex'), 16) || '.0'")
is "$n" 1 "D: the slot's session was ended while the claim was in flight"
wait "$locker"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "D: the job ran"
is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 1" \
	"D: the attempt that never started was not counted"

# ---- F: the session is lost while the outcome is written: the outcome is written again
# from the next session, the command does not run again, and the attempt counts once.
psql_q "CREATE FUNCTION pgjobd.t64_slow_finish() RETURNS trigger LANGUAGE plpgsql AS \$\$
        BEGIN
            IF NEW.status = 'succeeded' AND OLD.status = 'running' AND NEW.data ? 't64_slow' THEN
                PERFORM pg_sleep(3);
            END IF;
            RETURN NEW;
        END \$\$;
        CREATE TRIGGER t64_slow_finish BEFORE UPDATE ON pgjobd.jobs
            FOR EACH ROW EXECUTE FUNCTION pgjobd.t64_slow_finish()" >/dev/null
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('f', 'gf', '{\"t64_slow\": 1}') RETURNING id")
wait_until 15 "grep -q '^end gf $id 1 ' '$T/marks.log'" || fail "F: the command ran"
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgjobd slot ' || left(encode(sha256('f'::bytea), 'hex'), 16) || '.0' AND query LIKE 'UPDATE pgjobd.jobs SET status%' AND state = 'active'\")\" = 1 ]" ||
	fail "F: the outcome UPDATE is under way"
n=$(psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgjobd slot ' || left(encode(sha256('f'::bytea), 'hex'), 16) || '.0'")
is "$n" 1 "F: the slot's session was ended while it wrote the outcome"
psql_q "DROP TRIGGER t64_slow_finish ON pgjobd.jobs" >/dev/null
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "F: the job succeeded"
sleep 1
is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 1" "F: one attempt, counted once"
is "$(grep -c "^start gf $id " "$T/marks.log")" 1 "F: the command ran once"

# ---- G: slow heartbeats: claiming pauses, and resumes when they catch up
write_conf "$T/g.ini" <<EOF
$(conf_header fence_timeout=6s poll_interval=60s)

[queue.g]
command = echo ok
EOF
start_daemon g "$T/g.ini"
G=$DAEMON_PID
gid() { psql_q "SELECT id FROM pgjobd.workers WHERE name LIKE '%:$G' AND alive_until > now()"; }
wait_until 20 '[ -n "$(gid)" ]' || bail_out "daemon g did not register"
wait_until 10 "queues_waiting g" || bail_out "daemon g's claimer did not register as waiting"
wid=$(gid)
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('g') RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "G: a first job runs"
# The last heartbeat confirmed was sent before the lock: after 3 s of it, less than half
# of the 6 s is left; the lock ends at 3.6 s, well before the deadline (at least 4.5 s).
psql_q "BEGIN; SELECT 1 FROM pgjobd.workers WHERE id = $wid FOR UPDATE; SELECT pg_sleep(3.6); COMMIT" \
	>/dev/null 2>&1 &
locker=$!
sleep 3
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('g') RETURNING id")
t0=$(now_ms)
wait "$locker"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "G: the job enqueued while heartbeats were held up runs"
took=$(($(now_ms) - t0))
cmp_ok "$took" -lt 15000 "G: ... once a heartbeat got through, not at the 60 s poll (${took} ms)"
if grep -q 'cannot confirm this daemon' "$T/g.log"; then
	note "G: the deadline passed too (a loaded machine): the test took the expiry path"
fi
stop_daemon "$G"
is "$?" 0 "daemon g exits 0"

# ---- E: fencing tokens
prev=0 bad=0
while read -r _ g jid att tok; do
	[ "$tok" -gt 0 ] 2>/dev/null || bad=1
done <"$T/fences.log"
ok $bad "E: every command got a positive PGJOBD_FENCE"
for g in ga gb gc gf; do
	seq=$(awk -v g=$g '$2 == g { print $5 }' "$T/fences.log" | tr '\n' ' ')
	sorted=$(awk -v g=$g '$2 == g { print $5 }' "$T/fences.log" | sort -n | uniq | tr '\n' ' ')
	is "$seq" "$sorted" "E: group $g: tokens strictly increase ($seq)"
done
ok "$(pid_alive "$D" && echo 0 || echo 1)" "daemon d still runs"
stop_daemon "$D"
is "$?" 0 "daemon d exits 0"
done_testing
