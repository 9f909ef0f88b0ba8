#!/usr/bin/env bash
# jobs.history and what each attempt cost: a job that fails (exit 3), times out, then
# succeeds has three entries with their reasons, exit codes, signals, stderr tails, CPU
# time, peak RSS and run times; a command that burns ~200 ms of CPU and holds ~50 MB
# reports both in a plausible range (and in the metrics file); the history keeps the
# newest 20 entries, older ones with their stderr cut to 4096 characters; a failed job
# keeps the tail of its stdout in error.stdout; a success keeps its stderr in history;
# the last-line JSON rule makes `result`; a run interrupted by a shutdown and an attempt
# lost with its daemon (kill -9, taken over by another daemon) get entries too.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
prom=$T/pgjobd.prom
write_h_conf() {
	write_conf "$1" <<EOF
$(conf_header metrics_file="$prom" shutdown_grace=300ms)

[queue.flaky]
command = a=\$PGJOBD_ATTEMPT; echo "progress \$a"; echo "stderr of attempt \$a" >&2; case \$a in 1) exit 3;; 2) sleep 30;; esac; echo 'step 1 of 1'; echo '{"done": true, "attempt": 3}'
max_attempts = 3
backoff = 100ms
backoff_max = 100ms
timeout = 1s
kill_grace = 5s

[queue.burn]
command = perl -e '\$x = "a" x 50_000_000; 1 while (times)[0] < 0.2; print length \$x'

[queue.many]
command = head -c 5000 /dev/zero | tr '\\0' e >&2; printf ' #%s' \$PGJOBD_ATTEMPT >&2; exit 1
max_attempts = 25
backoff = 0ms
backoff_max = 0ms

[queue.chatty]
command = i=0; while [ \$i -lt 2000 ]; do echo "line \$i"; i=\$((i+1)); done; exit 1
max_attempts = 1
max_output = 1KiB

[queue.long]
command = sleep 60
concurrency = 1
max_attempts = 5
backoff = 100ms
backoff_max = 100ms
kill_grace = 1s
EOF
}
write_h_conf "$T/a.ini"
write_h_conf "$T/b.ini"
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID

enqueue() { psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ($(sql_lit "$1")) RETURNING id"; }
finished() { job_field "$1" "status IN ('succeeded', 'failed', 'cancelled')" | grep -qx t; }
# h ID N EXPR: EXPR over entry N (0-based; -1 the newest) of job ID's history, as e
h() { psql_q "SELECT $3 FROM pgjobd.jobs j, LATERAL (SELECT j.history -> $2 AS e) x WHERE j.id = $1"; }

fl=$(enqueue flaky)
bu=$(enqueue burn)
ma=$(enqueue many)
ch=$(enqueue chatty)
wait_until 60 "finished $fl && finished $bu && finished $ma && finished $ch"
ok $? "the jobs finish"

# ---------------------------------------------------------------- three attempts
is "$(job_field "$fl" "status || ' ' || attempts || ' ' || jsonb_array_length(history)")" \
	"succeeded 3 3" "exit, timeout, success: three entries"
is "$(job_field "$fl" "(SELECT string_agg(e->>'attempt' || ':' || (e->>'reason'), ' ' ORDER BY n)
                        FROM jsonb_array_elements(history) WITH ORDINALITY AS a(e, n))")" \
	"1:exit 2:timeout 3:none" "oldest first, with their reasons (none for the success)"
is "$(h "$fl" 0 "(e->>'exit_code') || ' ' || (e->'signal')::text || ' ' || (e->>'stderr')")" \
	"3 null stderr of attempt 1" "attempt 1: exit code 3, signal null, its stderr"
is "$(h "$fl" 1 "(e->'exit_code')::text || ' ' || (e->>'signal') || ' ' || (e->>'stderr')")" \
	"null 15 stderr of attempt 2" "attempt 2: timed out, SIGTERM, its stderr"
is "$(h "$fl" 2 "(e->>'exit_code') || ' ' || (e->'signal')::text || ' ' || (e->>'stderr')")" \
	"0 null stderr of attempt 3" "attempt 3: exit 0, and a success keeps its stderr"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs j, jsonb_array_elements(j.history) e
               WHERE j.id = $fl AND e->>'worker' LIKE '%:flaky.0'
                 AND (e->>'started_at')::timestamptz <= (e->>'finished_at')::timestamptz
                 AND (e->>'duration_ms')::int >= 0 AND (e->>'cpu_ms')::int >= 0
                 AND (e->>'max_rss_kb')::int > 0")" 3 \
	"every entry: worker, started_at <= finished_at, duration_ms, cpu_ms, max_rss_kb"
cmp_ok "$(h "$fl" 1 "(e->>'duration_ms')")" -ge 1000 "the timed-out attempt ran for its timeout"
is "$(h "$fl" -1 "(e->>'finished_at')::timestamptz = j.finished_at")" t \
	"the last entry's finished_at is the job's"
is "$(job_field "$fl" "result::text")" '{"done": true, "attempt": 3}' \
	"progress lines, then a JSON object on the last line: that object is the result"

# ---------------------------------------------------------------- rusage
cpu=$(h "$bu" 0 "e->>'cpu_ms'")
rss=$(h "$bu" 0 "e->>'max_rss_kb'")
dur=$(h "$bu" 0 "e->>'duration_ms'")
note "burn: cpu_ms=$cpu max_rss_kb=$rss duration_ms=$dur"
is "$(job_field "$bu" "status || ' ' || (result->>'stdout')")" "succeeded 50000000" "burn ran"
cmp_ok "$cpu" -ge 190 "cpu_ms: at least the 200 ms of CPU the command burnt"
cmp_ok "$cpu" -le $((dur + 200)) "cpu_ms: not more than its run time"
cmp_ok "$rss" -ge 48000 "max_rss_kb: at least the ~50 MB it held"
cmp_ok "$rss" -le 400000 "max_rss_kb: not absurdly more"

# ---------------------------------------------------------------- bounded history
is "$(job_field "$ma" "status || ' ' || attempts || ' ' || jsonb_array_length(history)")" \
	"failed 25 20" "25 attempts: the newest 20 entries are kept"
is "$(h "$ma" 0 "e->>'attempt'") $(h "$ma" -1 "e->>'attempt'")" "6 25" "... attempts 6 to 25"
is "$(h "$ma" -1 "length(e->>'stderr') || ' ' || coalesce(e->>'truncated', 'no')")" "5004 no" \
	"the newest entry keeps all its stderr (max_output)"
is "$(h "$ma" 0 "length(e->>'stderr') || ' ' || (e->>'truncated') || ' ' || right(e->>'stderr', 3)")" \
	"4096 true  #6" "older entries: the last 4096 characters, truncated: true"
is "$(job_field "$ma" "length(error->>'stderr')")" 5004 "error.stderr is the last attempt's, whole"

# ---------------------------------------------------------------- stdout of a failure
is "$(job_field "$ch" "status || ' ' || (error->>'stdout_truncated') || ' ' || (length(error->>'stdout') <= 1024)")" \
	"failed true true" "a failed job keeps the tail of its stdout, bounded by max_output"
like "$(job_field "$ch" "error->>'stdout'")" $'line 1998\nline 1999$' "... its last lines"
is "$(job_field "$ch" "result IS NULL")" t "... and no result"

# ---------------------------------------------------------------- metrics
wait_until 20 "grep -q '^pgjobd_job_max_rss_bytes_count{queue=\"burn\"} 1\$' '$prom'"
ok $? "metrics: the burn job's peak RSS observed once" || diag "$(grep -s rss "$prom")"
m_cpu=$(awk '$1 == "pgjobd_job_cpu_seconds_total{queue=\"burn\"}" { print $2 }' "$prom")
awk -v v="$m_cpu" 'BEGIN { exit !(v >= 0.19) }'
ok $? "metrics: pgjobd_job_cpu_seconds_total{queue=\"burn\"} = $m_cpu >= 0.19"
awk -f "$LIB_DIR/prom-check.awk" "$prom" >"$T/check.out" 2>&1
ok $? "metrics: the file is still valid Prometheus text" || diag "$(cat "$T/check.out")"

# ---------------------------------------------------------------- shutdown, takeover
lo=$(enqueue long)
wait_until 10 "[ \"\$(job_field $lo status)\" = running ]" || fail "the long job started on a"
stop_daemon "$A" 20
is $? 0 "daemon a stops (SIGTERM) and exits 0"
is "$(job_field "$lo" "status || ' ' || attempts || ' ' || jsonb_array_length(history)")" "queued 0 1" \
	"a shutdown gives the attempt back and records the run"
is "$(h "$lo" 0 "(e->>'attempt') || ' ' || (e->>'reason') || ' ' || (e->>'signal') || ' ' || (e->>'cpu_ms' IS NOT NULL)")" \
	"1 shutdown 15 true" "... reason shutdown, attempt 1, SIGTERM, with its usage"

start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "[ \"\$(job_field $lo \"status || attempts\")\" = running1 ]" || fail "the long job runs again on a"
worker_a=$(job_field "$lo" worker)
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "daemon b registered"
kill -KILL "$A"
wait_until 30 "[ \"\$(job_field $lo \"status || attempts\")\" = running2 ]"
ok $? "after kill -9 of daemon a, daemon b takes the job over (attempt 2)"
is "$(h "$lo" 1 "(e->>'attempt') || ' ' || (e->>'reason') || ' ' || (e->>'worker' = '$worker_a') || ' ' || (e->'cpu_ms')::text || ' ' || (e->'exit_code')::text")" \
	"1 lost_lock true null null" "the lost attempt: reason lost_lock, the old worker, nothing known of its end"
is "$(h "$lo" 1 "abs(extract(epoch FROM (e->>'finished_at')::timestamptz - j.started_at)) < 1")" t \
	"... ended at the takeover"
psql_q "SELECT pgjobd.cancel($lo)" >/dev/null
wait_until 20 "finished $lo" || fail "the cancelled long job finished"
is "$(job_field "$lo" "status || ' ' || jsonb_array_length(history) || ' ' || (history->2->>'reason') || ' ' || (history->2->>'attempt')")" \
	"cancelled 3 cancelled 2" "a cancelled run gets its entry"
stop_daemon "$B" 20 >/dev/null
done_testing
