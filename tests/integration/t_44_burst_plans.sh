#!/usr/bin/env bash
# A daemon that starts beside an empty, never analysed pgjobd.jobs plans its claim
# statements then (generic plans, made once per session), for a table of a few rows. A
# burst of jobs arriving afterwards must still be claimed through indexes: a plan that
# scans the whole table in every claim turns a drain of N jobs into N * N / batch rows
# read (it did, until an autovacuum's ANALYZE happened to replan the statements).
# Autovacuum is off for the table here, so nothing replans them: every sequential scan
# of pgjobd.jobs during the drains is counted (pg_stat_user_tables.seq_scan). The test's
# own sessions use indexes only (PGOPTIONS), and the daemon's maintenance reads through
# indexes too, so the count must stay where it was.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/burst.ini
write_conf "$conf" <<EOF
$(conf_header poll_interval=30s log_level=info)

[queue.btx]
command = true
concurrency = 4

[queue.blease]
command = true
concurrency = 4
lock_mode = lease
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate"
export PGOPTIONS="-c enable_seqscan=off"
psql_q "ALTER TABLE pgjobd.jobs SET (autovacuum_enabled = false)"
psql_q "ALTER TABLE pgjobd.groups SET (autovacuum_enabled = false)"
is "$(psql_q "SELECT coalesce(last_analyze, last_autoanalyze) IS NULL FROM pg_stat_user_tables
	WHERE relid = 'pgjobd.jobs'::regclass")" t "pgjobd.jobs was never analysed"

# The daemon plans as it would: not with the test's PGOPTIONS.
start_daemon burst "$conf" PGOPTIONS=
ok_cmd "both queues wait for work (their claims planned on the empty table)" \
	wait_until 30 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue IN ('btx', 'blease')\")\" = 2 ]"

# seq_scans: sequential scans of pgjobd.jobs so far, once every backend has reported
# its counts (a backend reports them at most once a second, and when it goes idle).
seq_scans() {
	sleep 2
	psql_q "SELECT seq_scan FROM pg_stat_user_tables WHERE relid = 'pgjobd.jobs'::regclass"
}

s0=$(seq_scans)
for q in btx blease; do
	psql_q "INSERT INTO pgjobd.jobs (queue) SELECT '$q' FROM generate_series(1, 2000)"
	psql_q "INSERT INTO pgjobd.jobs (queue, group_id) SELECT '$q', 'g' || (i % 30) FROM generate_series(1, 2000) i"
done
for q in btx blease; do
	ok_cmd "queue $q: 4,000 jobs of a burst drained" wait_until 180 "[ \"\$(unfinished $q)\" = f ]"
	is "$(count_jobs "queue = '$q' AND status = 'succeeded'")" 4000 "queue $q: all 4,000 succeeded"
done
s1=$(seq_scans)
is "$((s1 - s0))" 0 "no sequential scan of pgjobd.jobs while the daemon claimed the burst"
is "$(psql_q "SELECT coalesce(last_analyze, last_autoanalyze) IS NULL FROM pg_stat_user_tables
	WHERE relid = 'pgjobd.jobs'::regclass")" t "and nothing analysed the table meanwhile"

stop_daemon "$DAEMON_PID" 30
ok $? "the daemon stops"
done_testing
