#!/usr/bin/env bash
# Replayed wake-ups (pgjobd(8), SECURITY MODEL: a stranger cannot make daemons do unbounded
# work). A role with no pgjobd grant LISTENs on pgjobd, learns queue q's wake payload from
# a real INSERT, and replays it: 250,000 NOTIFYs, each in a transaction of its own (within
# one transaction PostgreSQL would fold them into one).
#
# The bound: NOTIFYs for a queue coalesce, so that however many arrive, they make at most
# one claim of the queue per 50 ms beyond the claims that found jobs: 20 claims per second
# per queue and daemon. The daemon's round trips of every kind (claims, heartbeats, the
# maintenance look, ...; pgjobd_db_round_trips_total in its metrics file) during the flood
# must stay under 40 per second; before the coalescing a replay made a claim per round
# trip (thousands per second). And the flood costs the daemon and its sessions' backends
# less CPU than it costs the attacker's own backend (before: about twice as much).
# A real job inserted during the flood still starts at once.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # a stranger role (cluster-wide)
pg_start
N=${FLOOD_N:-250000}
BATCH=${FLOOD_BATCH:-100} # transactions per message; 1: a round trip per NOTIFY
RT_PER_S_MAX=40
# t_94_notify_flood_lease.sh runs this file with lock mode lease (lease.c claims).
LOCK_MODE=${FLOOD_LOCK_MODE:-transaction}

psql_q "CREATE ROLE stranger LOGIN" || bail_out "cannot create the role"
write_conf "$T/d.ini" <<EOF
$(conf_header poll_interval=1h log_level=info metrics_file="$T/metrics.prom")

[queue.q]
command = echo ok
concurrency = 2
lock_mode = $LOCK_MODE
EOF
start_daemon d "$T/d.ini"
dpid=$DAEMON_PID
wait_until 20 "queues_waiting q"
ok $? "the daemon waits for jobs of q"

# The stranger learns the payload: LISTEN, then a real INSERT wakes the daemon.
psql -X -U stranger -c "LISTEN pgjobd" -c "SELECT pg_sleep(3)" >"$T/listen.out" 2>&1 &
echo $! >"$T/listen.pid"
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE usename = 'stranger'\")\" = 1 ]"
sleep 0.3
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('q') RETURNING id")
wait "$(cat "$T/listen.pid")"
payload=$(sed -n 's/.*with payload "\([0-9a-f]*\)".*/\1/p' "$T/listen.out" | head -1)
like "$payload" '^[0-9a-f]{16,}$' "the stranger learned q's wake payload by LISTEN" || diag "$(cat "$T/listen.out")"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "the job that carried it ran"
wait_until 20 "queues_waiting q"

# The replay, and what it costs: round trips from the daemon's metrics file (written every
# 2 s: the window runs from one write before the flood to one after it), CPU in
# /proc/PID/stat (utime + stime, in clock ticks) of the daemon and of its sessions' backends,
# and of the attacker's backend, read by the attacker's own script before it ends.
rt() { awk '$1 == "pgjobd_db_round_trips_total" { print $2 }' "$T/metrics.prom" 2>/dev/null; }
mtime() { stat -c %.3Y "$T/metrics.prom"; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
backends() { psql_q "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%' AND datname = current_database()"; }
cpu_of() { local s=0 p; for p in "$@"; do s=$((s + $(ticks "$p"))); done; echo $s; }
# $BATCH transactions per message (psql's \; joins statements into one), so that the
# attacker spends its CPU on NOTIFYs rather than on round trips; each NOTIFY commits on
# its own.
awk -v n="$N" -v p="$payload" -v b="$BATCH" 'BEGIN {
	for (i = 1; i <= n; i++) {
		printf "BEGIN\\; NOTIFY pgjobd, %c%s%c\\; COMMIT", 39, p, 39
		printf (i % b == 0 || i == n) ? ";\n" : "\\; "
	}
}' >"$T/flood.sql"
echo "\\! touch '$T/flood.done'" >>"$T/flood.sql"
echo "SELECT pg_sleep(60);" >>"$T/flood.sql"

m0=$(mtime)
wait_until 5 "[ \"\$(mtime)\" != $m0 ]"
t0=$(mtime)
rt0=$(rt)
mapfile -t pids < <(backends)
cpu0=$(cpu_of "$dpid" "${pids[@]}")
dcpu0=$(ticks "$dpid")
psql -X -q -U stranger -v ON_ERROR_STOP=1 -f "$T/flood.sql" >"$T/flood.out" 2>&1 &
fpid=$!
echo "$fpid" >"$T/flood.pid"
wait_until 10 "[ -n \"\$(psql_q \"SELECT pid FROM pg_stat_activity WHERE usename = 'stranger'\")\" ]"
apid=$(psql_q "SELECT pid FROM pg_stat_activity WHERE usename = 'stranger'")
# A real job in the middle of the flood.
sleep 2
j=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('q') RETURNING id")
t_ins=$(now_ms)
wait_until 20 "[ \"\$(job_field $j status)\" = succeeded ]"
ok $? "a job inserted during the flood runs"
el=$(($(now_ms) - t_ins))
cmp_ok "$el" -lt 5000 "... within 5 s (${el} ms)"
wait_until 600 "[ -e '$T/flood.done' ]"
ok $? "the stranger sent $N NOTIFYs" || diag "$(tail -5 "$T/flood.out")"
cpu1=$(cpu_of "$dpid" "${pids[@]}")
dcpu1=$(ticks "$dpid")
theirs=$(ticks "$apid")
kill "$fpid"
wait "$fpid" 2>/dev/null
m1=$(mtime)
wait_until 5 "[ \"\$(mtime)\" != $m1 ]"
t1=$(mtime)
rt1=$(rt)

secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
rate=$(awk -v a="$rt0" -v b="$rt1" -v s="$secs" 'BEGIN { printf "%d", (b - a) / s }')
ours=$((cpu1 - cpu0))
note "flood: $N NOTIFYs; window ${secs} s; the daemon's round trips $((rt1 - rt0)) (${rate}/s);" \
	"CPU ticks: daemon + backends $ours (the daemon $((dcpu1 - dcpu0))), attacker's backend $theirs"
cmp_ok "$rate" -lt "$RT_PER_S_MAX" "the daemon's round trips during the flood stay under $RT_PER_S_MAX/s (${rate}/s)"
cmp_ok "$theirs" -gt 0 "the attacker's backend CPU was read ($theirs ticks)"
cmp_ok "$ours" -lt "$theirs" "the flood cost the daemon and its backends less CPU than the attacker's backend ($ours < $theirs ticks)"
is "$(job_field "$j" status)" succeeded "nothing was lost"

done_testing
