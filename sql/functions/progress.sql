-- progress.sql - a running command's progress (sql/README, "Progress").

-- report_progress(p_reports): what a daemon's progress session sends, at most
-- every 500 ms: a JSON array of {"id", "fence", "final", "progress"}, one per
-- job whose command reported a value not written yet. Each is written only
-- under the claim it was made for (the fence): a daemon that lost the job
-- writes nothing into the next attempt.
--   final false, lock mode lease (the row has a lease): into jobs.progress
--     while the job runs under that fence and its lease has not run out;
--   final false, lock mode transaction (no lease: the row is locked by its
--     slot, and this never waits for it): into running_progress, a newer
--     fence replacing an older one's row, never the reverse;
--   final true (the job is done and its outcome written): into the
--     finished row, and running_progress's row goes.
-- It never waits for a row of pgjobd.jobs: a row another session has locked
-- at that moment (a lease's extension, an outcome, an operator) is skipped,
-- and its id returned, for the daemon to send again with its next call. So
-- progress never holds up the claims, extensions and outcomes, nor takes
-- part in a deadlock with them.
-- Then rows of running_progress that no daemon will end (it was gone before
-- the final write) are swept: their value goes into the finished row when it
-- has none.
CREATE OR REPLACE FUNCTION pgjobd.report_progress(p_reports jsonb) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RETURN QUERY
    WITH x AS (
        SELECT * FROM jsonb_to_recordset(p_reports)
                   AS x(id bigint, fence bigint, final boolean, progress jsonb)),
    due AS (
        SELECT j.id FROM pgjobd.jobs j JOIN x ON j.id = x.id AND j.fence = x.fence
         WHERE CASE WHEN x.final THEN j.status IN ('succeeded', 'failed', 'cancelled')
                    ELSE j.status = 'running' AND j.lease_until > clock_timestamp() END
           AND j.progress IS DISTINCT FROM x.progress),
    locked AS (
        SELECT j.id, x.progress FROM pgjobd.jobs j JOIN x ON j.id = x.id AND j.fence = x.fence
         WHERE j.id IN (SELECT due.id FROM due)
           AND CASE WHEN x.final THEN j.status IN ('succeeded', 'failed', 'cancelled')
                    ELSE j.status = 'running' AND j.lease_until > clock_timestamp() END
           FOR NO KEY UPDATE OF j SKIP LOCKED),
    written AS (
        UPDATE pgjobd.jobs j SET progress = locked.progress
          FROM locked
         WHERE j.id = locked.id
        RETURNING j.id)
    SELECT due.id FROM due WHERE due.id NOT IN (SELECT written.id FROM written);

    INSERT INTO pgjobd.running_progress AS r (job_id, fence, progress, updated_at)
    SELECT x.id, x.fence, x.progress, clock_timestamp()
      FROM jsonb_to_recordset(p_reports) AS x(id bigint, fence bigint, final boolean,
                                              progress jsonb)
     WHERE NOT x.final
       AND EXISTS (SELECT 1 FROM pgjobd.jobs j
                    WHERE j.id = x.id AND j.fence = x.fence AND j.status = 'running'
                      AND j.lease_until IS NULL)
    ON CONFLICT (job_id) DO UPDATE
       SET fence = excluded.fence, progress = excluded.progress, updated_at = excluded.updated_at
     WHERE r.fence <= excluded.fence;

    DELETE FROM pgjobd.running_progress r
     USING jsonb_to_recordset(p_reports) AS x(id bigint, fence bigint, final boolean)
     WHERE x.final AND r.job_id = x.id AND r.fence <= x.fence;

    WITH gone AS (
        DELETE FROM pgjobd.running_progress r
         WHERE r.updated_at < clock_timestamp() - interval '1 minute'
           AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs j
                            WHERE j.id = r.job_id AND j.fence = r.fence
                              AND j.status = 'running')
        RETURNING r.job_id, r.fence, r.progress)
    UPDATE pgjobd.jobs j SET progress = g.progress
      FROM gone g
     WHERE j.ctid = ANY (ARRAY(
               SELECT k.ctid FROM pgjobd.jobs k JOIN gone h ON k.id = h.job_id AND k.fence = h.fence
                WHERE k.status IN ('succeeded', 'failed', 'cancelled') AND k.progress IS NULL
                  FOR NO KEY UPDATE OF k SKIP LOCKED))
       AND j.id = g.job_id;
END
$$;
REVOKE ALL ON FUNCTION pgjobd.report_progress(jsonb) FROM PUBLIC;

-- jobs_progress_reset(): BEFORE UPDATE OF status, fence on pgjobd.jobs, for a
-- row with progress that is queued again or taken over (sql/033_progress.sql):
-- the next attempt starts with no progress.
CREATE OR REPLACE FUNCTION pgjobd.jobs_progress_reset() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    NEW.progress := NULL;
    RETURN NEW;
END
$$;

-- grant_progress(): the progress session's function and table to the worker
-- role; the column (through my_jobs too) to producers.
CREATE OR REPLACE FUNCTION pgjobd.grant_progress() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT SELECT (progress) ON pgjobd.jobs TO pgjobd_producer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobd.running_progress TO pgjobd_worker;
        GRANT SELECT ON pgjobd.job_progress TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION pgjobd.report_progress(jsonb) TO pgjobd_worker;
    END IF;
END
$$;
