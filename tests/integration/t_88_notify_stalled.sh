#!/usr/bin/env bash
# A notify socket that stops reading (a busy or stalled PID 1; its queue holds only
# net.unix.max_dgram_qlen datagrams) must never stop the daemon: notify-sink --stalled
# fills its own queue and reads nothing until SIGUSR1. Meanwhile 300 jobs must all run
# (with WATCHDOG=1 pings every 0.1 s and STATUS= updates that cannot be delivered), the
# full socket is logged once, and a SIGHUP still reloads. Once the sink reads, the state
# messages arrive in order, none lost (READY=1, RELOADING=1 + MONOTONIC_USEC, READY=1),
# the coalesced STATUS=/WATCHDOG=1 follow, the drain is logged once, and SIGTERM brings
# STOPPING=1. A daemon whose sendto(2) blocks hangs at its first message and runs no job.
. "$(dirname "$0")/lib.sh"
require_pgjobd

SINK=${NOTIFY_SINK:-$REPO_ROOT/build/tests/notify-sink}
[ -x "$SINK" ] || bail_out "notify-sink not found at $SINK (make build/tests/notify-sink, or set NOTIFY_SINK)"

NJOBS=300

pg_start

conf=$T/stalled.ini
write_conf "$conf" <<EOF
$(conf_header log_level=info)

[queue.fast]
concurrency = 4
command = true
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

sock=$T/notify.sock
msgs=$T/notify.txt
"$SINK" --stalled "$sock" "$msgs" 2>"$T/sink.log" &
sink=$!
echo "$sink" >"$T/sink.pid" # killed by the cleanup
disown "$sink"
wait_until 10 "grep -q 'queue full' '$T/sink.log'" || bail_out "notify-sink did not fill its queue"
note "$(cat "$T/sink.log")"

# msg_count PID REGEX: how many assignments from PID match ^REGEX$.
msg_count() {
	awk -v pid="$1" -v re="^($2)\$" '$3 == pid && $4 ~ re { n++ } END { print n + 0 }' "$msgs"
}
# settle_file FILE: wait (up to 5 s) until FILE has not grown for half a second.
settle_file() {
	local size last=-1 stable=0 i
	for i in $(seq 1 50); do
		size=$(wc -c <"$1")
		if [ "$size" = "$last" ]; then stable=$((stable + 1)); else stable=0; fi
		[ "$stable" -ge 5 ] && return 0
		last=$size
		sleep 0.1
	done
}
# msg_seqs PID REGEX: the datagram numbers of the assignments from PID matching ^REGEX$.
msg_seqs() {
	awk -v pid="$1" -v re="^($2)\$" '$3 == pid && $4 ~ re { printf "%s%s", sep, $2; sep = " " }' "$msgs"
}
# msg_keys PID SEQ: the keys assigned in datagram SEQ from PID, in order.
msg_keys() {
	awk -v pid="$1" -v seq="$2" '$3 == pid && $2 == seq { k = $4; sub(/=.*/, "", k); printf "%s%s", sep, k; sep = " " }' "$msgs"
}
last_status() {
	awk -v pid="$1" '$3 == pid && $4 ~ /^STATUS=/ { s = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ STATUS=/, "", s) } END { print s }' "$msgs"
}
log_count() { grep -c -- "$1" "$T/d.log"; }

# 1. Stalled: the daemon must serve as if nothing were wrong.
start_daemon d "$conf" NOTIFY_SOCKET="$sock" WATCHDOG_USEC=200000
d=$DAEMON_PID
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'fast' FROM generate_series(1, $NJOBS)" >/dev/null
wait_until 120 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = $NJOBS ]"
ok $? "all $NJOBS jobs finish while the notify socket is full (got $(count_jobs "status = 'succeeded'"))"
pid_alive "$d"
ok $? "the daemon is running"
is "$(wc -l <"$msgs")" 0 "nothing has been delivered yet (the sink has not read)"
is "$(log_count 'notify socket is full')" 1 "the full socket is logged once"
# A reload while stalled: RELOADING=1 and READY=1 are held, not lost and not blocking.
kill -HUP "$d"
wait_until 20 "grep -q 'configuration reloaded' '$T/d.log'"
ok $? "SIGHUP is handled while the notify socket is full"

# A STATUS= update must be held too. The first comes from the count of queued jobs that
# the daemon sends 0.5 s after it starts (then every 2 s); on an idle machine the jobs and
# the reload can all be over before that. Wait until the count has run (the daemon turns
# its answer into STATUS= in the same turn of its loop that reads it).
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE state = 'idle'
                    AND query LIKE 'SELECT count(*) FROM (SELECT 1 FROM pgjobd.jobs%'\")\" -ge 1 ]"
ok $? "the daemon has counted the queued jobs (a STATUS= update is held)"
sleep 0.2

# 2. The sink reads again: the held state messages arrive in order, then the newest status.
kill -USR1 "$sink"
wait_until 10 "[ \$(msg_count $d READY=1) -ge 2 ]"
ok $? "READY=1, held while the socket was full, arrives (twice: start and reload)"
read -r r1 r2 <<<"$(msg_seqs "$d" READY=1)"
rl=$(msg_seqs "$d" RELOADING=1)
ok "$([ -n "$r1" ] && [ -n "$rl" ] && [ -n "$r2" ] && [ "$r1" -lt "$rl" ] && [ "$rl" -lt "$r2" ]; echo $?)" \
	"in order: READY=1 (datagram $r1), RELOADING=1 ($rl), READY=1 ($r2)"
is "$(msg_seqs "$d" 'MONOTONIC_USEC=[0-9]+')" "$rl" "MONOTONIC_USEC= in the RELOADING=1 datagram"
is "$(msg_count "$d" READY=1)" 2 "exactly two READY=1"
wait_until 10 "[ \"\$(last_status $d)\" = '0 running, 0 queued' ]"
ok $? "the newest STATUS= arrives (got '$(last_status "$d")')"
wait_until 10 "[ \$(log_count 'notify socket accepts messages again') = 1 ]"
ok $? "the drain is logged once"
is "$(log_count 'notify socket is full')" 1 "one full period, logged once (the reload added no line)"
note "$(grep -m1 'notify socket accepts messages again' "$T/d.log")"
is "$r1 $rl $r2" "1 2 3" "the held state messages are the first datagrams: no update overtook them"
is "$(msg_keys "$d" 4)" "STATUS WATCHDOG" \
	"then the held updates, coalesced into one datagram of STATUS= and WATCHDOG=1"
n0=$(msg_count "$d" WATCHDOG=1)
wait_until 10 "[ \$(msg_count $d WATCHDOG=1) -ge $((n0 + 5)) ]"
ok $? "WATCHDOG=1 pings flow again"

# 3. SIGTERM: STOPPING=1 after the held messages, exit 0.
kill -TERM "$d"
wait_daemon_exit "$d" 30
is "$DAEMON_STATUS" 0 "SIGTERM: exit 0"
# The daemon sent everything before it exited, but the sink may not have written it all
# yet (a loaded machine): wait for STOPPING=1, then until the sink's file stops growing.
wait_until 10 "[ \$(msg_count $d STOPPING=1) -ge 1 ]"
settle_file "$msgs"
is "$(msg_count "$d" STOPPING=1)" 1 "STOPPING=1 arrives once"
st=$(msg_seqs "$d" STOPPING=1)
ok "$([ -n "$st" ] && [ "$st" -gt "$r2" ]; echo $?)" "STOPPING=1 (datagram $st) after the last READY=1"
is "$(count_jobs "status <> 'succeeded'")" 0 "no job in any other state"

done_testing
