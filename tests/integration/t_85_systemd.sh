#!/usr/bin/env bash
# The systemd notify protocol (pgjobd(8)) against a datagram socket the test owns
# (tests/integration/notify-sink.c stands in for systemd): READY=1 only once the daemon
# has connected, checked the schema and is listening; WATCHDOG=1 every WATCHDOG_USEC/2,
# also while it waits for the database; STATUS= with running and queued counts;
# RELOADING=1 + MONOTONIC_USEC then READY=1 on SIGHUP, and a refused reload in STATUS=
# until a good one; STOPPING=1 on SIGTERM; no READY
# when the schema is missing; no WATCHDOG when WATCHDOG_PID names another process; every
# message from the main pid (NotifyAccess=main). Also: log lines carry the journal's <N>
# prefix when JOURNAL_STREAM names stderr.
. "$(dirname "$0")/lib.sh"
require_pgjobd

SINK=${NOTIFY_SINK:-$REPO_ROOT/build/tests/notify-sink}
[ -x "$SINK" ] || bail_out "notify-sink not found at $SINK (make build/tests/notify-sink, or set NOTIFY_SINK)"

own_cluster # it stops and starts the server
pg_start

conf=$T/sd.ini
# poll_interval = 1h: a job inserted after READY runs quickly only through LISTEN/NOTIFY.
write_conf "$conf" <<EOF
$(conf_header poll_interval=1h log_level=info)

[queue.hold]
command = while [ ! -e '$T/go' ]; do sleep 0.05; done; echo held

[queue.quick]
command = echo quick
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

sock=$T/notify.sock
msgs=$T/notify.txt
"$SINK" "$sock" "$msgs" 2>"$T/sink.log" &
echo $! >"$T/sink.pid" # killed by the cleanup
disown $!
wait_until 10 "[ -S '$sock' ]" || bail_out "notify-sink did not bind $sock"

# msg_count PID REGEX: how many assignments from PID match ^REGEX$.
msg_count() {
	awk -v pid="$1" -v re="^($2)\$" '$3 == pid && $4 ~ re { n++ } END { print n + 0 }' "$msgs"
}
# msg_field PID REGEX FIELD [last]: field 1 (time) or 2 (datagram number) of the first (or
# last) assignment from PID matching ^REGEX$; empty when there is none.
msg_field() {
	awk -v pid="$1" -v re="^($2)\$" -v f="$3" -v last="${4:-}" \
		'$3 == pid && $4 ~ re { v = $f; if (!last) { print v; exit } } END { if (last && v != "") print v }' "$msgs"
}
# the assignment text of the last STATUS= from PID
last_status() {
	awk -v pid="$1" '$3 == pid && $4 ~ /^STATUS=/ { s = $0; sub(/^[^ ]+ [^ ]+ [^ ]+ STATUS=/, "", s) } END { print s }' "$msgs"
}

# 1. Started while PostgreSQL is down: no READY, but the loop turns (watchdog pings).
pg_stop || bail_out "pg_stop failed"
start_daemon d "$conf" NOTIFY_SOCKET="$sock" WATCHDOG_USEC=1000000
d=$DAEMON_PID
wait_until 10 "[ \$(msg_count $d WATCHDOG=1) -ge 4 ]"
ok $? "WATCHDOG=1 pings while the database is unreachable (the loop turns)"
is "$(msg_count "$d" READY=1)" 0 "no READY=1 while the database is unreachable"
pid_alive "$d"
ok $? "the daemon keeps trying to connect"
wait_until 10 "last_status $d | grep -q 'waiting for the database'"
ok $? "STATUS= says it waits for the database ($(last_status "$d"))"

as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -o "$(pg_opts)" start >/dev/null ||
	bail_out "pg_ctl start failed"
PG_RUNNING=1
wait_until 30 "[ \$(msg_count $d READY=1) -ge 1 ]"
ok $? "READY=1 once the database is reachable"
is "$(msg_count "$d" READY=1)" 1 "exactly one READY=1"
grep -q 'msg="ready"' "$T/d.log"
ok $? "the daemon logged ready (schema checked)"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('quick') RETURNING id")
wait_until 10 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "after READY=1 a new job is picked up at once (LISTEN is active; poll_interval is 1h)"

# 2. Watchdog rate: WATCHDOG_USEC=1000000 -> one ping every 0.5 s.
sleep 3 # lets pings accumulate: the rate is what is measured
read -r npings span maxgap < <(awk -v pid="$d" '$3 == pid && $4 == "WATCHDOG=1" {
		if (n) { g = $1 - prev; if (g > max) max = g }
		if (!n) first = $1
		prev = $1; n++
	} END { printf "%d %.3f %.3f\n", n, prev - first, max }' "$msgs")
note "watchdog: $npings pings over ${span} s, longest gap ${maxgap} s"
# The interval and the longest gap are figures of make bench (9d). Here, bounds that only
# a wrong timer breaks, not a busy machine: no more often than every WATCHDOG_USEC/2 (less
# than 2.6 a second: load only delays pings), more often than every WATCHDOG_USEC on
# average (more than 1 a second), and never a gap of twice WATCHDOG_USEC.
rate_ok=$(awk -v n="$npings" -v s="$span" 'BEGIN { r = (n - 1) / s; print (s > 2 && r > 1.0 && r <= 2.6) ? 0 : 1 }')
ok "$rate_ok" "WATCHDOG=1 from a timer of WATCHDOG_USEC/2: 1 to 2.6 a second ($npings pings in ${span} s)"
gap_ok=$(awk -v g="$maxgap" 'BEGIN { print (g < 2.0) ? 0 : 1 }')
ok "$gap_ok" "never a gap of twice WATCHDOG_USEC (longest ${maxgap} s)"

# 3. STATUS= with counts.
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'hold' FROM generate_series(1, 3)" >/dev/null
wait_until 15 "[ \"\$(last_status $d)\" = '1 running, 2 queued' ]"
ok $? "STATUS=1 running, 2 queued (got '$(last_status "$d")')"

# 4. SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1.
kill -HUP "$d"
wait_until 10 "[ \$(msg_count $d READY=1) -ge 2 ]"
ok $? "READY=1 again after SIGHUP"
rl_seq=$(msg_field "$d" RELOADING=1 2)
rd_seq=$(msg_field "$d" READY=1 2 last)
ok "$([ -n "$rl_seq" ] && [ "$rl_seq" -lt "$rd_seq" ]; echo $?)" \
	"RELOADING=1 (datagram $rl_seq) before READY=1 (datagram $rd_seq)"
mono=$(msg_field "$d" 'MONOTONIC_USEC=[0-9]+' 4)
mono_seq=$(msg_field "$d" 'MONOTONIC_USEC=[0-9]+' 2)
rl_time=$(msg_field "$d" RELOADING=1 1)
is "$mono_seq" "$rl_seq" "MONOTONIC_USEC= in the same datagram as RELOADING=1"
mono_ok=$(awk -v m="${mono#MONOTONIC_USEC=}" -v t="$rl_time" 'BEGIN { d = t - m / 1e6; print (d >= 0 && d < 2) ? 0 : 1 }')
ok "$mono_ok" "MONOTONIC_USEC is CLOCK_MONOTONIC at the reload ($mono, received at $rl_time)"

# 4b. A reload the daemon refuses shows in STATUS= (the first error), until one succeeds.
cp "$conf" "$T/sd.ini.good"
printf 'concurency = 2\n' >>"$conf"
bad_line=$(wc -l <"$conf")
kill -HUP "$d"
wait_until 10 "[[ \"\$(last_status $d)\" == *'; reload failed: $conf:$bad_line: error: unknown key '* ]]"
ok $? "a refused reload: STATUS= says so, with file, line and error (got '$(last_status "$d")')"
cp "$T/sd.ini.good" "$conf"
kill -HUP "$d"
wait_until 10 "[[ \"\$(last_status $d)\" != *'reload failed'* ]]"
ok $? "the next good reload clears it (got '$(last_status "$d")')"

# 5. SIGTERM: STOPPING=1, then exit 0.
touch "$T/go"
wait_until 20 "[ \"\$(count_jobs \"queue = 'hold' AND status = 'succeeded'\")\" = 3 ]"
ok $? "the held jobs finish"
wait_until 10 "[ \"\$(last_status $d)\" = '0 running, 0 queued' ]"
ok $? "STATUS=0 running, 0 queued (got '$(last_status "$d")')"
kill -TERM "$d"
wait_daemon_exit "$d" 20
is "$DAEMON_STATUS" 0 "SIGTERM: exit 0"
is "$(msg_count "$d" STOPPING=1)" 1 "STOPPING=1 sent once"
like "$(last_status "$d")" '^stopping' "STATUS= says it is stopping"
is "$(awk -v pid="$d" '$3 != pid' "$msgs" | wc -l)" 0 \
	"every message came from the daemon's main pid (NotifyAccess=main)"

# 6. Schema missing: the daemon exits 3 (pgjobd(8), EXIT STATUS) and never says READY=1.
psql_q "CREATE DATABASE noschema" >/dev/null
write_conf "$T/noschema.ini" <<EOF
$(conf_header database="host=$T/sock port=$PG_PORT dbname=noschema user=postgres")

[queue.quick]
command = echo quick
EOF
start_daemon noschema "$T/noschema.ini" NOTIFY_SOCKET="$sock"
d2=$DAEMON_PID
wait_daemon_exit "$d2" 20
is "$DAEMON_STATUS" 3 "no schema: exit 3"
is "$(msg_count "$d2" READY=1)" 0 "no schema: no READY=1"
grep -q 'run pgjobd migrate' "$T/noschema.log"
ok $? "no schema: the log says to run pgjobd migrate"

# 7. WATCHDOG_PID names another process: no pings. Also: the journal's priority prefix.
: >"$T/jr.log"
start_daemon jr "$conf" NOTIFY_SOCKET="$sock" WATCHDOG_USEC=200000 WATCHDOG_PID=1 \
	JOURNAL_STREAM="$(stat -c '%d:%i' "$T/jr.log")"
d3=$DAEMON_PID
wait_until 20 "[ \$(msg_count $d3 READY=1) -ge 1 ]"
ok $? "READY=1 (WATCHDOG_PID=1)"
sleep 1
is "$(msg_count "$d3" WATCHDOG=1)" 0 "WATCHDOG_PID of another process: no WATCHDOG=1"
stop_daemon "$d3"
is $? 0 "exit 0"
like "$(grep -m1 'msg="starting"' "$T/jr.log")" '^<6>level=info msg="starting"' \
	"JOURNAL_STREAM = stderr: info lines start with <6> and have no timestamp"
start_daemon plain "$conf" JOURNAL_STREAM="1:1"
d4=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"ready\"' '$T/plain.log'"
stop_daemon "$d4"
like "$(grep -m1 'msg="starting"' "$T/plain.log")" '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z level=info' \
	"JOURNAL_STREAM naming another file: plain lines with a timestamp"

done_testing
