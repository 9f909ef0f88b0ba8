#!/usr/bin/env bash
# Blocked groups cost a claim nothing (pgjobd(8), "Blocked groups"; sql/README, "Blocked
# groups"): with 2,000 groups blocked (1,000 paused, 1,000 held by a failed job), each
# with ready jobs that come first in start order, the daemon's claim statement still
# takes its quick path (claim_batch is not run) and reads about the buffers it reads
# on a queue with none; claim_batch itself (the orphan pass asked for) reads at most
# twice those of a queue with none; no job of a blocked group is claimed.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

conf=$T/c.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.blk]
command = true
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
prep=$(claim_prepared) || bail_out "the claim statement is not available"

G=1000 # paused groups, and as many held
N=12   # measured claims per queue and path; the median of the last 9 counts
# Each blocked group: three ready jobs, an hour old (first in start order). Held groups:
# their first job failed for good under group_on_failure = hold (as a daemon's outcome
# writes it), which holds the group through the trigger.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, run_at)
	SELECT 'blk', g || i, now() - interval '1 hour'
	  FROM generate_series(1, $G) i, (VALUES ('p'), ('h')) v(g), generate_series(1, 3) k
	 ORDER BY k, i" >/dev/null
psql_q "SELECT count(*) FROM (SELECT pgjobd.pause_group('blk', 'p' || i) FROM generate_series(1, $G) i) s" >/dev/null
psql_q "UPDATE pgjobd.jobs SET status = 'running', attempts = 1, started_at = now()
	 WHERE id IN (SELECT min(id) FROM pgjobd.jobs WHERE queue = 'blk' AND group_id LIKE 'h%' GROUP BY group_id);
	UPDATE pgjobd.jobs SET status = 'failed', finished_at = now(),
	       error = '{\"reason\": \"exit\", \"exit_code\": 1, \"group_on_failure\": \"hold\"}'
	 WHERE queue = 'blk' AND status = 'running'" >/dev/null
is "$(psql_q "SELECT string_agg(reason || ' ' || n, ', ' ORDER BY reason) FROM (SELECT reason, count(*) n
	FROM pgjobd.blocked_groups WHERE queue = 'blk' GROUP BY reason) s")" "held $G, paused $G" \
	"$G groups paused and $G held"
is "$(count_jobs "queue = 'blk' AND status = 'queued' AND held_until IS DISTINCT FROM 'infinity'")" 0 \
	"every queued job of them is marked"
# The work, ready for half an hour (after the blocked groups' jobs in start order).
for q in blk none; do
	psql_q "INSERT INTO pgjobd.jobs (queue, run_at)
		SELECT '$q', now() - interval '30 minutes' + i * interval '1 second' FROM generate_series(1, $((4 * N))) i" >/dev/null
done
psql_q "VACUUM ANALYZE pgjobd.jobs" >/dev/null
W=$(psql_q "SELECT pgjobd.register_worker('test:1', 600000)")

# claims QUEUE HOW: N claims for one slot in one warm session, each followed by the
# claimed job's finish; HOW quick: the daemon's statement; batch: claim_batch with the
# orphan pass asked for (the path of a session's first claim and of every poll). Appends
# "buffers B batch_run R got ID" per claim to $T/claims.QUEUE.HOW (R: claim_batch ran).
claims() {
	local i sql="$prep
" call
	if [ "$2" = quick ]; then
		call="EXECUTE qc('$1', $W, '{test}', 5, 0, 1048576, 1000, false, '{}', NULL)"
	else
		call="SELECT * FROM pgjobd.claim_batch('$1', $W, '{test}', 5, 0, 1048576, 1000, true, '{}', NULL::bigint)"
	fi
	for i in $(seq "$N"); do
		sql+="EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) $call;
SELECT 'got ' || coalesce(string_agg(id::text, ','), '') FROM pgjobd.jobs WHERE worker = 'test' AND status = 'running';
UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE worker = 'test' AND status = 'running';
"
	done
	psql -X -qAt -v ON_ERROR_STOP=1 <<<"$sql" >"$T/raw.$1.$2" 2>&1 || diag "$(tail -n 5 "$T/raw.$1.$2")"
	awk '/Buffers: shared/ && !b { n = 0; for (f = 1; f <= NF; f++) { split($f, kv, "=");
			if (kv[1] == "hit" || kv[1] == "read") n += kv[2] } b = n }
		/Function Scan on claim_batch/ { r = ($0 ~ /never executed/) ? "no" : "yes" }
		/^got / { print "buffers " b " batch_run " (r == "" ? "yes" : r) " got " $2; b = ""; r = "" }' \
		"$T/raw.$1.$2" >"$T/claims.$1.$2"
}
median() { # FIELD FILE
	tail -n 9 "$2" | awk -v f="$1" '{ for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' |
		sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}
for how in quick batch; do
	claims blk $how
	claims none $how
done

is "$(awk '$4 != "no"' "$T/claims.blk.quick" | wc -l | tr -d ' ')" 0 \
	"the claim statement took its quick path every time despite $((2 * G)) blocked groups (claim_batch not run)"
is "$(awk '$4 != "yes"' "$T/claims.blk.batch" | wc -l | tr -d ' ')" 0 \
	"(and the plans tell: a direct call of claim_batch shows it run)"
b_blk=$(median buffers "$T/claims.blk.quick")
b_none=$(median buffers "$T/claims.none.quick")
note "claim statement, buffers per claim (median): $((2 * G)) blocked groups $b_blk, none $b_none"
cmp_ok "${b_blk:-999999}" -le $((${b_none:-0} * 2)) "the quick path: at most twice the buffers of a queue with no blocked group"
c_blk=$(median buffers "$T/claims.blk.batch")
c_none=$(median buffers "$T/claims.none.batch")
note "claim_batch (orphan pass asked for), buffers per claim (median): $((2 * G)) blocked groups $c_blk, none $c_none"
cmp_ok "${c_blk:-999999}" -le $((${c_none:-0} * 2)) "claim_batch: at most twice the buffers of a queue with no blocked group"
is "$(awk '$NF == "got" || $NF == ""' "$T/claims.blk.quick" "$T/claims.blk.batch" | wc -l | tr -d ' ')" 0 \
	"every claim took a job"
is "$(count_jobs "queue = 'blk' AND group_id IS NOT NULL AND status NOT IN ('queued', 'failed')")" 0 \
	"no job of a blocked group was claimed"
is "$(count_jobs "queue = 'blk' AND group_id IS NULL AND status = 'succeeded'")" $((2 * N)) \
	"the work behind them was, in start order"

done_testing
