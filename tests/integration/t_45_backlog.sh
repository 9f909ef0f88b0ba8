#!/usr/bin/env bash
# The claim must not slow down as the backlog grows: with 300,000 queued
# jobs in 30,000 groups, one claim touches about as many buffers as with
# 1,000 queued, and its statements use index scans (no sort over the backlog).
# Buffers, not time: the count is deterministic on a quiet test cluster. 300
# times the small backlog is enough to tell a scan from an index lookup; the
# figures for 1,000,000 jobs are `make bench`'s (figure 4), which times them.
# (This file inserted 2,000,000 rows until then: the suite's largest CPU load.)
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/backlog.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.small]
command = true
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate"

psql_q "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'small', 'g' || (i % 100) FROM generate_series(1, 1000) i"
psql_q "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'big', 'g' || (i % 30000) FROM generate_series(1, 300000) i"
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'bigfree' FROM generate_series(1, 300000) i"
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'smallfree' FROM generate_series(1, 1000) i"
psql_q "VACUUM ANALYZE pgjobd.jobs" >/dev/null
psql_q "VACUUM ANALYZE pgjobd.groups" >/dev/null
is "$(count_jobs "queue = 'big' AND status = 'queued'")" 300000 "300,000 queued jobs in the big queue"
is "$(psql_q "SELECT count(DISTINCT group_id) FROM pgjobd.jobs WHERE queue = 'big'")" 30000 "in 30,000 groups"

# The ready scan the claim's cursor runs: an index scan in start order (jobs held back
# by a head waiting out a backoff are left out, as the claim leaves them out).
p=$(psql_q "EXPLAIN SELECT j.id, j.group_id FROM pgjobd.jobs j
	WHERE j.queue = 'big' AND j.status = 'queued' AND j.group_id IS NOT NULL
	AND j.held_until IS NULL AND j.run_at <= now()
	ORDER BY j.priority, j.run_at, j.id LIMIT 1001")
like "$p" "Index Scan using jobs_ready_grouped" "ready scan uses the jobs_ready_grouped index"
unlike "$p" "Sort|Seq Scan" "ready scan neither sorts nor scans the table"
# The group head probe: a group's unfinished jobs in start order (commit order: the key
# coalesce(commit_seq, id), see sql/015_commit_order.sql). A group is known by
# coalesce(group_key, group_id) (sql/020_isolation.sql).
p=$(psql_q "EXPLAIN SELECT j.id FROM pgjobd.jobs j WHERE j.queue = 'big'
	AND coalesce(j.group_key, j.group_id) = 'g7'
	AND j.status IN ('queued', 'running') ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1")
like "$p" "Index (Only )?Scan using jobs_group_head" "group head probe uses jobs_group_head"
unlike "$p" "Sort" "group head probe does not sort"

# Shared buffers touched by one claim (claim_batch, as the daemon's claimer
# calls it for one slot), measured in one warm session (a new session's first
# call compiles the function and reads the catalogs), each claim followed by
# the job's finish.
# The claims are made for a registered daemon instance that stays alive for the test.
W=$(psql_q "SELECT pgjobd.register_worker('test:1', 600000)")
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; } # of numbers, a line each
claim_buffers() { # QUEUE [SQL] -> median buffers (hit + read) of the last 9 claims
	local round="EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM pgjobd.claim_batch('$1', $W, '{test}', 5, 0, 1048576, 1000, false, '{}', '{}', '{}');
UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE worker = 'test' AND status = 'running';
" sql="" i
	# With SQL: 12 claims first, whose plans the session caches, then SQL.
	[ -n "${2:-}" ] && sql="$(for i in $(seq 12); do printf '%s' "$round"; done)$2;
"
	for i in $(seq 12); do
		sql+=$round
	done
	psql -X -qAt -v ON_ERROR_STOP=1 -c "$sql" >"$T/buffers.$1" 2>&1 ||
		psql -X -qAt -v ON_ERROR_STOP=1 >"$T/buffers.$1" 2>&1 <<<"$sql"
	grep 'Buffers: shared' "$T/buffers.$1" | tail -n 9 |
		sed 's/.*Buffers: shared//' |
		awk '{n = 0; for (f = 1; f <= NF; f++) { split($f, kv, "="); if (kv[1] == "hit" || kv[1] == "read") n += kv[2] } print n}' |
		median
}
small=$(claim_buffers small)
big=$(claim_buffers big)
bigfree=$(claim_buffers bigfree)
note "buffers per claim: 1,000 queued in 100 groups: $small; 300,000 in 30,000 groups: $big; 300,000 ungrouped: $bigfree"
cmp_ok "${small:-0}" -gt 0 "the claim's buffers are measured"
cmp_ok "${big:-999999}" -le $((small * 2 + 20)) "grouped: a claim with 300,000 queued costs about what it costs with 1,000"
cmp_ok "${bigfree:-999999}" -le $((small * 2 + 20)) "ungrouped: a claim with 300,000 queued costs about what it costs with 1,000"

# The same for the statement the daemon claims with (src/claim.c), whose quick
# path claims ungrouped jobs without claim_batch and whose full path calls it: the
# buffers the claim touches in pgjobd's tables and indexes, counted by the
# transaction's statistics (pg_stat_get_xact_blocks_fetched) around the claim,
# since EXPLAIN does not add up a statement's CTEs. Planned as the daemon's
# sessions plan it: generically.
prep=$(claim_prepared) || bail_out "the claim statement is not available"
# stmt_buffers QUEUE [MAX_DATA BEFORE] -> median buffers of the last 9 of 12 claims,
# each after BEFORE (SQL, not counted).
stmt_buffers() {
	local fetched="(SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class c
		WHERE c.relnamespace = 'pgjobd'::regnamespace)" sql i
	sql="$prep
"
	for i in $(seq 12); do
		sql+="${3:-}
BEGIN;
SELECT $fetched AS n \\gset b_
EXECUTE qc('$1', $W, '{test}', 5, 0, ${2:-1048576}, 1000, false, '{}', NULL) \\g /dev/null
SELECT $fetched - :b_n;
COMMIT;
UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE worker = 'test' AND status = 'running';
"
	done
	psql -X -qAt -v ON_ERROR_STOP=1 >"$T/stmt.$1" 2>&1 <<<"$sql"
	tail -n 9 "$T/stmt.$1" | median
}
s_small=$(stmt_buffers small)
s_big=$(stmt_buffers big)
s_smallfree=$(stmt_buffers smallfree)
s_bigfree=$(stmt_buffers bigfree)
note "the claim statement's buffers: 1,000 queued in 100 groups: $s_small; 300,000 in 30,000 groups: $s_big; 1,000 ungrouped: $s_smallfree; 300,000 ungrouped: $s_bigfree"
cmp_ok "${s_smallfree:-0}" -gt 0 "the claim statement's buffers are measured"
cmp_ok "${s_big:-999999}" -le $((s_small * 2 + 20)) "the claim statement, grouped: 300,000 queued cost about what 1,000 cost"
cmp_ok "${s_bigfree:-999999}" -le $((s_smallfree * 2 + 20)) "the claim statement, ungrouped: 300,000 queued cost about what 1,000 cost"
# A claim that fails a job for its size finds it by its id, whatever the id: here
# the newest job, the last of 300,000 in jobs_pkey.
s_large=$(stmt_buffers bigfree 100 "INSERT INTO pgjobd.jobs (queue, priority, data)
	VALUES ('bigfree', -1, jsonb_build_object('x', repeat('x', 200)));")
note "the claim statement's buffers when it fails the newest of 300,000 ungrouped jobs for its size: $s_large"
cmp_ok "${s_large:-999999}" -le $((s_smallfree * 2 + 20)) "the claim statement, a job too large: about what any claim costs"
is "$(count_jobs "queue = 'bigfree' AND error->>'reason' = 'data_too_large'")" 12 "... and each of those claims failed its job"

# Group rows are made by claims (schema 5), so pgjobd.groups may be analyzed
# while nearly empty (as here) and then grow by a row per claim until
# autovacuum analyzes it again. A session's cached plans must not scan it
# sequentially meanwhile: 12 claims cache them, 100,000 group rows arrive
# (no new statistics: inserts do not invalidate plans), then 12 more claims.
psql_q "ALTER TABLE pgjobd.groups SET (autovacuum_enabled = false)" >/dev/null # no analyze midway
is "$(psql_q "SELECT reltuples::int <= 100 FROM pg_class WHERE oid = 'pgjobd.groups'::regclass")" t \
	"pgjobd.groups was analyzed nearly empty"
grown=$(claim_buffers big "INSERT INTO pgjobd.groups (queue, group_id)
	SELECT 'filler', 'f' || i FROM generate_series(1, 100000) i")
note "buffers per claim after pgjobd.groups grew by 100,000 rows: $grown"
cmp_ok "${grown:-999999}" -le $((small * 2 + 20)) "a claim costs the same after pgjobd.groups grew under cached plans"
is "$(count_jobs "worker = 'test' AND status = 'succeeded'")" 108 "each measured claim claimed a job"
is "$(count_jobs "status = 'running'")" 0 "and finished it"

done_testing
