#!/usr/bin/env bash
# Lock mode lease through network partitions shorter than the lease (SPEC "Lock modes",
# guarantees 3 and 5): the daemon reaches PostgreSQL through a TCP relay that the test
# stops (nothing flows either way; new connections wait in the relay's listen backlog).
# Lease 10 s; each partition lasts 3 s, longer than the daemon's fence (fence_timeout 1 s
# plus its margin of 1 s), so its instance is declared dead meanwhile, as a lost host's.
#  A. Partition alone: the long commands keep running; a short job that ends during the
#     partition has its outcome written once the relay runs again.
#  B. Partition, and the server ends every session of the daemon meanwhile: the daemon
#     reconnects through the relay, extends in time, and again loses nothing.
# Every job ends once, succeeded, with attempts = 1; no lease is lost.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start_relayed

make_mark_script "$T/mark.sh" "$T/marks.log"
write_conf "$T/a.ini" <<EOF
$(conf_header fence_timeout=1s "database=host=127.0.0.1 port=$RELAY_PORT dbname=$PGDATABASE user=postgres")

[queue.p]
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

# partition ROUND SHORT_ID: two long jobs (they wait for gate ROUND) and the short job
# SHORT_ID (1.5 s) run; the relay stops for 3 s; with B, the server ends the daemon's
# sessions meanwhile.
long_pids=""
alive() {
	local p
	for p in $long_pids; do pid_alive "$p" || return 1; done
}
partition() {
	local round=$1 ids short
	ids=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
	              VALUES ('p', '$round-g1', '{\"gate\": \"$round\"}'),
	                     ('p', NULL, '{\"gate\": \"$round\"}'),
	                     ('p', '$round-g2', '{\"sleep\": 1.5}')
	              RETURNING id" | tr '\n' ' ')
	set -- $ids
	short=$3
	wait_until 15 "mark_started $T/marks.log $1 1 && mark_started $T/marks.log $2 1 && mark_started $T/marks.log $short 1" ||
		bail_out "$round: the jobs did not start"
	long_pids="$(mark_pid "$T/marks.log" "$1" 1) $(mark_pid "$T/marks.log" "$2" 1)"
	kill -STOP "$RELAY"
	local cut_at
	cut_at=$(now_ms)
	if [ "$round" = B ]; then
		# The server ends the daemon's sessions (the relay's, on the server's side).
		psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		        WHERE application_name LIKE 'pgjobd%'" >/dev/null
	fi
	while [ $(($(now_ms) - cut_at)) -lt 3000 ]; do sleep 0.1; done
	kill -CONT "$RELAY"
	note "$round: the relay was stopped for $(($(now_ms) - cut_at)) ms"
	alive
	ok $? "$round: the long commands ran through the partition"
	wait_until 15 "[ \"\$(job_field $short status)\" = succeeded ]"
	ok $? "$round: the outcome of the job that ended during the partition is written"
	SHORT=$short
}

partition A
is "$(job_field "$SHORT" "attempts || ' ' || jsonb_array_length(history)")" "1 1" \
	"A: that job: attempt 1, one history entry"
sleep 2 # extensions after the partition
alive
ok $? "A: the long commands still run after it"
touch "$T/gate.A"
wait_until 20 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 3 ]"
ok $? "A: the long jobs succeed"

partition B
wait_until 15 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'\")\" = 3 ]"
ok $? "B: the daemon's three sessions are back"
sleep 2
alive
ok $? "B: the long commands still run after it"
touch "$T/gate.B"
wait_until 20 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 6 ]"
ok $? "B: every job succeeded"

lease_kept "$T/marks.log" "$T/a.log" 6
problems=$(check_markers "$T/marks.log")
is "$problems" "" "no overlap, group order kept"
stop_daemon "$A"
is "$?" 0 "the daemon exits 0"
done_testing
