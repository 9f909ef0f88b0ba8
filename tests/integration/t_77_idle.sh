#!/usr/bin/env bash
# What idle daemons cost the server (src/README, "Idle daemons"): three daemons (two of
# lock mode transaction, one of lock mode lease, two queues each, poll_interval 1s), with
# nothing queued, send one claim per queue per poll_interval and, beyond that, no cancel
# read and no schedule probe, one maintenance pass a second between them all (the
# keeper's; the others pass every 10 s), and a heartbeat every few seconds (not every
# fifth of fence_timeout: they have no claim to bound). Counted at the server
# (log_statement = all) over a window. The daemons' promises still hold: a job of a
# queue nobody serves expires within about a second, and again once the keeper is
# stopped (SIGSTOP: another daemon takes the pace over); a schedule made meanwhile ticks;
# a cancel reaches a job that started on an idle daemon.
. "$(dirname "$0")/lib.sh"
own_cluster
require_pgjobd
pg_start

W=20 # seconds of the window
psql_q "ALTER SYSTEM SET log_line_prefix = '%m [%a] '" >/dev/null
psql_q "SELECT pg_reload_conf()" >/dev/null

make_sleeper_script "$T/sleeper.sh"
for n in a b c; do
	mode=transaction
	[ "$n" = c ] && mode=lease
	write_conf "$T/$n.ini" <<EOF
$(conf_header poll_interval=1s log_level=info)

[queue.${n}1]
command = exec /bin/sh '$T/sleeper.sh'
lock_mode = $mode

[queue.${n}2]
command = true
lock_mode = $mode
EOF
done
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# a first: it keeps the maintenance pace; b and c find it kept.
start_daemon a "$T/a.ini"
A=$DAEMON_PID
KEEPER="SELECT count(*) FROM pgjobd.maintenance_lock WHERE keeper_until > now()"
wait_until 20 "[ \"\$(psql_q \"$KEEPER\")\" = 1 ]"
ok $? "the first daemon keeps the maintenance pace"
start_daemon b "$T/b.ini"
B=$DAEMON_PID
start_daemon c "$T/c.ini"
C=$DAEMON_PID
wait_until 30 "queues_waiting a1 a2 b1 b2 c1 c2"
ok $? "every queue of the three daemons waits for a wake-up"
sleep 3 # the first passes and probes of b and c

# window: log every statement for W seconds; the daemons' statements of the window (the
# application names are "pgjobd ...") go to $T/window.log.
psql_q "ALTER SYSTEM SET log_statement = 'all'" >/dev/null
psql_q "SELECT pg_reload_conf()" >/dev/null
sleep 1
pg0=$(stat -c %s "$T/pg.log")
sleep "$W"
pg1=$(stat -c %s "$T/pg.log")
psql_q "ALTER SYSTEM SET log_statement = 'none'" >/dev/null
psql_q "SELECT pg_reload_conf()" >/dev/null
head -c "$pg1" "$T/pg.log" | tail -c +"$((pg0 + 1))" |
	grep -E '\[pgjobd[^]]*\] LOG:  (statement|execute)' >"$T/window.log"
count() { grep -c -e "$1" "$T/window.log"; }
claims=$(count 'pgjobd claim')
maint=$(count 'pgjobd.maintain(')
cancels=$(count 'pgjobd.cancel_requests')
probes=$(count 'min(s.next_run)')
beats=$(count 'pgjobd.heartbeat(')
total=$(wc -l <"$T/window.log")
other=$((total - claims - maint - cancels - probes - beats))
note "in ${W}s: $total statements: $claims claims, $maint maintenance passes, $cancels cancel reads, $probes schedule probes, $beats heartbeats, $other other"
grep -v -e 'pgjobd claim' -e 'pgjobd.maintain(' -e 'pgjobd.heartbeat(' "$T/window.log" | head -n 20 | sed 's/^/# /'

# 6 queues, a poll a second each (the timers' phase: one more each at most).
cmp_ok "$claims" -le $((6 * (W + 1))) "one claim per queue per poll_interval at most"
cmp_ok "$claims" -ge $((6 * (W - 2))) "... and the polls go on"
# The keeper passes every second; the two others every 10 s (one more each for the
# window's phase). Every daemon passing every second would be 3 W.
cmp_ok "$maint" -le $((W + 1 + 2 * (W / 10 + 1))) "maintenance: one pass a second between the three, a few more"
is "$cancels" 0 "no cancel requests read: no daemon has a job"
cmp_ok "$probes" -le 3 "schedules: no probe each poll_interval (once a minute each at most)"
cmp_ok "$other" -le 6 "nothing else but the listeners' schema check (once a minute each)"
# fence_timeout 5 s: a heartbeat when a poll finds less than 2.5 s left, or every 4 s
# (every second while a daemon has jobs).
cmp_ok "$beats" -le $((3 * (W / 2 + 1))) "heartbeats: no more than one per half fence_timeout each"
for n in b c; do
	! grep -q "cannot confirm this daemon's claims" "$T/$n.log"
	ok $? "daemon $n: no fence deadline missed while idle"
done

# Expiry while idle: the keeper cancels a job of a queue nobody serves.
e1=$(psql_q "INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('nobody', now() + interval '1 second') RETURNING id")
expired_ok() { [ "$(job_field "$1" "status || ' ' || coalesce(error->>'reason', '-')")" = "cancelled expired" ]; }
wait_until 10 "expired_ok $e1"
ok $? "a job of a queue nobody serves expires while the daemons are idle"
late=$(job_field "$e1" "extract(epoch FROM finished_at - expires_at)::numeric(10,1)")
ok "$(awk -v d="$late" 'BEGIN { exit !(d >= 0 && d < 3) }'; echo $?)" \
	"... within about a second of expires_at (${late}s)"

# A schedule made while idle ticks (its NOTIFY wakes the schedulers).
psql_q "SELECT pgjobd.schedule('every', '* * * * *', 'a2')" >/dev/null
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.schedules WHERE next_run IS NOT NULL\")\" = 1 ]"
ok $? "a schedule made while the daemons are idle gets its next_run at once"
psql_q "SELECT pgjobd.unschedule('every')" >/dev/null

# A cancel reaches a job that started on an idle daemon (its requests are read from
# the moment it has a job).
r=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('a1', '{\"sleep\": 300}') RETURNING id")
wait_until 20 "[ \"\$(job_field $r status)\" = running ]"
ok $? "a job starts on an idle daemon"
t0=$(now_ms)
psql_q "SELECT pgjobd.cancel($r)" >/dev/null
wait_until 10 "[ \"\$(job_field $r status)\" = cancelled ]"
ok $? "... and is cancelled"
cmp_ok "$(($(now_ms) - t0))" -lt 5000 "... within seconds"

# The keeper stops (SIGSTOP): another daemon takes the pace over once the keeper's
# time ran out, and expiry goes on.
kill -STOP "$A"
sleep 4 # the keeper's time (3 s) runs out
e2=$(psql_q "INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('nobody', now() + interval '1 second') RETURNING id")
wait_until 20 "expired_ok $e2"
ok $? "with the keeper stopped, another daemon's pass expires the job"
t1=$(psql_q "SELECT clock_timestamp()")
e3=$(psql_q "INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('nobody', now() + interval '1 second') RETURNING id")
wait_until 10 "expired_ok $e3"
ok $? "... and keeps the pace: the next one too"
late=$(job_field "$e3" "extract(epoch FROM finished_at - expires_at)::numeric(10,1)")
ok "$(awk -v d="$late" 'BEGIN { exit !(d >= 0 && d < 3) }'; echo $?)" \
	"... within about a second of expires_at (${late}s)"
kill -CONT "$A"

for p in "$A" "$B" "$C"; do
	stop_daemon "$p" 30
	is $? 0 "daemon $p stops cleanly (exit 0)"
done
done_testing
