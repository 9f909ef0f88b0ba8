#!/usr/bin/env bash
# Schedules (recurring jobs), the basics: pgjobd.schedule() refuses bad input with a clear
# message (and agrees with the daemon's parser on what is bad), only the owner and the
# worker role may schedule, a tick enqueues one ordinary job within a second of its time,
# whose command sees PGJOBD_SCHEDULE and PGJOBD_SCHEDULED_FOR; a local time skipped by a
# spring-forward runs at the end of the gap; and the CLI (add, list, run-now, pause,
# resume, rm). Times come from PGJOBD_TEST_CLOCK (the daemon's own clock code, shifted):
# a tick is a few seconds away instead of up to a minute.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
write_conf "$T/s.ini" <<EOF
$(conf_header poll_interval=1h)

[queue.s]
command = echo "\$PGJOBD_JOB_ID|\${PGJOBD_SCHEDULE-unset}|\${PGJOBD_SCHEDULED_FOR-unset}" >>'$T/env.log'
concurrency = 2
EOF
pgjobd_migrate "$T/s.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# as USER SQL: run SQL as USER; prints output (errors with their SQLSTATE).
as() {
	psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1
}
# refused SQL NEEDLE NAME: SQL fails with SQLSTATE 22023 and a message containing NEEDLE.
refused() {
	local out status
	out=$(as postgres "$1")
	status=$?
	[ "$status" != 0 ] && [[ $out == *"ERROR:  22023:"* ]] && [[ $out == *"$2"* ]]
	ok $? "$3" || diag "  $1" "  exit status: $status" "  output: $out"
}

# ---------------------------------------------------------------- bad input

refused "SELECT pgjobd.schedule('a', '61 * * * *', 's')" 'minute field "61": 61 is out of range 0-59' \
	"a minute out of range is refused, naming the field"
refused "SELECT pgjobd.schedule('a', '0 0 30 2 *', 's')" "never runs" \
	"a date that never comes (February 30) is refused"
refused "SELECT pgjobd.schedule('a', '* * * *', 's')" "expected 5 fields" "four fields are refused"
refused "SELECT pgjobd.schedule('a', '0 * * * * /bin/true', 's')" "a command is not part of a schedule" \
	"a crontab line with its command is refused, with a hint"
refused "SELECT pgjobd.schedule('a', '0 0 * foo *', 's')" 'unknown name "foo" (use jan to dec)' \
	"an unknown month name is refused"
refused "SELECT pgjobd.schedule('a', '@reboot', 's')" "@reboot is not supported" "@reboot is refused"
refused "SELECT pgjobd.schedule('a', '@every 5m', 's')" "unknown macro" "an unknown macro is refused"
refused "SELECT pgjobd.schedule('a', '0 3 * * *', 's', time_zone => 'Mars/Olympus')" \
	"unknown time zone 'Mars/Olympus'" "an unknown time zone is refused"
refused "SELECT pgjobd.schedule('a', '0 3 * * *', 's', time_zone => 'europe/berlin')" \
	"Did you mean 'Europe/Berlin'?" "a time zone in the wrong case is refused, with a hint"
refused "SELECT pgjobd.schedule('a', '0 3 * * *', 's', time_zone => 'UTC+3')" \
	"unknown time zone" "a POSIX offset is not a zone name"
refused "SELECT pgjobd.schedule('a', '0 3 * * *', 'bad queue')" "bad queue name" "a bad queue name is refused"
refused "SELECT pgjobd.schedule('a b', '0 3 * * *', 's')" "bad schedule name" "a bad schedule name is refused"
refused "SELECT pgjobd.schedule('a', '0 3 * * *', 's', missed => 'later')" "missed must be skip, last or all" \
	"a bad missed policy is refused"
refused "SELECT pgjobd.schedule('a', '0 3 * * *', 's', overlap => 'queue')" "overlap must be allow or skip" \
	"a bad overlap policy is refused"
is "$(psql_q "SELECT count(*) FROM pgjobd.schedules")" 0 "nothing refused was stored"

# The SQL check and the daemon's parser (through the CLI, which uses it) agree.
disagree=
for e in '* * * * *' '*/15 9-17 * * mon-fri' '0 0 29 2 *' '0 0 30 2 mon' '5/10 * * * *' \
	'0 0 * * 7' '0 0 1,15 jan,jul *' '@yearly' '@MIDNIGHT' '0 0 */30 2 *' \
	'60 * * * *' '* 24 * * *' '* * 0 * *' '* * * 13 *' '* * * * 8' '0 0 30 2 *' '0 0 31 4 *' \
	'0 0 30 2 */2' '5-1 * * * *' '*/0 * * * *' '*/61 * * * *' '1,,2 * * * *' '? * * * *' \
	'0 0 L * *' '0 0 * * 1#2' 'a * * * *' '* * * * sat-sun' '*-5 * * * *' '00000 * * * *' \
	'@reboot' '@weekly 1' '' '* * * * * *'; do
	psql_q "SELECT pgjobd.check_cron($(sql_lit "$e"))" >/dev/null 2>&1
	sql=$?
	"$PGJOBD" schedule add agree "$e" s -c "$T/s.ini" >"$T/agree.log" 2>&1
	cli=$?
	[ "$cli" = 0 ] && psql_q "SELECT pgjobd.unschedule('agree')" >/dev/null
	if { [ "$sql" = 0 ] && [ "$cli" != 0 ]; } || { [ "$sql" != 0 ] && [ "$cli" != 2 ]; }; then
		disagree="$disagree [$e: sql $sql cli $cli]"
	fi
done
is "$disagree" "" "pgjobd.check_cron and the daemon's parser agree on 33 expressions"

# ---------------------------------------------------------------- who may schedule

psql_q "SELECT pgjobd.setup_roles()" >/dev/null
psql_q "CREATE ROLE app LOGIN IN ROLE pgjobd_producer; CREATE ROLE wrk LOGIN IN ROLE pgjobd_worker"
out=$(as app "SELECT pgjobd.schedule('p', '* * * * *', 's')")
[[ $out == *"42501"* ]]
ok $? "a producer may not create a schedule (42501)" || diag "$out"
out=$(as app "SELECT count(*) FROM pgjobd.schedules")
[[ $out == *"42501"* ]]
ok $? "nor read the schedules" || diag "$out"
psql_q "SELECT pgjobd.grant_queue('app', 's')" >/dev/null
out=$(as app "INSERT INTO pgjobd.jobs (queue, schedule, scheduled_for) VALUES ('s', 'x', now())")
[[ $out == *"42501"* ]]
ok $? "nor forge a tick's job (which would take the tick's place)" || diag "$out"
is "$(as wrk "SELECT pgjobd.schedule('w', '0 3 * * *', 's'); SELECT pgjobd.unschedule('w')")" "t
t" "the worker role may schedule and unschedule"
out=$(as wrk "UPDATE pgjobd.schedules SET cron = '* * * * *'")
[[ $out == *"42501"* ]]
ok $? "the worker role writes only the columns the daemon computes" || diag "$out"

# ---------------------------------------------------------------- a tick

# The clock: 6 s from now it is 2030-01-01T00:00:00Z, and it runs at real speed.
real0=$(date +%s.%N)
boundary=$(date -u -d 2030-01-01T00:00:00Z +%s)
clock="$real0 $((boundary - 6)) 1"
start_daemon d "$T/s.ini" PGJOBD_TEST_CLOCK="$clock"
wait_until 10 'grep -q "msg=\"ready\"" "$T/d.log"' || bail_out "the daemon did not start"

t0=$(now_ms)
is "$(psql_q "SELECT pgjobd.schedule('every', '* * * * *', 's', data => '{\"k\": \"v\"}')")" t \
	"pgjobd.schedule() creates a schedule (true)"
wait_until 5 '[ -n "$(psql_q "SELECT next_run FROM pgjobd.schedules WHERE name = '"'every'"'")" ]'
ok $? "a daemon computes next_run (woken by the NOTIFY: poll_interval is 1h)"
t1=$(now_ms)
note "next_run appeared $((t1 - t0)) ms after pgjobd.schedule()"
is "$(psql_q "SELECT to_char(next_run AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') FROM pgjobd.schedules")" \
	"2030-01-01T00:00:00" "next_run is the next minute of the test clock"

wait_until 10 '[ "$(count_jobs "schedule = '"'every'"'")" -ge 1 ]'
ok $? "the tick enqueues a job"
# When the tick was due in real time: 6 s after real0.
lateness=$(psql_q "SELECT round(extract(epoch FROM created_at) * 1000 - ($real0 + 6) * 1000)
                     FROM pgjobd.jobs WHERE schedule = 'every' ORDER BY id LIMIT 1")
note "the first tick's job was created $lateness ms after the tick's time"
# How late a tick is, is a figure of make bench (9a); here, a bound no busy machine
# reaches and no poll could meet (poll_interval is 1h): the daemon's timer acted.
cmp_ok "${lateness%.*}" -lt 5000 "on the scheduler's timer: within 5 s of its time"
cmp_ok "${lateness%.*}" -ge 0 "and not before it"
j=$(psql_q "SELECT id FROM pgjobd.jobs WHERE schedule = 'every' ORDER BY id LIMIT 1")
is "$(job_field "$j" "queue || ' ' || data::text || ' ' || to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS')")" \
	's {"k": "v"} 2030-01-01T00:00:00' "an ordinary job: the schedule's queue and data, scheduled_for the tick"
wait_until 10 "[ \"\$(job_field $j status)\" = succeeded ]"
ok $? "the job runs and succeeds"
is "$(grep "^$j|" "$T/env.log")" "$j|every|2030-01-01T00:00:00Z" \
	"the command sees PGJOBD_SCHEDULE and PGJOBD_SCHEDULED_FOR (ISO 8601, UTC)"
is "$(psql_q "SELECT to_char(last_run AT TIME ZONE 'UTC', 'HH24:MI') || ' ' || to_char(next_run AT TIME ZONE 'UTC', 'HH24:MI') FROM pgjobd.schedules WHERE name = 'every'")" \
	"00:00 00:01" "last_run is the tick, next_run the next minute"
psql_q "SELECT pgjobd.unschedule('every')" >/dev/null
e=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('s') RETURNING id")
wait_until 10 "[ \"\$(job_field $e status)\" = succeeded ]"
is "$(grep "^$e|" "$T/env.log")" "$e|unset|unset" "a job no schedule made has neither variable"
stop_daemon "$DAEMON_PID"

# ---------------------------------------------------------------- daylight saving time

# Berlin, 2030-03-31: clocks go from 02:00 CET (01:00Z) to 03:00 CEST. 02:30 does not
# exist that day: the tick runs at 03:00 CEST, the first valid time after the gap.
real0=$(date +%s.%N)
gap=$(date -u -d 2030-03-31T01:00:00Z +%s)
psql_q "SELECT pgjobd.schedule('berlin', '30 2 * * *', 's', time_zone => 'Europe/Berlin')" >/dev/null
start_daemon d2 "$T/s.ini" PGJOBD_TEST_CLOCK="$real0 $((gap - 4)) 1"
wait_until 12 '[ "$(count_jobs "schedule = '"'berlin'"'")" -ge 1 ]'
ok $? "the Berlin 02:30 schedule ticks on the day 02:30 is skipped"
is "$(psql_q "SELECT to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS') FROM pgjobd.jobs WHERE schedule = 'berlin'")" \
	"2030-03-31T01:00:00" "at 03:00 CEST (01:00Z), the end of the gap"
is "$(psql_q "SELECT to_char(next_run AT TIME ZONE 'Europe/Berlin', 'YYYY-MM-DD HH24:MI') FROM pgjobd.schedules WHERE name = 'berlin'")" \
	"2030-04-01 02:30" "and next at 02:30 local the day after"

# ---------------------------------------------------------------- the CLI

cli() { "$PGJOBD" schedule "$@" -c "$T/s.ini"; }
out=$(cli add nightly '0 3 * * *' s --tz Europe/Berlin --data '{"x": 1}' --missed all --overlap skip --priority 5 2>&1)
ok $? "pgjobd schedule add" || diag "$out"
like "$out" "^created schedule nightly
next tick [0-9]{4}-[0-9]{2}-[0-9]{2}T0[12]:00:00Z$" "it prints what it did and the next tick"
is "$(psql_q "SELECT cron || '|' || time_zone || '|' || queue || '|' || data::text || '|' || missed || '|' || overlap || '|' || priority FROM pgjobd.schedules WHERE name = 'nightly'")" \
	'0 3 * * *|Europe/Berlin|s|{"x": 1}|all|skip|5' "with every option stored"
out=$(cli add nightly '0 4 * * *' s 2>&1)
like "$out" "^replaced schedule nightly" "add again replaces it"
is "$(psql_q "SELECT cron || '|' || time_zone || '|' || missed || '|' || overlap FROM pgjobd.schedules WHERE name = 'nightly'")" \
	'0 4 * * *|UTC|last|allow' "options not given take their defaults"
out=$(cli add bad '0 0 31 2 *' s 2>&1)
is "$?" 2 "a cron expression that never runs: exit status 2"
like "$out" "bad CRON '0 0 31 2 \*': never runs" "with the parser's message"
out=$(cli add bad '* * * * *' s --tz Nowhere/Land 2>&1)
is "$?" 2 "an unknown zone: exit status 2"
like "$out" "unknown time zone 'Nowhere/Land'" "PostgreSQL's message"
out=$(cli add bad '* * * * *' s --data '{oops' 2>&1)
is "$?" 2 "bad --data: exit status 2"
wait_until 5 '[ -n "$(psql_q "SELECT next_run FROM pgjobd.schedules WHERE name = '"'nightly'"'")" ]'
out=$(cli list)
like "$out" "^NAME +CRON +TZ +QUEUE +LAST_RUN +NEXT_RUN +SKIPPED +MISSED +POLICY +STATE" "list: a header"
like "$out" "berlin +30 2 \* \* \* +Europe/Berlin +s +2030-03-31T01:00:00Z +2030-04-01T00:30:00Z +0 +0 +missed=last overlap=allow +active" \
	"list: a schedule's line with last and next run"
like "$out" "nightly +0 4 \* \* \* +UTC" "list: every schedule"
json=$(cli list --json)
is "$(psql_q "SELECT string_agg(e->>'name' || ':' || (e->>'skipped_overlap') || ':' || (e->>'time_zone'), ',') FROM json_array_elements($(sql_lit "$json")::json) e")" \
	"berlin:0:Europe/Berlin,nightly:0:UTC" "list --json: every schedule as a JSON array"
id=$(cli run-now nightly)
like "$id" '^[0-9]+$' "run-now prints the new job's id"
wait_until 10 "[ \"\$(job_field ${id:-0} status)\" = succeeded ]"
like "$(grep "^$id|" "$T/env.log")" "^$id\|nightly\|20[0-9-]{8}T[0-9:]{8}Z\$" \
	"a run-now job carries the schedule's name and its time"
is "$(psql_q "SELECT (last_run IS NULL) FROM pgjobd.schedules WHERE name = 'nightly'")" t \
	"run-now is not a tick (last_run unchanged)"
is "$(cli pause nightly)" "paused schedule nightly" "pause"
is "$(cli pause nightly)" "schedule nightly was paused already" "pause again"
like "$(cli list)" "nightly .* paused" "list shows it paused"
is "$(cli resume nightly)" "resumed schedule nightly" "resume"
is "$(cli rm nightly)" "removed schedule nightly" "rm"
out=$(cli rm nightly 2>&1)
is "$?" 1 "rm of a schedule that does not exist: exit status 1"
like "$out" "no schedule named nightly" "saying so"
out=$(cli run-now nightly 2>&1)
is "$?" 1 "run-now of a schedule that does not exist: exit status 1"

stop_daemon "$DAEMON_PID"
is $? 0 "the daemon exits 0"
done_testing
