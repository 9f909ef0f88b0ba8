#!/usr/bin/env bash
# metrics_file: the file is valid Prometheus text (prom-check.awk, itself tested
# here on broken input), it is replaced atomically (no .tmp left), its counters match the
# jobs table after N jobs, some failing, some retried, and after a reconnect; a reload
# that changes metrics_file moves the file; an unwritable path is logged and the daemon
# keeps running; the last values are written at shutdown.
. "$(dirname "$0")/lib.sh"
require_pgjobd

SINK=${NOTIFY_SINK:-$REPO_ROOT/build/tests/notify-sink}
[ -x "$SINK" ] || bail_out "notify-sink not found at $SINK (make build/tests/notify-sink, or set NOTIFY_SINK)"

CHECK=$LIB_DIR/prom-check.awk

# The checker must catch what it claims to catch.
make_tmp
bad_file() { # NAME <<EOF: the checker must reject stdin
	cat >"$T/bad.prom"
	awk -f "$CHECK" "$T/bad.prom" >"$T/bad.out" 2>&1
	isnt $? 0 "prom-check rejects: $1" || diag "$(cat "$T/bad.prom")"
}
bad_file "a sample without TYPE" <<'EOF'
x_total 1
EOF
bad_file "a bad label" <<'EOF'
# HELP x_total x
# TYPE x_total counter
x_total{queue=a} 1
EOF
bad_file "a counter without _total" <<'EOF'
# HELP x x
# TYPE x counter
x 1
EOF
bad_file "buckets that are not cumulative" <<'EOF'
# HELP h h
# TYPE h histogram
h_bucket{le="1"} 2
h_bucket{le="2"} 1
h_bucket{le="+Inf"} 2
h_sum 1
h_count 2
EOF
bad_file "+Inf different from _count" <<'EOF'
# HELP h h
# TYPE h histogram
h_bucket{le="1"} 1
h_bucket{le="+Inf"} 1
h_sum 1
h_count 2
EOF
bad_file "a value that is not a number" <<'EOF'
# HELP g g
# TYPE g gauge
g{a="b"} one
EOF

shared_cluster # the sessions it ends are its own database's
pg_start
mkdir -p "$T/m"
conf=$T/metrics.ini
prom=$T/m/pgjobd.prom
# Jobs start on NOTIFY and retries on their own timer: a slow fallback poll (1 s)
# costs nothing here but spares the CPU the other test files share.
write_conf "$conf" <<EOF
$(conf_header metrics_file="$prom" poll_interval=1s)

[queue.ok]
command = echo ok
concurrency = 3

[queue.bad]
command = exit 3
max_attempts = 2
backoff = 0
backoff_max = 0

[queue.slow]
command = sleep 0.3

[queue.hold]
command = while [ ! -e '$T/go' ]; do sleep 0.05; done
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
# Under systemd (a notify socket), each report tick also counts the queued jobs on the
# listener session, which shows when the ticks happen (see the unwritable file below).
"$SINK" "$T/notify.sock" "$T/notify.txt" 2>"$T/sink.log" &
echo $! >"$T/sink.pid" # killed by the cleanup
disown $!
wait_until 10 "[ -S '$T/notify.sock' ]" || bail_out "notify-sink did not bind $T/notify.sock"
start_daemon d "$conf" NOTIFY_SOCKET="$T/notify.sock"
d=$DAEMON_PID
wait_until 20 "[ -s '$prom' ]"
ok $? "the metrics file is written at start"
awk -f "$CHECK" "$prom" >"$T/check.out"
ok $? "... and is valid Prometheus text" || diag "$(cat "$T/check.out")"

# metric FILE SERIES: the value of the sample `SERIES` (name and labels as written).
metric() {
	awk -v s="$2" 'substr($0, 1, length(s) + 1) == s " " { print $2; f = 1 } END { if (!f) print "none" }' "$1"
}
is "$(metric "$prom" 'pgjobd_jobs_started_total{queue="ok"}')" 0 "queues appear before their first job"

psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'ok' FROM generate_series(1, 20)" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'bad' FROM generate_series(1, 3)" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'slow' FROM generate_series(1, 2)" >/dev/null
wait_until 60 "[ \"\$(count_jobs \"status IN ('succeeded', 'failed')\")\" = 25 ]"
ok $? "25 jobs finished"

# The expected values, from the jobs table.
exp_started() { psql_q "SELECT coalesce(sum(attempts), 0) FROM pgjobd.jobs WHERE queue = '$1'"; }
exp_status() { psql_q "SELECT count(*) FROM pgjobd.jobs WHERE queue = '$1' AND status = '$2'"; }
# counters_match FILE: every counter agrees with the table
counters_match() {
	local q
	for q in ok bad slow; do
		[ "$(metric "$1" "pgjobd_jobs_started_total{queue=\"$q\"}")" = "$(exp_started $q)" ] || return 1
		[ "$(metric "$1" "pgjobd_jobs_succeeded_total{queue=\"$q\"}")" = "$(exp_status $q succeeded)" ] || return 1
		[ "$(metric "$1" "pgjobd_jobs_failed_total{queue=\"$q\"}")" = "$(exp_status $q failed)" ] || return 1
	done
}
wait_until 10 "counters_match '$prom'"
ok $? "started/succeeded/failed by queue match the jobs table" || diag "$(grep -v '^#' "$prom" | grep -v _bucket)"
cp "$prom" "$T/snap.prom"
awk -f "$CHECK" "$T/snap.prom" >"$T/check.out"
ok $? "the file with data is valid Prometheus text" || diag "$(cat "$T/check.out")"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_started_total{queue="ok"}')" 20 "started{ok} = 20"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_started_total{queue="bad"}')" 6 "started{bad} = 6 (3 jobs x 2 attempts)"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_failed_total{queue="bad"}')" 3 "failed{bad} = 3"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_retried_total{queue="bad"}')" 3 "retried{bad} = 3"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_succeeded_total{queue="ok"}')" 20 "succeeded{ok} = 20"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_interrupted_total{queue="ok"}')" 0 "interrupted{ok} = 0"
is "$(metric "$T/snap.prom" 'pgjobd_jobs_running{queue="ok"}')" 0 "running{ok} = 0"
is "$(metric "$T/snap.prom" 'pgjobd_job_duration_seconds_count{queue="bad"}')" 6 "duration count{bad} = runs"
is "$(metric "$T/snap.prom" 'pgjobd_claim_seconds_count{queue="ok"}')" 20 "claim count{ok} = starts"
is "$(metric "$T/snap.prom" 'pgjobd_job_duration_seconds_bucket{queue="slow",le="0.25"}')" 0 \
	"slow: no run under 0.25 s"
is "$(metric "$T/snap.prom" 'pgjobd_job_duration_seconds_bucket{queue="slow",le="2.5"}')" 2 \
	"slow: both runs under 2.5 s"
rt=$(metric "$T/snap.prom" 'pgjobd_db_round_trips_total')
cmp_ok "$rt" -ge 50 "round trips counted ($rt)"
is "$(metric "$T/snap.prom" 'pgjobd_db_reconnects_total')" 0 "no reconnects yet"
ls "$T/m" >"$T/ls.out"
is "$(cat "$T/ls.out")" pgjobd.prom "only the file itself in its directory (no .tmp left)"
perm=$(stat -c %a "$prom")
is "$perm" 644 "the file is readable by node_exporter (mode $perm)"

# A running job shows in the gauge; losing its session interrupts it; reconnects count.
hold=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('hold') RETURNING id")
wait_until 10 "[ \"\$(metric '$prom' 'pgjobd_jobs_running{queue=\"hold\"}')\" = 1 ]"
ok $? "running{hold} = 1 while its command runs"
psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgjobd%'" >/dev/null
wait_until 20 "[ \"\$(metric '$prom' 'pgjobd_jobs_interrupted_total{queue=\"hold\"}')\" = 1 ]"
ok $? "interrupted{hold} = 1 after pg_terminate_backend (lost session)"
rc=$(metric "$prom" pgjobd_db_reconnects_total)
cmp_ok "$rc" -ge 1 "reconnects counted ($rc)"
wait_until 20 "[ \"\$(metric '$prom' 'pgjobd_jobs_started_total{queue=\"hold\"}')\" = 2 ]"
ok $? "the job runs again (started{hold} = 2)"
touch "$T/go"
wait_until 20 "[ \"\$(job_field $hold status)\" = succeeded ]"
ok $? "... and succeeds"

# Reload: a changed metrics_file takes effect; the old file goes.
sed -i "s|^metrics_file = .*|metrics_file = $T/m/other.prom|" "$conf"
kill -HUP "$d"
wait_until 10 "[ -s '$T/m/other.prom' ]"
ok $? "after SIGHUP the new metrics_file is written"
wait_until 5 "[ ! -e '$prom' ]"
ok $? "... and the old one removed"
sed -i "s|^metrics_file = .*|metrics_file = $T/nosuchdir/x.prom|" "$conf"
kill -HUP "$d"
wait_until 10 "grep -q 'cannot write the metrics file' '$T/d.log'"
ok $? "an unwritable metrics_file is logged"
# A tick writes the file, then counts the queued jobs: a count that started after the
# failure was logged belongs to a later tick, whose write failed again.
t_err=$(psql_q "SELECT clock_timestamp()")
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
	AND application_name = 'pgjobd listener' AND query LIKE 'SELECT count(*) FROM (SELECT 1 FROM pgjobd.jobs %'
	AND query_start > '$t_err'\")\" = 1 ]"
ok $? "the daemon has tried to write the file again since"
is "$(grep -c 'cannot write the metrics file' "$T/d.log")" 1 "... which it logged once, not on every write"
pid_alive "$d"
ok $? "... and the daemon keeps running"
sed -i "s|^metrics_file = .*|metrics_file = $prom|" "$conf"
kill -HUP "$d"
wait_until 10 "[ -s '$prom' ]"
ok $? "a good metrics_file again"

# Shutdown writes the last values.
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'ok' FROM generate_series(1, 5)" >/dev/null
wait_until 20 "[ \"\$(count_jobs \"queue = 'ok' AND status = 'succeeded'\")\" = 25 ]"
ok $? "5 more jobs"
wait_until 20 "[ \"\$(count_jobs \"status IN ('queued', 'running')\")\" = 0 ]"
stop_daemon "$d"
is $? 0 "SIGTERM: exit 0"
is "$(metric "$prom" 'pgjobd_jobs_started_total{queue="ok"}')" 25 "the file holds the final count (25)"
counters_match "$prom"
ok $? "final counters match the jobs table"
awk -f "$CHECK" "$prom" >"$T/check.out"
ok $? "the final file is valid Prometheus text" || diag "$(cat "$T/check.out")"

done_testing
