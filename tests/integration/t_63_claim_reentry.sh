#!/usr/bin/env bash
# A slot lost while a claim for it is in flight. The claimer claims for the
# queue's idle slots in one call; when the answer comes, each claimed job goes
# to the slot it was claimed for. Here the first of the two reserved slots has
# lost its session (pg_terminate_backend) before the answer comes, and the
# running jobs of the other slots have finished meanwhile, so those slots are
# idle and want a claim of their own. The daemon must not crash, must give
# the second job to the second slot (not to a slot of a later claim), must
# leave the lost slot's job to the orphan pass (it then runs once, on another
# attempt), and must leave no slot reserved for a claim that is over.
# Then the same while the daemon drains (SIGTERM): the lost slot stops and is
# freed before the answer comes, which must not reach it.
#
# How the claim is kept in flight: a session holds a LOCK on
# pgjobd.paused_queues, which claim_batch reads before anything else, so the
# poll's next claim (for both idle slots) waits there until the test lets it
# go, and then finds the jobs inserted meanwhile (with a run_at before the
# claim's statement_timestamp(), against which readiness is judged).
# pgjobd.waiting would not do: claim_batch writes it at its start when the
# call carries the orphan pass and at its end otherwise, so the claim could
# stop after it had looked at the queue and found nothing.
. "$(dirname "$0")/lib.sh"
require_pgjobd

shared_cluster # the sessions and locks it looks at are its own database's
pg_start
# start ID ATTEMPT PID / end ID ATTEMPT PID in $T/runs.log; data key `gate`:
# wait for the file $T/gate.<gate> before ending.
cat >"$T/job.sh" <<EOF
#!/bin/bash
log='$T/runs.log'
id=\$PGJOBD_JOB_ID att=\$PGJOBD_ATTEMPT
echo "start \$id \$att \$\$" >>"\$log"
if [ -n "\${PGJOBD_ARG_gate:-}" ]; then
	for _ in \$(seq 2400); do
		[ -e '$T'/gate."\$PGJOBD_ARG_gate" ] && break
		sleep 0.05
	done
fi
echo "end \$id \$att \$\$" >>"\$log"
echo '{"ok": true}'
EOF
: >"$T/runs.log"

write_conf "$T/d.ini" <<EOF
$(conf_header)

[queue.q]
command = /bin/bash '$T/job.sh'
concurrency = 4
max_attempts = 3
EOF
pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$T/d.ini"
d=$DAEMON_PID

slot_sessions() {
	psql_q "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgjobd slot %'"
}
claimer_waits() {
	[ "$(psql_q "SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'pgjobd claimer %' AND wait_event_type = 'Lock'")" = 1 ]
}
started() { grep -c "^start $1 " "$T/runs.log"; }
# succeeded ID...: all of them
succeeded() {
	local ids
	ids=$(echo "$@" | tr ' ' ,)
	[ "$(count_jobs "id IN ($ids) AND status = 'succeeded'")" = $# ]
}
# all_started ID...: each has started
all_started() {
	local i
	for i in "$@"; do [ "$(started "$i")" -ge 1 ] || return 1; done
}
# lock NAME TABLE MODE: a psql session (application_name t63-NAME) that holds
# the lock until unlock NAME terminates it.
lock() {
	PGAPPNAME=t63-$1 psql -X -qAt -c "BEGIN; LOCK TABLE $2 IN $3 MODE; SELECT pg_sleep(600)" \
		>"$T/lock-$1.out" 2>&1 &
	echo $! >>"$T/locks.pids"
	wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE a.datname = current_database() AND a.application_name = 't63-$1' AND l.relation = '$2'::regclass AND l.granted\")\" = 1 ]"
}
unlock() {
	psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 't63-$1'" >/dev/null
}
# session_back NAME OLDPID: a session named NAME other than OLDPID exists
session_back() {
	[ "$(psql_q "SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = '$1' AND pid <> $2")" = 1 ]
}

wait_until 20 "[ \"\$(slot_sessions)\" = 4 ]"
ok $? "the four slots are connected"

# Two slots run jobs that wait for gate.ab; two stay idle.
a=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('q', '{\"gate\": \"ab\"}') RETURNING id")
b=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('q', '{\"gate\": \"ab\"}') RETURNING id")
wait_until 20 "all_started $a $b"
ok $? "two jobs run"

# The next claim (the poll's, for the two idle slots) stops before it looks
# at the queue; the jobs it is to find are inserted meanwhile.
lock claim pgjobd.paused_queues "ACCESS EXCLUSIVE"
ok $? "a session locks pgjobd.paused_queues"
wait_until 20 claimer_waits
ok $? "a claim is in flight"
ids=$(psql_q "INSERT INTO pgjobd.jobs (queue, run_at)
	SELECT 'q', now() - interval '1 hour' FROM generate_series(1, 8) RETURNING id" | tr '\n' ' ')

# Its first slot loses its session (and connects again).
reserved=$(psql_q "SELECT application_name FROM pg_stat_activity
	WHERE datname = current_database() AND application_name LIKE 'pgjobd slot %' AND state = 'idle'
	ORDER BY substring(application_name FROM '[0-9]+$')::int")
is "$(echo "$reserved" | wc -l)" 2 "two slots are reserved for it: $(echo $reserved)"
first=$(echo "$reserved" | head -n 1)
old=$(psql_q "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = '$first'")
is "$(psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	WHERE datname = current_database() AND application_name = '$first'")" 1 "the session of '$first' is terminated"
wait_until 20 "session_back '$first' $old"
ok $? "'$first' reconnects"

# The running jobs end: their slots are idle and want a claim too.
touch "$T/gate.ab"
wait_until 20 "succeeded $a $b"
ok $? "the two running jobs succeed while the claim is in flight"

unlock claim
wait_until 30 "succeeded $a $b $ids || ! pid_alive $d"
pid_alive "$d"
ok $? "the daemon is still running"
succeeded $a $b $ids
ok $? "all ten jobs succeed"

# Every slot takes jobs again: four jobs run at once.
last=$(psql_q "INSERT INTO pgjobd.jobs (queue, data)
	SELECT 'q', '{\"gate\": \"last\"}' FROM generate_series(1, 4) RETURNING id" | tr '\n' ' ')
wait_until 20 "all_started $last || ! pid_alive $d"
all_started $last
ok $? "all four slots take a job afterwards (none is left reserved)"
touch "$T/gate.last"
wait_until 20 "succeeded $a $b $ids $last || ! pid_alive $d"
succeeded $a $b $ids $last
ok $? "those succeed too"

# Each job's command ran once. The lost slot's job was taken over by the
# orphan pass, which counts an attempt; no other job needed a second one.
all=$(echo $a $b $ids $last | tr ' ' ,)
twice=$(awk '$1 == "start" { n[$2]++ } END { for (i in n) if (n[i] != 1) print i " x" n[i] }' "$T/runs.log")
is "$twice" "" "no command ran twice"
is "$(grep -c '^start ' "$T/runs.log")" 14 "fourteen commands ran"
cmp_ok "$(count_jobs "id IN ($all) AND attempts > 1")" -le 1 "at most the lost slot's job took a second attempt"
is "$(grep -c 'taken over before it started' "$T/d.log")" 0 "no slot was handed a job claimed for another slot"
is "$(grep -c -E 'AddressSanitizer|LeakSanitizer|runtime error' "$T/d.log")" 0 "no sanitizer report"
stop_daemon "$d"
is $? 0 "SIGTERM: exit status 0"

# While draining: a slot that loses its session stops at once, and is freed
# while the claim for it is still in flight.
start_daemon e "$T/d.ini"
e=$DAEMON_PID
wait_until 20 "[ \"\$(slot_sessions)\" = 4 ]"
ok $? "a new daemon: the four slots are connected"
a=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('q', '{\"gate\": \"ab2\"}') RETURNING id")
b=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('q', '{\"gate\": \"ab2\"}') RETURNING id")
wait_until 20 "all_started $a $b"
ok $? "two jobs run"
lock claim pgjobd.paused_queues "ACCESS EXCLUSIVE"
wait_until 20 claimer_waits
ok $? "a claim is in flight"
ids=$(psql_q "INSERT INTO pgjobd.jobs (queue, run_at)
	SELECT 'q', now() - interval '1 hour' FROM generate_series(1, 2) RETURNING id" | tr '\n' ' ')
first=$(psql_q "SELECT application_name FROM pg_stat_activity
	WHERE datname = current_database() AND application_name LIKE 'pgjobd slot %' AND state = 'idle'
	ORDER BY substring(application_name FROM '[0-9]+$')::int LIMIT 1")
kill -TERM "$e"
wait_until 20 "grep -q 'msg=\"shutting down\"' '$T/e.log'"
ok $? "the daemon drains"
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND application_name = '$first'" >/dev/null
n=${first##*.}
wait_until 20 "grep -q 'msg=\"slot state\" queue=q slot=$n from=connecting to=stopped' '$T/e.log'"
ok $? "'$first' loses its session and stops"
unlock claim
touch "$T/gate.ab2"
wait_daemon_exit "$e" 30
is "$DAEMON_STATUS" 0 "the daemon ends its jobs and exits 0"
is "$(grep -c -E 'AddressSanitizer|LeakSanitizer|runtime error' "$T/e.log")" 0 "no sanitizer report"
# The job claimed for the stopped slot is an orphan: the next daemon runs it.
start_daemon f "$T/d.ini"
wait_until 30 "succeeded $a $b $ids"
ok $? "every job of the drained daemon's claim succeeds (its orphan on the next daemon)"
twice=$(awk '$1 == "start" { n[$2]++ } END { for (i in n) if (n[i] != 1) print i " x" n[i] }' "$T/runs.log")
is "$twice" "" "no command ran twice"
stop_daemon "$DAEMON_PID"
is $? 0 "SIGTERM: exit status 0"
done_testing
