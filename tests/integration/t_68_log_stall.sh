#!/usr/bin/env bash
# Logging never blocks (guarantees 1 and 7 with a stalled reader of stderr): daemon a's
# stderr is a FIFO whose reader (cat) is stopped once the pipe is full. In both lock modes:
#  - a keeps serving: jobs of a queue only a serves finish while the pipe stays full;
#  - a is stopped (SIGSTOP) while it runs a grouped job (in transaction mode a DBA also ends
#    its sessions); its supervisor, whose stderr is the same full pipe, kills the command at
#    the deadline (late_ms small), and daemon b, whose stderr is normal, takes the job over
#    with no overlap of the group's flock;
#  - once the reader continues, the supervisor's kill line (an error, kept) and a's count
#    of the lines it dropped are logged.
. "$(dirname "$0")/lib.sh"
require_pgjobd
shared_cluster # the sessions it ends are its own database's
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
# write_ab_conf MODE: a.ini serves g (grouped) and solo; b.ini serves g only.
write_ab_conf() {
	local mode=$1 extra
	extra="lock_mode = $mode"
	[ "$mode" = lease ] && extra="$extra
lease = 2s"
	for n in a b; do
		{
			conf_header fence_timeout=2s
			cat <<EOF

[queue.g_$mode]
command = exec '$T/mark.sh'
$extra
max_attempts = 5
backoff = 100ms
backoff_max = 100ms
kill_grace = 1s
EOF
			[ "$n" = a ] && cat <<EOF

[queue.solo_$mode]
command = exec '$T/mark.sh'
$extra
concurrency = 2
EOF
		} >"$T/$n.$mode.ini"
	done
}
write_ab_conf transaction
write_ab_conf lease
pgjobd_migrate "$T/a.transaction.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# the pgjobd sessions that started before the time $1 (an SQL timestamptz literal): a's
terminate_before() {
	psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
	        WHERE datname = current_database() AND application_name LIKE 'pgjobd%' AND backend_start < '$1'"
}

run_mode() {
	local mode=$1 A B CAT id p1 stopped_at killed took n
	local fifo="$T/a.$mode.fifo" alog="$T/a.$mode.log"
	mkfifo "$fifo"
	cat "$fifo" >"$alog" &
	CAT=$!
	DAEMON_PIDS+=("$CAT")
	"$PGJOBD" -c "$T/a.$mode.ini" >"$fifo" 2>&1 </dev/null &
	A=$!
	DAEMON_PIDS+=("$A")
	note "$mode: daemon a (pid $A) logs to a FIFO read by cat (pid $CAT): $alog"
	wait_until 10 "workers_alive 1" || bail_out "$mode: daemon a did not register"
	id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('g_$mode', 'g', '{\"sleep\": 30}') RETURNING id")
	wait_until 15 "mark_started $T/marks.log $id 1" || bail_out "$mode: job $id did not start on a"
	p1=$(mark_pid "$T/marks.log" "$id" 1)
	local t_b
	t_b=$(psql_q "SELECT now()")
	start_daemon "b.$mode" "$T/b.$mode.ini"
	B=$DAEMON_PID
	wait_until 10 "workers_alive 2" || fail "$mode: daemon b registered"

	# Stall the reader, then fill the pipe (yes blocks once it is full).
	kill -STOP "$CAT"
	timeout 2 yes "filler line to fill the pipe" >"$fifo"
	local solo
	solo=$(psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'solo_$mode' FROM generate_series(1, 4) RETURNING id" | tr '\n' ' ')
	local all_done="[ \"\$(count_jobs \"queue = 'solo_$mode' AND status = 'succeeded'\")\" = 4 ]"
	wait_until 20 "$all_done"
	ok $? "$mode: a serves jobs while its log reader is stalled (jobs $solo)"

	kill -STOP "$A"
	stopped_at=$(now_ms)
	if [ "$mode" = transaction ]; then
		# A DBA ends the stuck daemon's sessions: its row locks go.
		n=$(terminate_before "$t_b")
		note "$mode: terminated $n sessions of daemon a"
	fi
	wait_until 15 "! pid_alive $p1" || fail "$mode: a's command died while a and its log reader were stopped"
	killed=$(($(now_ms) - stopped_at))
	note "$mode: a's command was killed ${killed} ms after SIGSTOP"
	cmp_ok "$killed" -le 4000 "$mode: at the deadline (2 s) plus scheduling slack, log reader stalled"
	wait_until 25 "mark_started $T/marks.log $id 2" || fail "$mode: b took the job over"
	took=$(($(now_ms) - stopped_at))
	note "$mode: attempt 2 started on b ${took} ms after SIGSTOP of a"
	problems=$(check_markers --lenient "$T/marks.log")
	is "$problems" "" "$mode: never two commands of the group at once"

	# The reader continues: the supervisor's count of dropped lines, then a's own.
	kill -CONT "$CAT"
	wait_until 10 "grep -q 'guard: .* deadline passed; killed' '$alog'"
	ok $? "$mode: the supervisor's line about its kill, kept while the reader stalled, is logged"
	local late
	late=$(grep -o 'deadline passed; killed.*late_ms=[0-9]*' "$alog" | grep -o 'late_ms=[0-9]*' | head -1 | cut -d= -f2)
	note "$mode: supervisor's kill: late_ms=${late:-none}"
	cmp_ok "${late:-99999}" -le 2000 "$mode: the supervisor killed on time (late_ms)"
	kill -CONT "$A"
	wait_until 10 "grep -q 'log lines dropped.*process=daemon' '$alog'"
	ok $? "$mode: the daemon logged how many lines it dropped"
	note "$mode: $(grep -o 'msg="[0-9]* log lines dropped[^"]*" dropped=[0-9]* process=[a-z]*' "$alog" | tr '\n' ';')"
	wait_until 30 "[ \"\$(job_field $id status)\" = succeeded ]" || fail "$mode: the job succeeded"
	is "$(job_field "$id" "status || ' ' || attempts")" "succeeded 2" "$mode: succeeded once, at attempt 2"
	ok "$(pid_alive "$A" && echo 0 || echo 1)" "$mode: daemon a survived and goes on"
	stop_daemon "$A" >/dev/null
	stop_daemon "$B" >/dev/null
	wait "$CAT" 2>/dev/null
	forget_daemon "$CAT"
}

run_mode transaction
run_mode lease
done_testing
