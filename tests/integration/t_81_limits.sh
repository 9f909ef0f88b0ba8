#!/usr/bin/env bash
# Flow control's surface (pgjobd(8), "Flow control"): pgjobd.set_limits and `pgjobd
# limit` set, keep, remove and clear a queue's limits in pgjobd.queue_limits; an
# argument left out keeps its limit, NULL (the CLI's word none) removes it; bad values
# are refused with SQLSTATE 22023 (the CLI: a usage error, exit 2, before connecting);
# a change wakes the queue's daemons (NOTIFY pgjobd with the queue's payload, as
# resume() does); the worker role may set limits, a producer may not (42501) and reads
# the limits of its granted queues only; queue_stats shows each limit, what is in use
# and which limit throttles the queue; `pgjobd status` shows them under its table,
# which keeps its layout.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # it creates pgjobd's roles and others (cluster-wide)
pg_start
conf=$T/limits.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.api]
command = true
EOF
"$PGJOBD" migrate --grant -c "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate --grant" || diag "$(cat "$T/migrate.log")"
psql_q "CREATE ROLE app LOGIN IN ROLE pgjobd_producer; CREATE ROLE wrk LOGIN IN ROLE pgjobd_worker"
psql_q "SELECT pgjobd.grant_queue('app', 'api')" >/dev/null

# as USER SQL: SQL as USER, with the SQLSTATE in error messages.
as() {
	psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1
}
# sqlstate SQL: the SQLSTATE SQL fails with (as the owner), or "ok".
sqlstate() {
	local out
	out=$(psql -X -qAt -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$1" 2>&1) && {
		echo ok
		return
	}
	sed -n 's/^ERROR: *\([0-9A-Z]\{5\}\):.*/\1/p' <<<"$out" | head -n1
}
limits() {
	psql_q "SELECT concat_ws(' ', coalesce(concurrency::text, '-'), coalesce(group_concurrency::text, '-'),
	               coalesce(rate_n || '/' || rate_period, '-'),
	               coalesce(group_rate_n || '/' || group_rate_period, '-'))
	          FROM pgjobd.queue_limits WHERE queue = '$1'"
}

# ---------------------------------------------------------------- set, keep, remove

is "$(limits api)" "" "no limits: no row"
is "$(psql_q "SELECT pgjobd.set_limits('api', concurrency => 10)")" t "set_limits(concurrency => 10): true"
is "$(limits api)" "10 - - -" "... concurrency 10, nothing else"
is "$(psql_q "SELECT pgjobd.set_limits('api', concurrency => 10)")" f "the same again: false (nothing changed)"
is "$(psql_q "SELECT pgjobd.set_limits('api', rate => '10/1s')")" t "set_limits(rate => '10/1s'): true"
is "$(limits api)" "10 - 10/00:00:01 -" "... the rate is set, the concurrency limit kept"
psql_q "SELECT pgjobd.set_limits('api', group_concurrency => 3, group_rate => '5/1h30m')" >/dev/null
is "$(limits api)" "10 3 10/00:00:01 5/01:30:00" "group_concurrency and group_rate set, the others kept"
is "$(psql_q "SELECT pgjobd.set_limits('api')")" f "set_limits(queue) alone changes nothing"
is "$(psql_q "SELECT pgjobd.set_limits('api', concurrency => -1, rate => 'keep')")" f \
	"the defaults spelled out (-1, 'keep') keep"
is "$(psql_q "SELECT pgjobd.set_limits('api', concurrency => NULL)")" t "concurrency => NULL: true"
is "$(limits api)" "- 3 10/00:00:01 5/01:30:00" "... removes that limit only"
psql_q "SELECT pgjobd.set_limits('api', rate => NULL, group_rate => NULL)" >/dev/null
is "$(limits api)" "- 3 - -" "rate and group_rate => NULL remove both rates"
is "$(psql_q "SELECT pgjobd.set_limits('api', group_concurrency => NULL)")" t "the last limit removed: true"
is "$(psql_q "SELECT count(*) FROM pgjobd.queue_limits")" 0 "... and the queue's row is gone"
psql_q "SELECT pgjobd.set_limits('api', 4, 2, '100/1m', '1/500ms')" >/dev/null
is "$(limits api)" "4 2 100/00:01:00 1/00:00:00.5" "positional arguments work too"
psql_q "SELECT pgjobd.set_limits('api', NULL, NULL, NULL, NULL)" >/dev/null
is "$(limits api)" "" "all four NULL: cleared"

# Two set_limits of a queue without a row, at once: neither loses the other's limit.
psql -X -q -c "BEGIN" -c "SELECT pgjobd.set_limits('race', concurrency => 3)" \
	-c "SELECT pg_sleep(1.5)" -c "COMMIT" >/dev/null 2>&1 &
race=$!
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(1.5)%'\")\" = 1 ]"
ok $? "a first set_limits('race', concurrency => 3) is in its open transaction"
is "$(psql_q "SELECT pgjobd.set_limits('race', rate => '5/1s')")" t \
	"a second, rate => '5/1s', waits for it and changes the rate"
wait "$race"
is "$(limits race)" "3 - 5/00:00:01 -" "... and the concurrency limit of the first is kept"
psql_q "SELECT pgjobd.set_limits('race', NULL, NULL, NULL, NULL)" >/dev/null

# ---------------------------------------------------------------- validation

for bad in "concurrency => 0" "concurrency => -2" "group_concurrency => 0" \
	"rate => '0/1s'" "rate => '10/0s'" "rate => '10'" "rate => '10/'" "rate => '/1s'" \
	"rate => '10/1x'" "rate => '10/1s1m'" "rate => '10/1.5s'" "rate => '10/ 1s'" "rate => ''" \
	"rate => '2147483648/1s'" "rate => '1/36501d'" "group_rate => '1/0ms'" \
	"group_rate => 'fast'"; do
	is "$(sqlstate "SELECT pgjobd.set_limits('api', $bad)")" 22023 "set_limits($bad): SQLSTATE 22023"
done
is "$(sqlstate "SELECT pgjobd.set_limits('a b', concurrency => 1)")" 22023 "a bad queue name: 22023"
like "$(psql -X -qAt -c "SELECT pgjobd.set_limits('api', rate => '10/1m30')" 2>&1)" \
	"bad rate: '10/1m30'.*HINT: +write N/PERIOD" "the message names the argument and the value, with a hint"
is "$(limits api)" "" "nothing was set by any of them"
psql_q "SELECT pgjobd.set_limits('api', rate => '3/1d2h3m4s5ms')" >/dev/null
is "$(psql_q "SELECT rate FROM pgjobd.queue_stats WHERE queue = 'api'")" "3/1d2h3m4s5ms" \
	"every unit of the duration syntax; queue_stats writes the rate back in it"
psql_q "SELECT pgjobd.set_limits('api', rate => NULL)" >/dev/null

# ---------------------------------------------------------------- wake-up

payload=$(psql_q "SELECT pgjobd.wake_payload('api')")
out=$(psql -X -qAt -c "LISTEN pgjobd" -c "SELECT pgjobd.set_limits('api', concurrency => 2)" \
	-c "SELECT 1" 2>&1)
like "$out" "Asynchronous notification \"pgjobd\" with payload \"$payload\"" \
	"a change notifies pgjobd with the queue's wake-up payload"
out=$(psql -X -qAt -c "LISTEN pgjobd" -c "SELECT pgjobd.set_limits('api', concurrency => 2)" \
	-c "SELECT 1" 2>&1)
unlike "$out" "Asynchronous notification" "no change: no notification"

# ---------------------------------------------------------------- who may

is "$(as wrk "SELECT pgjobd.set_limits('api', concurrency => 5)")" t "the worker role sets limits"
like "$(as app "SELECT pgjobd.set_limits('api', concurrency => 50)")" "ERROR: +42501: permission denied" \
	"a producer may not call set_limits (42501)"
like "$(as app "INSERT INTO pgjobd.queue_limits (queue, concurrency) VALUES ('mine', 50)")" \
	"ERROR: +42501: permission denied" "... nor write pgjobd.queue_limits"
like "$(as app "UPDATE pgjobd.queue_limits SET concurrency = 50")" "ERROR: +42501: permission denied" \
	"... nor change a row of it"
is "$(limits api)" "5 - - -" "the limit is the worker's"
psql_q "SELECT pgjobd.set_limits('hidden', concurrency => 1)" >/dev/null
is "$(as app "SELECT string_agg(queue || ':' || concurrency, ' ' ORDER BY queue) FROM pgjobd.queue_limits")" \
	"api:5" "a producer reads the limits of its granted queues only"
is "$(as app "SELECT string_agg(queue || ':' || concurrency || ':' || coalesce(concurrency_used::text, 'null'), ' ')
                FROM pgjobd.queue_stats WHERE concurrency IS NOT NULL")" "api:5:null" \
	"... and queue_stats shows it them, without what is in use (it may not count by the jobs' group key)"
psql_q "SELECT pgjobd.set_limits('hidden', NULL, NULL, NULL, NULL)" >/dev/null

# queue_stats still serves a role that may read only what it read before.
watcher=$(test_role watcher)
psql_q "CREATE ROLE $watcher LOGIN; GRANT USAGE ON SCHEMA pgjobd TO $watcher;
        GRANT SELECT ON pgjobd.queue_stats TO $watcher;
        GRANT SELECT (queue, status, run_at, finished_at) ON pgjobd.jobs TO $watcher;
        GRANT SELECT (queue) ON pgjobd.paused_queues TO $watcher"
is "$(as "$watcher" "SELECT count(*) FROM pgjobd.queue_stats WHERE concurrency IS NOT NULL")" 0 \
	"a role that may not read queue_limits reads queue_stats, the limits' columns NULL"

# ---------------------------------------------------------------- queue_stats

# Jobs made running by hand: no daemon runs here. Groups g0 (2 running), g1 (1), g2 (0).
psql_q "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'api', 'g' || (i % 3) FROM generate_series(1, 9) i;
        INSERT INTO pgjobd.jobs (queue) VALUES ('plain');
        UPDATE pgjobd.jobs SET status = 'running', started_at = now(), attempts = 1
         WHERE queue = 'api' AND id IN (SELECT id FROM pgjobd.jobs WHERE queue = 'api' ORDER BY id LIMIT 5)
           AND group_id <> 'g2'" >/dev/null
# ids 1..5 in groups g1 g2 g0 g1 g2: running 1 (g1), 3 (g0), 4 (g1).
stats() {
	psql_q "SELECT concat_ws(' ', running, coalesce(concurrency::text, '-'), coalesce(concurrency_used::text, '-'),
	               coalesce(group_concurrency::text, '-'), coalesce(group_concurrency_used::text, '-'),
	               coalesce(rate, '-'), coalesce(rate_used::text, '-'), coalesce(group_rate, '-'),
	               coalesce(group_rate_used::text, '-'), coalesce(throttled, '-'))
	          FROM pgjobd.queue_stats WHERE queue = '$1'"
}
is "$(stats api)" "3 5 3 - - - - - - -" "concurrency 5, 3 running: not throttled"
psql_q "SELECT pgjobd.set_limits('api', concurrency => 3)" >/dev/null
is "$(stats api)" "3 3 3 - - - - - - concurrency" "concurrency 3, 3 running: throttled by concurrency"
psql_q "SELECT pgjobd.set_limits('api', concurrency => NULL, rate => '3/1m')" >/dev/null
is "$(stats api)" "3 - - - - 3/1m 3 - - rate" "3 starts in the last minute of 3/1m: throttled by rate"
psql_q "SELECT pgjobd.set_limits('api', rate => NULL, group_concurrency => 2)" >/dev/null
is "$(stats api)" "3 - - 2 2 - - - - group_concurrency" \
	"group_concurrency 2: the busiest group runs 2, and has a ready job: throttled by it"
psql_q "SELECT pgjobd.set_limits('api', group_concurrency => 3, group_rate => '2/1h')" >/dev/null
is "$(stats api)" "3 - - 3 2 - - 2/1h 2 group_rate" "group_rate 2/1h: the busiest group started 2: throttled by it"
psql_q "SELECT pgjobd.set_limits('api', group_rate => '3/1h')" >/dev/null
is "$(stats api)" "3 - - 3 2 - - 3/1h 2 -" "raised: nothing throttles"
psql_q "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE queue = 'api' AND status = 'running'" >/dev/null
psql_q "SELECT pgjobd.set_limits('api', rate => '3/1m', group_rate => '2/1h', group_concurrency => NULL)" >/dev/null
is "$(stats api)" "0 - - - - 3/1m 3 2/1h 2 rate" "finished jobs still count as starts within the period"
psql_q "SELECT pgjobd.pause('api')" >/dev/null
psql_q "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE queue = 'api'" >/dev/null
is "$(stats api)" "0 - - - - 3/1m 3 2/1h 2 -" "no ready job: not throttled"
is "$(stats plain)" "0 - - - - - - - - -" "a queue without limits: every new column NULL"
psql_q "SELECT pgjobd.set_limits('empty', concurrency => 7)" >/dev/null
is "$(stats empty)" "0 7 0 - - - - - - -" "a queue with limits and no job has a row"

# ---------------------------------------------------------------- pgjobd limit

cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}
# The jobs above started an hour ago, so that no rate's period holds their starts.
psql_q "SELECT pgjobd.set_limits('api', NULL, NULL, NULL, NULL); SELECT pgjobd.resume('api');
        UPDATE pgjobd.jobs SET started_at = started_at - interval '1 hour',
                               finished_at = finished_at - interval '1 hour' WHERE queue = 'api'" >/dev/null
cli limit api -c "$conf"
is "$rc:$err" "0:" "pgjobd limit api: exit 0"
is "$out" "queue api
  concurrency        none
  group_concurrency  none (1 per group)
  rate               none
  group_rate         none" "... shows no limits"
cli limit api --concurrency 3 -c "$conf"
is "$rc:$err:$(limits api)" "0::3 - - -" "pgjobd limit api --concurrency 3 sets it"
is "$out" "limits changed
queue api
  concurrency        3          (running: 0)
  group_concurrency  none (1 per group)
  rate               none
  group_rate         none
  throttled          no" "... and prints the limits with what is in use"
cli limit api --rate 10/1s --group-rate=2/1m --group-concurrency 2 -c "$conf"
is "$rc:$(limits api)" "0:3 2 10/00:00:01 2/00:01:00" "--rate, --group-rate, --group-concurrency: set, --concurrency kept"
like "$out" $'\n  rate               10/1s      \\(started in the period: 0\\)\n' "... the rate shown as given"
cli limit api --concurrency 3 -c "$conf"
like "$rc:$out" "^0:limits unchanged" "the same again: limits unchanged, exit 0"
cli limit api --concurrency none -c "$conf"
is "$rc:$(limits api)" "0:- 2 10/00:00:01 2/00:01:00" "--concurrency none removes that limit only"
cli limit api --clear --rate 5/1m -c "$conf"
is "$rc:$(limits api)" "0:- - 5/00:01:00 -" "--clear --rate 5/1m: exactly that rate, the rest removed"
cli limit api --clear -c "$conf"
is "$rc:$(limits api)" "0:" "--clear removes every limit"
cli limit unserved.q --concurrency 1 -c "$conf"
is "$rc" 0 "a queue nothing serves: exit 0"
like "$err" "warning: .*unserved.q" "... with a warning"
psql_q "SELECT pgjobd.set_limits('unserved.q', concurrency => NULL)" >/dev/null

usage() {
	local re=$1
	shift
	cli "$@"
	is "$rc:$out" "2:" "pgjobd $*: exit 2, nothing on stdout"
	like "$err" "$re" "... $re"
}
usage "bad --concurrency '0'" limit api --concurrency 0 -c "$conf"
usage "bad --concurrency 'x'" limit api --concurrency x -c "$conf"
usage "bad --group-concurrency '2147483648'" limit api --group-concurrency 2147483648 -c "$conf"
usage "bad --rate '10': expected N/PERIOD" limit api --rate 10 -c "$conf"
usage "bad --rate '10/0s': the period must be more than 0" limit api --rate 10/0s -c "$conf"
usage "bad --group-rate '0/1s': the count must be from 1" limit api --group-rate 0/1s -c "$conf"
usage "bad QUEUE 'a b'" limit "a b" -c "$conf"
usage "missing QUEUE" limit -c "$conf"
usage "option --clear takes no value" limit api --clear=yes -c "$conf"
usage "--concurrency is an option of limit" pause api --concurrency 3 -c "$conf"
is "$(limits api)" "" "none of them changed anything"

cli limit --help
is "$rc" 0 "pgjobd limit --help: exit 0"
like "$out" "^usage: pgjobd limit QUEUE \\[--concurrency N\\]" "... the usage"
like "$out" "--group-rate N/PERIOD" "... every option"
cli --help
like "$out" "limit QUEUE" "the overview lists limit"

sed "s/user=postgres/user=app/" "$conf" >"$T/app.ini"
cli limit api --concurrency 3 -c "$T/app.ini"
is "$rc" 1 "a producer: pgjobd limit --concurrency exits 1"
like "$err" "permission denied for function set_limits" "... permission denied"
cli limit api -c "$T/app.ini"
is "$rc" 0 "a producer may show its granted queue's limits"

# ---------------------------------------------------------------- pgjobd status

psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'api' FROM generate_series(1, 2);
        SELECT pgjobd.set_limits('empty', concurrency => NULL)" >/dev/null
cli status -c "$conf"
is "$rc" 0 "pgjobd status: exit 0"
unlike "$out" "limits" "no queue with limits: no limits section"
is "$(head -n1 <<<"$out" | tr -s ' ')" "QUEUE QUEUED RUNNING SUCCEEDED FAILED CANCELLED OLDEST_QUEUED PAUSED FAILED_LAST_HOUR DAEMONS" \
	"the table's header is as before"
psql_q "SELECT pgjobd.set_limits('api', concurrency => 4, rate => '10/1s')" >/dev/null
cli status -c "$conf"
is "$(head -n1 <<<"$out" | tr -s ' ')" "QUEUE QUEUED RUNNING SUCCEEDED FAILED CANCELLED OLDEST_QUEUED PAUSED FAILED_LAST_HOUR DAEMONS" \
	"with limits: the table's header is as before"
like "$out" $'\n\nlimits \\(in use of each; pgjobd limit QUEUE\\):\n  QUEUE +CONCURRENCY +GROUP_CONCURRENCY +RATE +GROUP_RATE +THROTTLED\n  api +0 of 4 +- +0 of 10/1s +- +-\n\noldest open claim' \
	"a limits section under the table: one line per queue with limits"
cli status --json -c "$conf"
is "$(psql_q "SELECT concat_ws(' ', e->>'concurrency', e->>'concurrency_used', e->>'rate', e->>'rate_used',
                     coalesce(e->>'throttled', 'null'))
                FROM jsonb_array_elements($(sql_lit "$out")::jsonb) e WHERE e->>'queue' = 'api'")" \
	"4 0 10/1s 0 null" "status --json: each queue's limits, in use and throttled"

done_testing
