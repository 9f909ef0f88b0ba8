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

CREATE OR REPLACE FUNCTION pgjobd.lease_margin(p_lease_ms bigint) RETURNS interval
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT greatest(1000, coalesce(p_lease_ms, 0) / 5) * interval '1 millisecond'
$$;

