-- 019_plans.sql - schema version 19: the hot statements plan once per session.
--
-- Three functions run for nearly every job, and each planned some of its
-- statements anew at every call:
--   claim_batch (twelve arguments): the RETURN QUERY that marks the picked
--     jobs running, and the data_too_large UPDATE before it. Both read the
--     picked ids as an array (unnest(ids, gids), id = ANY(ids)); a custom
--     plan knows the array's length, a generic one guesses, so the custom
--     plan always looks cheaper and PL/pgSQL never settles on the generic
--     one. Measured (pg_stat_statements with track_planning, one job per
--     claim): 0.19 ms of planning in a claim that took 0.50 ms.
--   extend_leases and finish_leases: SQL functions, which PostgreSQL before
--     version 18 plans anew at every call (their plans live only as long as
--     the calling statement). finish_leases planned its statement in 0.18 ms
--     of a 0.59 ms call.
-- So claim_batch keeps its body and gets plan_cache_mode =
-- force_generic_plan, and the two lease functions are the same statements
-- in PL/pgSQL, which keeps plans for the session, with the same setting.
-- A function's setting holds while it runs, so the functions and triggers
-- claim_batch runs plan generically too. Its other statements had
-- settled on generic plans already (pg_stat_statements counted 6 plans in
-- over 1,000 calls), and make bench's claims over a million queued jobs
-- and over 20,000 held groups took no longer. Nothing they do changes:
-- same arguments, results, locks, grants (CREATE OR REPLACE keeps them).

ALTER FUNCTION pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                  bigint[], bigint[], bigint[], bigint)
      SET plan_cache_mode = force_generic_plan;

-- 017_lease.sql's extend_leases, its statement unchanged.
CREATE OR REPLACE FUNCTION pgjobd.extend_leases(p_worker_id bigint, p_ids bigint[],
                                                p_fences bigint[])
RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
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

-- 017_lease.sql's finish_leases, its statement unchanged.
CREATE OR REPLACE FUNCTION pgjobd.finish_leases(p_outcomes jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
        WITH o AS (SELECT * FROM jsonb_to_recordset(p_outcomes)
                       AS x(id bigint, fence bigint, status text, result jsonb, error jsonb,
                            retry_ms bigint, give_back boolean, entry jsonb)),
             c AS (SELECT clock_timestamp() AS t),
             u AS (UPDATE pgjobd.jobs j
                      SET status = o.status, result = o.result, error = o.error,
                          run_at = CASE WHEN o.status = 'queued'
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
