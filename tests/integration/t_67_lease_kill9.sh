#!/usr/bin/env bash
# Lock mode lease, kill -9 of a daemon (guarantees 3 and 6; SPEC "Lock modes"): its
# supervisor kills its commands at once, then voids its leases, so another daemon runs
# the jobs again within about 2 s, not after the lease (30 s); never two commands of a
# group at once.
#  A. kill -9 of the daemon's pid.
#  B. kill -9 of the daemon's whole process group (the supervisor is not in it).
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
for n in a b c; do
	write_conf "$T/$n.ini" <<EOF
$(conf_header)

[queue.k]
command = exec '$T/mark.sh'
concurrency = 2
lock_mode = lease
max_attempts = 5
kill_grace = 1s
EOF
done
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# two jobs (one grouped) for the victim, alone: their ids in I1 and I2
enqueue_on() {
	local label=$1 victim=$2 ids
	ids=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
	              VALUES ('k', 'g$label', '{\"sleep\": 60}'), ('k', NULL, '{\"sleep\": 60}')
	              RETURNING id" | tr '\n' ' ')
	read -r I1 I2 <<<"$ids"
	wait_until 15 "mark_started $T/marks.log $I1 1 && mark_started $T/marks.log $I2 1" ||
		bail_out "$label: the jobs did not start"
	is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE id IN ($I1, $I2)
	              AND worker LIKE '%:$victim:%' AND lease_until > now() + interval '20 s'")" 2 \
		"$label: both run on the victim under leases of 30 s"
}

# kill -9 TARGET, then the other daemon (running) must take both jobs over
kill_and_check() {
	local label=$1 target=$2 p1 p2 killed took
	p1=$(mark_pid "$T/marks.log" "$I1" 1)
	p2=$(mark_pid "$T/marks.log" "$I2" 1)
	kill -9 -- "$target"
	killed=$(now_ms)
	wait_until 5 "! pid_alive $p1 && ! pid_alive $p2"
	ok $? "$label: the victim's commands are dead ($(($(now_ms) - killed)) ms)"
	wait_until 15 "mark_started $T/marks.log $I1 2 && mark_started $T/marks.log $I2 2"
	ok $? "$label: both jobs run again on the other daemon"
	took=$(($(now_ms) - killed))
	note "$label: both ran again ${took} ms after kill -9"
	cmp_ok "$took" -le 3000 "$label: within about 2 s, not after the lease (30 s)"
	problems=$(check_markers --lenient "$T/marks.log")
	is "$problems" "" "$label: never two commands of a group at once"
	psql_q "SELECT pgjobd.cancel($I1), pgjobd.cancel($I2)" >/dev/null
	wait_until 20 "[ \"\$(count_jobs \"id IN ($I1, $I2) AND status = 'cancelled'\")\" = 2 ]"
	ok $? "$label: cancelled"
}

# ---- A: kill -9 of the daemon
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"
enqueue_on A "$A"
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
kill_and_check A "$A"
wait "$A" 2>/dev/null
forget_daemon "$A"
stop_daemon "$B" >/dev/null

# ---- B: kill -9 of the daemon's process group. Started from a subshell, so that this
# shell has no job to report "Killed" about.
(setsid "$PGJOBD" -c "$T/c.ini" >>"$T/c.log" 2>&1 </dev/null & echo $! >"$T/c.pid")
C=$(cat "$T/c.pid")
DAEMON_PIDS+=("$C")
wait_until 10 "workers_alive 1" || bail_out "daemon c did not register"
is "$(ps -o pgid= -p "$C" | tr -d ' ')" "$C" "B: daemon c leads its own process group"
enqueue_on B "$C"
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
kill_and_check B "-$C"
stop_daemon "$B"
is $? 0 "daemon b exits 0"
done_testing
