-- sql/claim.sql - the statement the daemon claims with (src/claim.c sends
-- it; the build embeds it, these leading comment lines left out). Not run by
-- `pgjobd migrate`: it is the daemon's, and changes with the daemon.
--
-- Its parameters are claim_batch's (sql/functions/claim.sql): $1 queue, $2
-- worker_id, $3 workers (one name per idle slot), $4 max_attempts, $5
-- timeout_ms, $6 max_data, $7 scan, $8 orphans, $9 skip, $10 lease_ms (NULL in
-- lock mode `transaction`); its rows are claim_batch's. One statement, in its
-- own transaction: the claim (sql/README, "The claim protocol", step 1).
--
-- Most claims need little of claim_batch: no orphan pass is asked for, the
-- queue is not paused and no grouped job of it could start now (none ready
-- and unmarked, no mark due). Then claim_batch would take the best ready
-- ungrouped jobs, fail those whose data is too large, mark the rest running,
-- keep the waiting row and find nothing else to do, in a dozen statements of
-- PL/pgSQL. This statement reads those conditions once (CTE k, the quick
-- case); in the quick case its own CTEs do that work, and claim_batch is
-- called with no worker (the join's filter does not call it at all);
-- otherwise they do nothing and claim_batch does everything. A queue with
-- a concurrency or a rate (pgjobd.queue_limits) is never the quick case:
-- its claims take turns on its limits row, in claim_batch.
--
-- Why a statement of the daemon's and not a function: a PL/pgSQL function
-- that runs this very statement as its one RETURN QUERY costs a claim more
-- server time than the statement sent as it is (tests/bench/README, "The
-- claim"), and the claim is the statement a busy daemon sends most.
--
-- The quick case's CTE c locks the rows before the others change them, each
-- data-modifying CTE runs once, and the slots are numbered in start order as
-- claim_batch numbers them (a job failed for its size keeps its number, its
-- slot idle for this call). Its races are claim_batch's: a grouped job that
-- becomes ready after k read the queue is the next claim's, as one that
-- commits after claim_batch's grouped scan is; and it takes no grouped job,
-- so group order and exclusivity are claim_batch's alone. The grouped check
-- reads the first ready job in start order rather than EXISTS: a generic plan
-- of EXISTS drops the ORDER BY and LIMIT and scans the table for a match, and
-- a queue with no grouped work has none. The rows c locked are updated by
-- their ctid (= ANY of an array: a TID scan, rather than a join, which a
-- generic plan made a merge join over jobs_pkey, or probes by id, which a plan
-- made while the table was empty made a sequential scan): the sessions that
-- claim plan it once, generically, and never with a sequential scan
-- (claim_sql_generic_plans, claim_sql_index_plans in src/claim.c). A row c
-- locked is not updated by anyone else before u, so its ctid still names it.
-- Both paths answer alike (tests/integration/t_44_claim_paths.sh).
--
-- The comment that opens the statement names it where operators and tests
-- see it: pg_stat_activity shows only the first 1 kB of a query's text.
/* pgjobd claim */
WITH k AS MATERIALIZED (
    SELECT cardinality($3::text[]) > 0 AND NOT $8::boolean
           AND EXISTS (SELECT 1 FROM pgjobd.workers w
                        WHERE w.id = $2::bigint AND w.alive_until > clock_timestamp())
           AND NOT EXISTS (SELECT 1 FROM pgjobd.paused_queues p WHERE p.queue = $1)
           AND NOT EXISTS (SELECT 1 FROM pgjobd.queue_limits l
                            WHERE l.queue = $1
                              AND (l.concurrency IS NOT NULL OR l.rate_n IS NOT NULL))
           AND (SELECT j.id FROM pgjobd.jobs j
                 WHERE j.queue = $1 AND j.status = 'queued' AND j.group_id IS NOT NULL
                   AND j.held_until IS NULL AND j.run_at <= statement_timestamp()
                 ORDER BY j.priority, j.run_at, j.id LIMIT 1) IS NULL
           AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs h
                            WHERE h.queue = $1 AND h.status = 'queued'
                              AND h.held_until <= statement_timestamp()) AS quick),
-- the best ready ungrouped jobs, one probe of jobs_ready_free, locked
c AS (
    SELECT j.id, j.ctid, j.priority, j.run_at,
           (pg_column_size(j.data) > $6::bigint
            OR (pg_column_compression(j.data) IS NOT NULL
                AND octet_length(j.data::text) > 16 * $6::bigint)) AS big
      FROM pgjobd.jobs j
     WHERE (SELECT k.quick FROM k)
       AND j.queue = $1 AND j.status = 'queued' AND j.group_id IS NULL
       AND j.run_at <= statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     ORDER BY j.priority, j.run_at, j.id FOR UPDATE SKIP LOCKED
     LIMIT cardinality($3::text[])),
t AS (
    SELECT c.id, c.ctid, c.big, (row_number() OVER (ORDER BY c.priority, c.run_at, c.id))::int AS slot
      FROM c),
-- slots left idle: wake me (pgjobd.waiting)
wi AS (
    INSERT INTO pgjobd.waiting (queue, pid)
    SELECT $1, pg_backend_pid()
     WHERE (SELECT k.quick FROM k) AND (SELECT count(*) FROM t) < cardinality($3::text[])
    ON CONFLICT DO NOTHING),
wd AS (
    DELETE FROM pgjobd.waiting w
     WHERE (SELECT k.quick FROM k) AND w.queue = $1 AND w.pid = pg_backend_pid()
       AND (SELECT count(*) FROM t) >= cardinality($3::text[])),
-- data larger than max_data fails the job, unloaded (claim_batch's rule)
f AS (
    UPDATE pgjobd.jobs j
       SET status = 'failed', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
           worker = NULL, worker_id = NULL, lease_until = NULL, lease_ms = NULL,
           error = jsonb_build_object('reason', 'data_too_large', 'exit_code', NULL,
                   'signal', NULL, 'stderr', NULL,
                   'message', 'data is larger than the queue''s max_data',
                   'data_bytes', pg_column_size(j.data),
                   'text_bytes', CASE WHEN pg_column_compression(j.data) IS NOT NULL
                                      THEN octet_length(j.data::text) END,
                   'max_data', $6::bigint)
     WHERE j.ctid = ANY (ARRAY(SELECT t.ctid FROM t WHERE t.big))),
u AS (
    UPDATE pgjobd.jobs j
       SET status = 'running', attempts = j.attempts + 1,
           worker = ($3::text[])[(SELECT t.slot FROM t WHERE t.id = j.id)],
           worker_id = $2::bigint, fence = nextval('pgjobd.fence_seq'),
           lease_until = clock_timestamp() + $10::bigint * interval '1 millisecond',
           lease_ms = $10::bigint, started_at = clock_timestamp(),
           updated_at = clock_timestamp(), finished_at = NULL
     WHERE j.ctid = ANY (ARRAY(SELECT t.ctid FROM t WHERE NOT t.big)) AND j.status = 'queued'
    RETURNING (SELECT t.slot FROM t WHERE t.id = j.id) AS slot, j.id, j.group_id, j.attempts,
              j.max_attempts, j.timeout, j.fence, j.data, j.schedule, j.scheduled_for)
-- claim_batch's columns, computed as it computes them
(SELECT u.slot, u.id AS job_id, NULL::bigint AS group_row, u.group_id, u.attempts,
        least(coalesce(u.max_attempts, $4::int), $4::int) AS max_attempts,
        CASE WHEN u.timeout IS NULL THEN NULL
             WHEN $5::bigint > 0
             THEN least($5::bigint, greatest(1, ceil(extract(epoch FROM u.timeout) * 1000)))::bigint
             ELSE greatest(1, ceil(extract(epoch FROM u.timeout) * 1000))::bigint END AS timeout_ms,
        u.fence, u.data::text AS data, a.keys AS arg_keys, a.vals AS arg_vals, u.schedule,
        to_char(u.scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS scheduled_for,
        NULL::bigint AS start_in_ms, NULL::bigint AS start_by_ms, NULL::bigint AS start_at_us,
        NULL::bigint AS late_us, NULL::bigint AS stmt_us, NULL::bigint AS clock_us
   FROM u, LATERAL (
        SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
               coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
          FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object' THEN u.data ELSE '{}' END) e
         WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
  ORDER BY u.slot)
UNION ALL
(SELECT b.slot, b.job_id, b.group_row, b.group_id, b.attempts, b.max_attempts, b.timeout_ms,
        b.fence, b.data, b.arg_keys, b.arg_vals, b.schedule, b.scheduled_for, b.start_in_ms,
        b.start_by_ms, b.start_at_us, b.late_us, b.stmt_us, b.clock_us
   FROM k, LATERAL pgjobd.claim_batch($1, $2::bigint,
                                      CASE WHEN k.quick THEN '{}' ELSE $3::text[] END,
                                      $4::int, $5::bigint, $6::bigint, $7::int, $8::boolean,
                                      $9::bigint[], $10::bigint) b
  WHERE NOT k.quick)
