#!/usr/bin/env bash
# SIGHUP changes the queues under running jobs (pgjobd(8), reload): a removed queue
# claims nothing more, and its running job finishes and its outcome is written; a queue
# served again while a job of its old slots still runs runs new jobs, and that job runs
# on once, neither handed back by the new claimer's first orphan pass nor started again;
# a lowered concurrency lets both running jobs finish; and the daemon still stops
# cleanly (exit 0) afterwards.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
# queues_conf [CONCURRENCY_OF_A]: queue b, and queue a unless CONCURRENCY_OF_A is empty.
queues_conf() {
	{
		conf_header
		printf '\n[queue.b]\ncommand = exec %s\n' "'$T/mark.sh'"
		[ -n "${1:-}" ] && printf '\n[queue.a]\ncommand = exec %s\nconcurrency = %s\n' \
			"'$T/mark.sh'" "$1"
	} >"$T/d.ini"
}
# reload PATTERN: SIGHUP, then wait for the Nth "configuration reloaded" and PATTERN.
reloads=0
reload() {
	kill -HUP "$D"
	reloads=$((reloads + 1))
	wait_until 10 "[ \"\$(grep -c 'msg=\"configuration reloaded\"' '$T/d.log')\" -ge $reloads ]" &&
		grep -q "$1" "$T/d.log"
}
enqueue() { # QUEUE [GATE] -> id (the command waits for $T/gate.GATE)
	local data="'{}'"
	[ -n "${2:-}" ] && data="jsonb_build_object('gate', $(sql_lit "$2"))"
	psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ($(sql_lit "$1"), $data) RETURNING id"
}
state() { job_field "$1" "status || ' ' || attempts"; }

queues_conf 2
pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$T/d.ini"
D=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"

# 1. Remove queue a while its job runs.
a1=$(enqueue a g1)
wait_until 20 "mark_started '$T/marks.log' $a1 1"
ok $? "a job of queue a runs"
queues_conf ""
reload 'msg="queue removed" queue=a'
ok $? "SIGHUP without [queue.a]: the queue is removed"
a2=$(enqueue a)
holds_for 1 "[ \"\$(state $a2)\" = 'queued 0' ]"
ok $? "... no new job of it is claimed"
is "$(state "$a1")" "running 1" "... its running job runs on"

# 2. Serve it again while that job still runs: the new claimer's first claim asks for
# an orphan pass, which hands back a job of ours that no slot answers for (and that
# is not locked).
queues_conf 1
reload 'msg="serving queue" queue=a concurrency=1'
ok $? "SIGHUP with [queue.a] again: the queue is served again"
wait_until 20 "[ \"\$(state $a2)\" = 'succeeded 1' ]"
ok $? "... its queued job runs"
holds_for 1 "[ \"\$(state $a1)\" = 'running 1' ]"
ok $? "... and the job running since before the removal runs on"
touch "$T/gate.g1"
wait_until 20 "[ \"\$(state $a1)\" = 'succeeded 1' ]"
ok $? "that job's outcome is written when it ends, in its first attempt"
is "$(awk -v id="$a1" '$1 == "start" && $3 == id' "$T/marks.log" | wc -l | tr -d ' ')" 1 \
	"... and its command was started once"

# 3. Lower the concurrency while two jobs run: both finish, new ones still run.
queues_conf 2
reload 'msg="queue changed" queue=a concurrency=2'
ok $? "concurrency of a raised to 2"
a3=$(enqueue a g3)
a4=$(enqueue a g3)
wait_until 20 "mark_started '$T/marks.log' $a3 1 && mark_started '$T/marks.log' $a4 1"
ok $? "two jobs of a run at once"
queues_conf 1
reload 'msg="queue changed" queue=a concurrency=1'
ok $? "concurrency of a lowered to 1 while they run"
touch "$T/gate.g3"
wait_until 20 "[ \"\$(state $a3) \$(state $a4)\" = 'succeeded 1 succeeded 1' ]"
ok $? "... both finish in their first attempt"
a5=$(enqueue a)
wait_until 20 "[ \"\$(state $a5)\" = 'succeeded 1' ]"
ok $? "... and the next job runs"

# 4. Remove a again with a job running, let it finish, then stop the daemon.
a6=$(enqueue a g6)
wait_until 20 "mark_started '$T/marks.log' $a6 1"
ok $? "a job of a runs"
queues_conf ""
reload 'msg="queue removed" queue=a' &&
	[ "$(grep -c 'msg="queue removed" queue=a' "$T/d.log")" = 2 ]
ok $? "queue a removed again"
touch "$T/gate.g6"
wait_until 20 "[ \"\$(state $a6)\" = 'succeeded 1' ]"
ok $? "... its job finishes and its outcome is written"
b1=$(enqueue b)
wait_until 20 "[ \"\$(state $b1)\" = 'succeeded 1' ]"
ok $? "queue b still runs jobs"
problems=$(check_markers "$T/marks.log")
is "$problems" "" "no command ran twice at once"
stop_daemon "$D"
is $? 0 "SIGTERM: exit status 0"
done_testing
