#!/usr/bin/env bash
# Schedules: what happens to ticks missed while every daemon was down or the schedule
# paused (missed = skip | last | all, with the catch-up bound), and to ticks that come
# while the previous run is still queued or running (overlap = skip | allow): each does
# what pgjobd(8) says, and every tick not run is counted and logged.
# The daemons are stopped, and started again with the test clock (PGJOBD_TEST_CLOCK)
# hours later: as if they had been down that long.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
write_conf "$T/p.ini" <<EOF
$(conf_header poll_interval=500ms)

[queue.p]
command = true
concurrency = 4
EOF
pgjobd_migrate "$T/p.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

B=$(date -u -d 2032-01-01T00:00:00Z +%s) # a Thursday, midnight
for m in skip last all; do
	psql_q "SELECT pgjobd.schedule('h$m', '0 * * * *', 'p', missed => '$m')" >/dev/null
	psql_q "SELECT pgjobd.schedule('m$m', '* * * * *', 'p', missed => '$m')" >/dev/null
done
psql_q "SELECT pgjobd.schedule('hpaused', '0 * * * *', 'p')" >/dev/null

# ticks NAME: the ticks of NAME's jobs, as minutes after B, in order.
ticks() {
	psql_q "SELECT string_agg((extract(epoch FROM scheduled_for)::bigint - $B) / 60 || '', ' ' ORDER BY scheduled_for)
	          FROM pgjobd.jobs WHERE schedule = '$1'"
}
counters() {
	psql_q "SELECT skipped_missed || ' ' || skipped_overlap FROM pgjobd.schedules WHERE name = '$1'"
}
# run_at FAKE SECS: run the daemon with its clock at FAKE (epoch) now, for SECS seconds
# at most, until every schedule's next_run is past the clock (it has done its ticks).
run_at() {
	local fake=$1
	start_daemon d "$T/p.ini" PGJOBD_TEST_CLOCK="$(date +%s.%N) $fake 1"
	wait_until 20 '[ "$(psql_q "SELECT count(*) FROM pgjobd.schedules
	                               WHERE NOT paused AND (next_run IS NULL OR next_run <= to_timestamp('"$fake"'))")" = 0 ]'
	ok $? "the daemon has done what was due at $(date -u -d @"$fake" +%H:%M:%S)"
	wait_until 20 '[ "$(count_jobs "status <> '"'succeeded'"'")" = 0 ]'
	stop_daemon "$DAEMON_PID"
}

# ---------------------------------------------------------------- the first ticks

start_daemon d "$T/p.ini" PGJOBD_TEST_CLOCK="$(date +%s.%N) $((B - 3)) 1"
wait_until 10 '[ "$(count_jobs "scheduled_for = to_timestamp('"$B"')")" = 7 ]'
ok $? "00:00: every schedule ticks once"
wait_until 20 '[ "$(count_jobs "status <> '"'succeeded'"'")" = 0 ]'
stop_daemon "$DAEMON_PID"

# ---------------------------------------------------------------- down until 03:00:30

# Hourly: 01:00 and 02:00 missed, 03:00 on time (30 s late). Minutely: 00:01 to 02:59
# missed (179), 03:00 on time.
run_at $((B + 3 * 3600 + 30))
is "$(ticks hskip)" "0 180" "skip: the missed ticks do not run, the one on time does"
is "$(counters hskip)" "2 0" "skip: 2 missed ticks counted"
is "$(ticks hlast)" "0 180" "last: the tick on time stands for the missed ones"
is "$(counters hlast)" "2 0" "last: 2 missed ticks counted"
is "$(ticks hall)" "0 60 120 180" "all: every missed tick runs, and the one on time"
is "$(counters hall)" "0 0" "all: nothing counted"
is "$(ticks mskip)" "0 180" "minutely, skip: only the tick on time"
is "$(counters mskip)" "179 0" "minutely, skip: 179 missed ticks counted"
is "$(psql_q "SELECT count(*) || ' ' || min(scheduled_for) - to_timestamp($B) || ' ' || max(scheduled_for) - to_timestamp($B) FROM pgjobd.jobs WHERE schedule = 'mall' AND scheduled_for > to_timestamp($B)")" \
	"101 01:20:00 03:00:00" "minutely, all: the latest 100 missed ticks (01:20 to 02:59) and 03:00"
is "$(counters mall)" "79 0" "minutely, all: the 79 older ones counted"
like "$(grep 'schedule=hskip' "$T/d.log" | grep 'missed ticks')" \
	'missed=2 first=2032-01-01T01:00:00Z last=2032-01-01T02:00:00Z policy=skip not_run=2' \
	"the log says which ticks were missed and what became of them"
like "$(grep 'schedule=mall' "$T/d.log" | grep 'missed ticks')" 'missed=179 .* policy=all not_run=79' \
	"for the catch-up bound too"

# ---------------------------------------------------------------- down until 06:10, one paused

psql_q "SELECT pgjobd.unschedule(n) FROM unnest('{mskip,mlast,mall}'::text[]) n" >/dev/null
is "$(psql_q "SELECT pgjobd.pause_schedule('hpaused')")" t "a schedule is paused"
# 04:00, 05:00, 06:00 missed (06:00 is 10 minutes late).
run_at $((B + 6 * 3600 + 600))
is "$(ticks hskip)" "0 180" "skip, nothing on time: nothing runs"
is "$(counters hskip)" "5 0" "skip: 3 more missed ticks counted"
is "$(ticks hlast)" "0 180 360" "last, nothing on time: the latest missed tick runs once"
is "$(counters hlast)" "4 0" "last: the 2 others counted"
is "$(ticks hall)" "0 60 120 180 240 300 360" "all: each missed tick runs"
is "$(ticks hpaused)" "0 180" "a paused schedule does not tick"
out=$("$PGJOBD" schedule list -c "$T/p.ini")
like "$out" "hskip +0 \* \* \* \* +UTC +p +2032-01-01T03:00:00Z +2032-01-01T07:00:00Z +0 +5 +missed=skip overlap=allow +active" \
	"pgjobd schedule list: last and next run, missed ticks"
like "$out" "hpaused .* paused" "pgjobd schedule list: paused"
is "$(psql_q "SELECT pgjobd.resume_schedule('hpaused')")" t "resumed"
# Its ticks 04:00 to 06:00 were missed while it was paused: it runs the last one.
run_at $((B + 6 * 3600 + 660))
is "$(ticks hpaused)" "0 180 360" "resumed, missed = last: the latest missed tick runs once"
is "$(counters hpaused)" "4 0" "the 2 others counted (and the 2 of 01:00 and 02:00)"

# ---------------------------------------------------------------- overlap

psql_q "SELECT pgjobd.unschedule(name) FROM pgjobd.schedules" >/dev/null
write_conf "$T/o.ini" <<EOF
$(conf_header poll_interval=500ms)

[queue.block]
command = while [ ! -e '$T/release' ]; do sleep 0.05; done
concurrency = 2
EOF
psql_q "SELECT pgjobd.schedule('ov', '* * * * *', 'block', overlap => 'skip')" >/dev/null
psql_q "SELECT pgjobd.schedule('ovallow', '* * * * *', 'block')" >/dev/null
# A minute per second.
start_daemon o "$T/o.ini" PGJOBD_TEST_CLOCK="$(date +%s.%N) $((B + 86400)) 60"
wait_until 10 '[ "$(count_jobs "schedule = '"'ov'"' AND status = '"'running'"'")" = 1 ]'
ok $? "overlap skip: the first tick's job runs (and blocks)"
wait_until 10 '[ "$(psql_q "SELECT skipped_overlap FROM pgjobd.schedules WHERE name = '"'ov'"'")" -ge 3 ]'
ok $? "the next ticks are skipped while it runs, and counted"
is "$(count_jobs "schedule = 'ov'")" 1 "no second job of ov"
cmp_ok "$(count_jobs "schedule = 'ovallow' AND status IN ('queued', 'running')")" -ge 3 \
	"overlap allow: the ticks of ovallow pile up meanwhile"
like "$(grep 'schedule=ov ' "$T/o.log" | grep -m1 'tick skipped')" \
	'msg="schedule tick skipped: its previous run is still queued or running" schedule=ov skipped=1 skipped_overlap_total=1' \
	"each skipped tick is logged"
like "$("$PGJOBD" schedule list -c "$T/o.ini" | grep '^ov ')" '^ov +\* \* \* \* \* +UTC +block +[^ ]+ +[^ ]+ +[1-9][0-9]* +0 +missed=last overlap=skip +active$' \
	"pgjobd schedule list shows the skipped ticks"
touch "$T/release"
wait_until 10 '[ "$(count_jobs "schedule = '"'ov'"'")" -ge 2 ]'
ok $? "once the run is over, the next tick enqueues a job again"
stop_daemon "$DAEMON_PID"
is $? 0 "the daemon exits 0"
done_testing
