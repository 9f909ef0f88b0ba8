-- sql/functions/lease.sql - lock mode `lease`: a running job held by a lease
-- in its row, not by an open transaction (sql/README, "Lock mode lease";
-- src/lease.c). The claim is claim_batch with a lease (claim.sql).
--
-- extend_leases and finish_leases are PL/pgSQL with one RETURN QUERY each
-- and plan generically: the plan is kept for the session, not made per call.

-- extend_leases(worker_id, ids, fences): every third of the lease, one
-- statement for all of a daemon's leases: lease_until = now + lease_ms for
-- each job still running under its fencing token and not run out, pointed at
-- instance worker_id (0: left). Returns the ids extended: a job not returned
-- lost its lease, and its command is killed.
CREATE OR REPLACE FUNCTION pgjobd.extend_leases(p_worker_id bigint, p_ids bigint[], p_fences bigint[]) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
        WITH u AS (
            UPDATE pgjobd.jobs j
               SET lease_until = clock_timestamp() + j.lease_ms * interval '1 millisecond',
                   worker_id = CASE WHEN p_worker_id > 0 THEN p_worker_id ELSE j.worker_id END
              FROM unnest(p_ids, p_fences) AS x(id, fence)
             WHERE j.id = x.id AND j.fence = x.fence AND j.status = 'running'
               AND j.lease_until > clock_timestamp()
            RETURNING j.id)
        SELECT u.id FROM u;
END
$$;

-- finish_leases(outcomes): the outcomes of lease-held jobs, a JSON array of
-- {id, fence, status, result, error, retry_ms, give_back, entry}, one
-- statement; each written only while the job is still `running` under its
-- token, its lease cleared, its history entry appended, a cancelled job's
-- request deleted. Returns the ids written.
CREATE OR REPLACE FUNCTION pgjobd.finish_leases(p_outcomes jsonb) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
        WITH o AS (SELECT * FROM jsonb_to_recordset(p_outcomes)
                       AS x(id bigint, fence bigint, status text, result jsonb, error jsonb,
                            retry_ms bigint, give_back boolean, entry jsonb)),
             c AS (SELECT clock_timestamp() AS t),
             u AS (UPDATE pgjobd.jobs j
                      SET status = o.status, result = o.result, error = o.error,
                          -- a job given back (never started) keeps its
                          -- place: its run_at
                          run_at = CASE WHEN o.status = 'queued'
                                             AND NOT coalesce(o.give_back, false)
                                        THEN c.t + coalesce(o.retry_ms, 0)
                                                   * interval '1 millisecond'
                                        ELSE j.run_at END,
                          finished_at = CASE WHEN o.status = 'queued' THEN NULL ELSE c.t END,
                          attempts = j.attempts - CASE WHEN o.give_back THEN 1 ELSE 0 END,
                          lease_until = NULL, lease_ms = NULL,
                          updated_at = c.t,
                          history = CASE WHEN o.entry IS NULL
                                              OR jsonb_typeof(o.entry) <> 'object'
                                         THEN j.history
                                         ELSE pgjobd.history_add(j.history,
                                                  jsonb_build_object('attempt', j.attempts,
                                                      'worker', j.worker,
                                                      'started_at', j.started_at,
                                                      'finished_at', c.t) || o.entry) END
                     FROM o, c
                    WHERE j.id = o.id AND j.fence = o.fence AND j.status = 'running'
                    RETURNING j.id, j.status),
             d AS (DELETE FROM pgjobd.cancel_requests r
                    USING u WHERE r.job_id = u.id AND u.status = 'cancelled')
        SELECT u.id FROM u;
END
$$;

-- lease_margin(lease_ms): how long after lease_until a job may be taken
-- over: a fifth of the lease, at least 1 s (the clocks' allowance).
CREATE OR REPLACE FUNCTION pgjobd.lease_margin(p_lease_ms bigint) RETURNS interval
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT greatest(1000, coalesce(p_lease_ms, 0) / 5) * interval '1 millisecond'
$$;

