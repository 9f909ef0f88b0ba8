-- sql/functions/previous.sql - the overloads kept for daemons of earlier
-- schema versions while they drain (sql/README, "Overloads kept for the
-- previous release"). A daemon sees a new schema version only when its
-- listener reconnects; until then it calls what it was built against. The
-- overloads of claim_batch run the current one; release_claim and
-- register_worker keep the bodies of their time. The daemon of this version
-- calls none of them.

-- claim_batch with p_release_jobs and p_release_groups (ignored since schema
-- version 9): eleven arguments, called by the daemons of versions 6 to 16,
-- lock mode `transaction`.
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[], p_max_attempts integer, p_timeout_ms bigint, p_max_data bigint, p_scan integer, p_orphans boolean, p_release_jobs bigint[], p_release_groups bigint[], p_skip bigint[]) RETURNS TABLE(slot integer, job_id bigint, group_row bigint, group_id text, attempts integer, max_attempts integer, timeout_ms bigint, fence bigint, data text, arg_keys text[], arg_vals text[], schedule text, scheduled_for text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT c.slot, c.job_id, c.group_row, c.group_id, c.attempts, c.max_attempts, c.timeout_ms,
           c.fence, c.data, c.arg_keys, c.arg_vals, c.schedule, c.scheduled_for
      FROM pgjobd.claim_batch(p_queue, p_worker_id, p_workers, p_max_attempts,
                                     p_timeout_ms, p_max_data, p_scan, p_orphans,
                                     p_skip, NULL::bigint) c
     WHERE c.job_id IS NOT NULL
$$;

-- twelve arguments (the lease last), called by the daemons of versions 17 to
-- 24 (their own quick path calls it only when it would not do).
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[], p_max_attempts integer, p_timeout_ms bigint, p_max_data bigint, p_scan integer, p_orphans boolean, p_release_jobs bigint[], p_release_groups bigint[], p_skip bigint[], p_lease_ms bigint) RETURNS TABLE(slot integer, job_id bigint, group_row bigint, group_id text, attempts integer, max_attempts integer, timeout_ms bigint, fence bigint, data text, arg_keys text[], arg_vals text[], schedule text, scheduled_for text)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT c.slot, c.job_id, c.group_row, c.group_id, c.attempts, c.max_attempts, c.timeout_ms,
           c.fence, c.data, c.arg_keys, c.arg_vals, c.schedule, c.scheduled_for
      FROM pgjobd.claim_batch(p_queue, p_worker_id, p_workers, p_max_attempts,
                                     p_timeout_ms, p_max_data, p_scan, p_orphans,
                                     p_skip, p_lease_ms) c
     WHERE c.job_id IS NOT NULL
$$;

-- release_claim without the attempt's history entry: the daemons of
-- versions 6 to 15. The trigger jobs_attempt_ended makes the entry.
CREATE OR REPLACE FUNCTION pgjobd.release_claim(p_id bigint, p_fence bigint, p_started boolean, p_error jsonb, p_max_attempts integer, p_retry_ms bigint) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    a int;
BEGIN
    SELECT j.attempts INTO a FROM pgjobd.jobs j
     WHERE j.id = p_id AND j.fence = p_fence AND j.status = 'running'
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                    WHERE j.id = p_id AND j.fence = p_fence AND j.status = 'running') THEN
            RETURN 'locked';
        END IF;
        RETURN 'gone';
    END IF;
    IF NOT p_started THEN
        UPDATE pgjobd.jobs j SET status = 'queued', attempts = j.attempts - 1,
               worker = NULL, worker_id = NULL, started_at = NULL,
               updated_at = clock_timestamp()
         WHERE j.id = p_id;
    ELSIF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = p_id) THEN
        UPDATE pgjobd.jobs j SET status = 'cancelled', error = p_error,
               finished_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE j.id = p_id;
        DELETE FROM pgjobd.cancel_requests c WHERE c.job_id = p_id;
    ELSIF a >= p_max_attempts THEN
        UPDATE pgjobd.jobs j SET status = 'failed', error = p_error,
               finished_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE j.id = p_id;
    ELSE
        UPDATE pgjobd.jobs j SET status = 'queued', error = p_error,
               run_at = clock_timestamp() + p_retry_ms * interval '1 millisecond',
               updated_at = clock_timestamp()
         WHERE j.id = p_id;
    END IF;
    RETURN 'released';
END
$$;

-- register_worker without the queues served: the daemons of versions 6 to
-- 11 (workers.queues stays NULL).
CREATE OR REPLACE FUNCTION pgjobd.register_worker(p_name text, p_fence_ms integer) RETURNS bigint
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    INSERT INTO pgjobd.workers (name, fence_ms, alive_until)
    VALUES (p_name, p_fence_ms, clock_timestamp() + p_fence_ms * interval '1 millisecond'
                                + pgjobd.fence_margin(p_fence_ms))
    RETURNING id
$$;

-- maintain with three arguments, called by the daemons of versions 9 to 41:
-- the pass of the four-argument one, without ever keeping the pace.
CREATE OR REPLACE FUNCTION pgjobd.maintain(p_queues text[], p_retention_ms bigint[], p_limit integer, OUT locked boolean, OUT expired integer, OUT deleted integer, OUT more boolean) RETURNS record
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT m.locked, m.expired, m.deleted, m.more
      FROM pgjobd.maintain(p_queues, p_retention_ms, p_limit, 0) m
$$;
