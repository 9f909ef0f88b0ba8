#!/usr/bin/env bash
# pgjobd.retry(id) and `pgjobd retry`: a finished job (failed, cancelled, succeeded) goes
# back to queued with attempts 0, run_at now, error/result/finished_at cleared and its
# history kept, and wakes the daemons (poll_interval is 30 s here); false for a queued, a
# running and a missing job, and for one whose dedupe key an unfinished job holds; an
# expired job loses its past expires_at. A retried grouped job never runs beside another
# job of its group and takes its place in the group's start order. The CLI retries ids
# or a queue's failed jobs, says why per id when it cannot (exit 1), and refuses bad
# usage (exit 2). Only the worker role may call retry(); producers read history.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
cat >"$T/grp.sh" <<EOF
#!/bin/bash
exec 9>>'$T/lock.grp'
if ! flock -n 9; then echo "overlap \$PGJOBD_JOB_ID" >>'$T/grp.log'; exit 1; fi
echo "start \$PGJOBD_JOB_ID" >>'$T/grp.log'
sleep 0.3
echo "end \$PGJOBD_JOB_ID" >>'$T/grp.log'
[ "\$PGJOBD_ARG_fail" = 1 ] && exit 1
exit 0
EOF
chmod +x "$T/grp.sh"
conf=$T/retry.ini
write_conf "$conf" <<EOF
$(conf_header poll_interval=30s)

[queue.fail]
command = echo "failing \$PGJOBD_ATTEMPT" >&2; exit 1
max_attempts = 2
backoff = 100ms
backoff_max = 100ms

[queue.ok]
command = echo "{\"attempt\": \$PGJOBD_ATTEMPT}"

[queue.slow]
command = sleep 60
kill_grace = 1s

[queue.grp]
command = exec '$T/grp.sh'
concurrency = 2
max_attempts = 1
EOF
cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"
wait_until 10 "workers_alive 1" || bail_out "the daemon did not start"
wait_until 10 "queues_waiting fail ok slow grp" || bail_out "the daemon's claimers did not register as waiting"

enqueue() { psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data, dedupe_key, expires_at)
                    VALUES ($(sql_lit "$1"), ${2:-NULL}, coalesce(${3:-NULL}::jsonb, '{}'), ${4:-NULL},
                            ${5:-NULL}) RETURNING id"; }
status_is() { [ "$(job_field "$1" status)" = "$2" ]; }
retry_sql() { psql_q "SELECT pgjobd.retry($1)"; }

# ---------------------------------------------------------------- SQL
f=$(enqueue fail)
o=$(enqueue ok)
wait_until 20 "status_is $f failed && status_is $o succeeded" || fail "the first jobs finish"
is "$(job_field "$f" "attempts || ' ' || jsonb_array_length(history)")" "2 2" "failed after 2 attempts"

psql_q "SELECT pgjobd.pause('fail')" >/dev/null
is "$(retry_sql "$f")" t "retry(failed job) is true"
is "$(job_field "$f" "status || ' ' || attempts || ' ' || (run_at <= now()) || ' ' || (error IS NULL)
                      || ' ' || (result IS NULL) || ' ' || (finished_at IS NULL) || ' ' || (worker IS NULL)
                      || ' ' || jsonb_array_length(history)")" \
	"queued 0 true true true true true 2" \
	"queued, attempts 0, run_at now, error, result, finished_at and worker cleared, history kept"
is "$(retry_sql "$f")" f "retry(queued job) is false"
psql_q "SELECT pgjobd.resume('fail')" >/dev/null
wait_until 20 "status_is $f failed" || fail "the retried job ran again"
is "$(job_field "$f" "attempts || ' ' || jsonb_array_length(history)
                      || ' ' || (SELECT string_agg(e->>'attempt', ',') FROM jsonb_array_elements(history) e)")" \
	"2 4 1,2,1,2" "it ran its attempts again; the history holds all four"

t0=$(now_ms)
is "$(retry_sql "$o")" t "retry(succeeded job) is true"
wait_until 10 "[ \"\$(job_field $o \"status || attempts\")\" = succeeded1 ]"
ok $? "the retried success runs again"
took=$(($(now_ms) - t0))
cmp_ok "$took" -lt 10000 "... woken by the retry, not by the 30 s poll (${took} ms)"
is "$(job_field "$o" "jsonb_array_length(history) || ' ' || (result->>'attempt')")" "2 1" \
	"... with a new result and both runs in its history"

s=$(enqueue slow)
wait_until 10 "status_is $s running" || fail "the slow job runs"
is "$(retry_sql "$s")" f "retry(running job) is false"
is "$(retry_sql 999999)" f "retry(missing job) is false"
psql_q "SELECT pgjobd.cancel($s)" >/dev/null
wait_until 20 "status_is $s cancelled" || fail "the slow job is cancelled"
psql_q "SELECT pgjobd.pause('slow')" >/dev/null
is "$(retry_sql "$s")" t "retry(cancelled job) is true"
is "$(job_field "$s" status)" queued "... queued again"
psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $s" >/dev/null

# dedupe: the key of a retried job must not be held by an unfinished job
psql_q "SELECT pgjobd.pause('ok')" >/dev/null
d1=$(psql_q "SELECT id FROM pgjobd.jobs WHERE id = $o")
psql_q "UPDATE pgjobd.jobs SET dedupe_key = 'k1' WHERE id = $d1" >/dev/null
d2=$(enqueue ok NULL NULL "'k1'")
is "$(retry_sql "$d1")" f "retry is false while another unfinished job holds the dedupe key"
cli retry "$d1" -c "$conf"
is "$rc" 1 "pgjobd retry: exit 1"
is "$err" "pgjobd: retry: job $d1 not retried: job $d2 of queue ok has the same dedupe key and is not finished" \
	"... saying which job holds the key"
psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $d2" >/dev/null

# expired: the past expires_at goes with the retry
e=$(enqueue ok NULL NULL NULL "now() - interval '1 minute'")
wait_until 20 "status_is $e cancelled" || fail "the expired job is cancelled"
is "$(retry_sql "$e")" t "retry(expired job) is true"
is "$(job_field "$e" "status || ' ' || (expires_at IS NULL)")" "queued true" "... its past expires_at is cleared"
psql_q "SELECT pgjobd.resume('ok')" >/dev/null
wait_until 20 "status_is $e succeeded"
ok $? "... and it runs"

# ---------------------------------------------------------------- group order
g1=$(enqueue grp "'x'" "'{\"fail\": 1}'")
wait_until 20 "status_is $g1 failed" || fail "the first grouped job failed"
psql_q "SELECT pgjobd.pause('grp')" >/dev/null
g2=$(enqueue grp "'x'")
is "$(retry_sql "$g1")" t "retry of a failed grouped job"
g3=$(enqueue grp "'x'")
psql_q "SELECT pgjobd.resume('grp')" >/dev/null
wait_until 30 "status_is $g1 failed && status_is $g2 succeeded && status_is $g3 succeeded" ||
	fail "the group's jobs finish"
order=$(awk '$1 == "start" { printf "%s%s", sep, $2; sep = " " }' "$T/grp.log")
if [ "$(psql_q "SELECT count(*) FROM pg_attribute WHERE attrelid = 'pgjobd.jobs'::regclass
                 AND attname = 'commit_seq' AND NOT attisdropped")" = 1 ]; then
	# The group's start order is its commit order: the retry comes after g2.
	is "$order" "$g1 $g2 $g1 $g3" "the retried job starts after the jobs visible before its retry"
else
	# The group's start order is id order among its unfinished jobs.
	is "$order" "$g1 $g1 $g2 $g3" "the retried job takes its id's place in the group"
fi
unlike "$(cat "$T/grp.log")" overlap "never two jobs of the group at once"

# ---------------------------------------------------------------- CLI
psql_q "SELECT pgjobd.pause('fail')" >/dev/null
f2=$(enqueue fail)
f3=$(enqueue fail)
psql_q "SELECT pgjobd.resume('fail')" >/dev/null
wait_until 30 "status_is $f2 failed && status_is $f3 failed" || fail "two more failures"
cli retry "$f2" "$f3" -c "$conf"
is "$rc:$out" "0:retried job $f2
retried job $f3" "pgjobd retry ID ID: both, exit 0"
wait_until 30 "status_is $f2 failed && status_is $f3 failed" || fail "they fail again"
cli -c "$conf" retry "$f2" 999999
is "$rc" 1 "a missing id: exit 1"
is "$out" "retried job $f2" "... the others are retried"
is "$err" "pgjobd: retry: job 999999 does not exist" "... and it says which id and why"
wait_until 30 "status_is $f2 failed" || fail "f2 fails again"
psql_q "SELECT pgjobd.pause('slow')" >/dev/null
q=$(enqueue slow)
cli retry "$q" -c "$conf"
is "$rc:$err" "1:pgjobd: retry: job $q is queued: only a finished job can be retried" "a queued job: exit 1, why"

t0=$(now_ms)
cli retry --queue fail --failed --since 1h -c "$conf"
is "$rc" 0 "retry --queue fail --failed --since 1h: exit 0"
is "$out" "retried job $f
retried job $f2
retried job $f3
retried 3 failed jobs of queue fail" "... every failed job of the queue, oldest first"
wait_until 30 "[ \"\$(count_jobs \"queue = 'fail' AND status = 'failed'\")\" = 3 ]" || fail "they fail again"
# Three retries due within a few ms of each other: each wakes the queue at
# its time, not only the first (the others would wait for the 30 s poll).
took=$(($(now_ms) - t0))
cmp_ok "$took" -lt 10000 "... each second attempt starts at its backoff, not at the next poll (${took} ms)"
sleep 0.2
cli retry --queue fail --failed --since 100ms -c "$conf"
is "$rc:$out" "0:no failed jobs in queue fail within 100ms" "--since: only recent failures"
cli retry --queue ok --failed -c "$conf"
is "$rc:$out" "0:no failed jobs in queue ok" "a queue without failures"

usage() { # ERE ARGS...: exit 2, nothing on stdout, one line naming the problem + a pointer
	local re=$1
	shift
	cli "$@"
	ok "$([ "$rc" = 2 ] && [ -z "$out" ] && [[ ${err%%$'\n'*} =~ $re ]] &&
		[ "$(printf '%s\n' "$err" | wc -l)" = 2 ] && [[ $err =~ "pgjobd retry --help" ]]
	echo $?)" "usage error: pgjobd $*" || diag "rc=$rc" "out=$out" "err=$err"
}
usage "missing ID" retry -c "$conf"
usage "bad ID 'abc'" retry abc -c "$conf"
usage "bad ID '0'" retry 0 -c "$conf"
usage "go together" retry --failed -c "$conf"
usage "go together" retry --queue fail -c "$conf"
usage "not both" retry 5 --queue fail --failed -c "$conf"
usage "--since goes with" retry 5 --since 1h -c "$conf"
usage "bad --since '1x'" retry --queue fail --failed --since 1x -c "$conf"
usage "unknown option '--json'" retry 5 --json -c "$conf"
usage "option --config given twice" -c "$conf" retry 5 -c "$conf"
cli retry --help
ok "$([ "$rc" = 0 ] && [[ $out =~ ^usage:\ pgjobd\ retry\ ID ]]; echo $?)" "retry --help: its usage, exit 0"

# ---------------------------------------------------------------- roles
"$PGJOBD" migrate --grant -c "$conf" >"$T/grant.log" 2>&1 || fail "migrate --grant"
is "$(psql_q "SELECT has_function_privilege('pgjobd_worker', 'pgjobd.retry(bigint)', 'EXECUTE'),
                     has_function_privilege('pgjobd_producer', 'pgjobd.retry(bigint)', 'EXECUTE'),
                     has_column_privilege('pgjobd_producer', 'pgjobd.jobs', 'history', 'SELECT')")" \
	"t|f|t" "retry() is the worker role's, not a producer's; producers read history"
psql_q "CREATE ROLE stranger" >/dev/null
is "$(psql_q "SELECT has_function_privilege('stranger', 'pgjobd.retry(bigint)', 'EXECUTE')")" f \
	"a role without pgjobd rights cannot call retry()"
psql_q "CREATE ROLE app LOGIN IN ROLE pgjobd_producer" >/dev/null
psql_q "SELECT pgjobd.grant_queue('app', 'ok')" >/dev/null
mine=$(PGUSER=app psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('ok') RETURNING id")
wait_until 20 "status_is $mine succeeded" || fail "the producer's job ran"
is "$(PGUSER=app psql_q "SELECT jsonb_array_length(history) FROM pgjobd.jobs WHERE id = $mine")" 1 \
	"a producer reads the history of its own job"
PGUSER=app psql_q "SELECT pgjobd.retry($mine)" >/dev/null 2>"$T/perm.txt"
like "$(cat "$T/perm.txt")" "permission denied for function retry" "... but may not retry it"

stop_daemon "$(cat "$T/d.pid")" >/dev/null
done_testing
