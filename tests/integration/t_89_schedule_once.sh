#!/usr/bin/env bash
# Schedules: exactly one job per tick, whatever the number of daemons and whatever happens
# to them (pgjobd(8), Operating; sql/014_schedules.sql). Three daemons started at the same
# instant, then two, tick five minutely schedules over many ticks: every tick of every
# schedule has exactly one job and none is missing. Then a daemon is killed with SIGKILL in
# the middle of a tick (its transaction holds the due schedule locked while its INSERT
# waits for a lock the test holds): nothing of that tick is committed, no other daemon
# enqueues the tick twice meanwhile, and the surviving daemon enqueues it once.
# The daemons' clock runs 60 times as fast (PGJOBD_TEST_CLOCK): a minute per second.
. "$(dirname "$0")/lib.sh"
require_pgjobd

SECONDS_RUN=${SECONDS_RUN:-12}
pg_start
write_conf "$T/o.ini" <<EOF
$(conf_header poll_interval=500ms log_level=info)

[queue.once]
command = true
concurrency = 4
EOF
pgjobd_migrate "$T/o.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# Each daemon connects as its own member of the worker role: the scheduler needs no more
# rights than that, and pg_stat_activity tells the daemons apart.
psql_q "SELECT pgjobd.setup_roles()" >/dev/null
for n in a b c x y; do
	psql_q "CREATE ROLE w_$n LOGIN IN ROLE pgjobd_worker"
	write_conf "$T/$n.ini" <<EOF
$(conf_header poll_interval=500ms log_level=info database="${DB_CONNINFO/user=postgres/user=w_$n}")

[queue.once]
command = true
concurrency = 4
EOF
done

# A killed daemon's session is noticed while it waits (PostgreSQL 14+), so that its
# transaction ends before the lock it waits for is released.
psql_q "ALTER DATABASE pgjobd_test SET client_connection_check_interval = '100ms'"

for i in 1 2 3 4 5; do
	psql_q "SELECT pgjobd.schedule('m$i', '* * * * *', 'once', missed => 'all')" >/dev/null
done
real0=$(date +%s.%N)
fake0=$(date -u -d 2031-06-01T00:00:00Z +%s)
clock="$real0 $fake0 60"

# every tick of schedule S from its first job's to its last's has exactly one job:
# prints "jobs ticks distinct" for S
tick_counts() {
	psql_q "SELECT count(*) || ' ' ||
	               (extract(epoch FROM max(scheduled_for) - min(scheduled_for)) / 60 + 1)::int || ' ' ||
	               count(DISTINCT scheduled_for)
	          FROM pgjobd.jobs WHERE schedule = '$1'"
}

# ---------------------------------------------------------------- three daemons, then two

declare -a pids
for n in a b c; do
	start_daemon "$n" "$T/$n.ini" PGJOBD_TEST_CLOCK="$clock"
	pids+=("$DAEMON_PID")
done
sleep "$SECONDS_RUN"
stop_daemon "${pids[2]}"
ok $? "daemon c stops (SIGTERM)"
sleep "$SECONDS_RUN"
for p in "${pids[0]}" "${pids[1]}"; do stop_daemon "$p"; done

total=0
for i in 1 2 3 4 5; do
	read -r jobs ticks distinct <<<"$(tick_counts "m$i")"
	total=$((total + jobs))
	cmp_ok "$jobs" -ge $((SECONDS_RUN * 3 / 2)) "schedule m$i ticked many times ($jobs)"
	is "$jobs $distinct" "$ticks $ticks" "schedule m$i: one job for each of its $ticks ticks, none missing"
done
is "$(psql_q "SELECT count(*) FROM pgjobd.schedules s WHERE s.last_run = (SELECT max(j.scheduled_for) FROM pgjobd.jobs j WHERE j.schedule = s.name) AND s.next_run = s.last_run + interval '1 minute'")" 5 \
	"each schedule's last_run is its latest job's tick, next_run the minute after"
# The ticks were shared, not all taken by one daemon: that is what makes one job per tick
# a property of the schema's locking rather than of a single scheduler. Over some 120
# ticks raced for by three daemons, then two, at least two win some.
split= sum=0 winners=0
for n in a b c; do
	e=$(grep -c 'msg="schedule enqueued a job"' "$T/$n.log")
	split="$split $n:$e"
	sum=$((sum + e))
	[ "$e" -gt 0 ] && winners=$((winners + 1))
done
note "jobs enqueued per daemon:$split (of $total)"
is "$sum" "$total" "each of the $total jobs was logged as enqueued by exactly one daemon"
cmp_ok "$winners" -ge 2 "the ticks were split between daemons ($split)"
is "$(grep -h 'msg="schedule enqueued a job"' "$T"/[abc].log | sed 's/.* schedule=\([^ ]*\) tick=\([^ ]*\) .*/\1 \2/' | sort | uniq -d | wc -l)" 0 \
	"no tick was logged as enqueued by two daemons"
is "$(cat "$T"/[abc].log | grep -c 'missed ticks')" 0 "no tick was missed"
wait_until 20 '[ "$(count_jobs "status <> '"'succeeded'"'")" = 0 ]'
ok $? "every job ran and succeeded"

# ---------------------------------------------------------------- kill -9 mid-tick

psql_q "SELECT pgjobd.unschedule('m' || i) FROM generate_series(1, 5) i" >/dev/null
psql_q "SELECT pgjobd.schedule('k', '* * * * *', 'once', missed => 'all')" >/dev/null
start_daemon x "$T/x.ini" PGJOBD_TEST_CLOCK="$clock"
declare -A dpid=([x]=$DAEMON_PID)
start_daemon y "$T/y.ini" PGJOBD_TEST_CLOCK="$clock"
dpid[y]=$DAEMON_PID
wait_until 10 '[ "$(count_jobs "schedule = '"'k'"'")" -ge 2 ]'
ok $? "schedule k ticks"

# The test inserts, and keeps uncommitted, a job for a tick of k three (fake) minutes
# ahead. The tick's INSERT ... ON CONFLICT then waits for the test's transaction, inside
# the daemon's tick transaction, with k's row locked.
mkfifo "$T/hold.fifo"
psql -X -qAt -v ON_ERROR_STOP=1 <"$T/hold.fifo" >"$T/hold.out" 2>&1 &
echo $! >"$T/holder.pid"
exec 7>"$T/hold.fifo"
echo "BEGIN; INSERT INTO pgjobd.jobs (queue, schedule, scheduled_for)
      SELECT 'once', 'k', next_run + interval '3 minutes' FROM pgjobd.schedules WHERE name = 'k'
      RETURNING 'held ' || extract(epoch FROM scheduled_for)::bigint;" >&7
wait_until 5 'grep -q "^held" "$T/hold.out"'
ok $? "the test holds an uncommitted job for a tick of k ahead"
held=$(sed -n 's/^held //p' "$T/hold.out")
waiting() {
	psql_q "SELECT usename FROM pg_stat_activity WHERE application_name = 'pgjobd maintenance'
	          AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO pgjobd.jobs%'"
}
wait_until 10 '[ -n "$(waiting)" ]'
ok $? "when the tick comes, a daemon's tick waits for it, in its transaction"
victim=$(waiting)
victim=${victim#w_}
holder=$(psql_q "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobd maintenance'
                   AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO pgjobd.jobs%'")
ok "$([ "$victim" = x ] || [ "$victim" = y ]; echo $?)" "the daemon in the middle of the tick is ${victim:-unknown}"
[ "$victim" = y ] || victim=x
other=y
[ "$victim" = y ] && other=x
kill -KILL "${dpid[$victim]}"
wait "${dpid[$victim]}" 2>/dev/null
forget_daemon "${dpid[$victim]}"
wait_until 10 '[ "$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE pid = '"$holder"'")" = 0 ]'
ok $? "SIGKILL: its session ends, and its transaction with it"
wait_until 10 '[ "$(waiting)" = "w_'"$other"'" ]'
ok $? "daemon $other takes the tick over, and waits in turn"
is "$(count_jobs "schedule = 'k' AND scheduled_for = to_timestamp($held)")" 0 \
	"no job for the tick is committed"
echo "ROLLBACK;" >&7
exec 7>&-
wait_until 10 '[ "$(count_jobs "schedule = '"'k'"' AND scheduled_for = to_timestamp('"$held"')")" = 1 ]'
ok $? "the test's job rolled back, daemon $other enqueues the tick"
sleep 3
stop_daemon "${dpid[$other]}"
read -r jobs ticks distinct <<<"$(tick_counts k)"
is "$jobs $distinct" "$ticks $ticks" "schedule k: one job for each of its $ticks ticks, the killed tick's included"
cmp_ok "$ticks" -ge 6 "over the $ticks ticks of k"
done_testing
