-- 033_progress.sql - schema version 33: a running command's progress.
--
-- A command writes lines to the fd PGJOBD_PROGRESS_FD names (a number from
-- 0 to 100, or a JSON value); its daemon keeps the latest and writes it at
-- most every 500 ms, from a session of its own (pgjobd progress), with
-- pgjobd.report_progress() (sql/functions/progress.sql). Where it goes
-- is the job's row (sql/README, "Progress"):
--
--   jobs.progress            the job's latest progress, while it runs (in
--                            lock mode transaction its slot holds the row
--                            FOR KEY SHARE, which this update does not wait
--                            for) and once it has finished (the last value
--                            stays). NULL again when the job is queued once
--                            more (a retry, a give-back, pgjobd.retry()) or
--                            taken over: a new attempt starts with none
--                            (trigger jobs_progress_reset).
--   pgjobd.job_progress      (view) each job's id, queue, status and
--                            progress, for the CLI.
--
-- The outcome statements are unchanged: nothing of this costs a job that
-- reports no progress anything but the trigger's WHEN, which reads one
-- column of the old row.
ALTER TABLE pgjobd.jobs ADD COLUMN progress jsonb;

-- The trigger's function is defined by sql/functions/progress.sql, which
-- `pgjobd migrate` applies after this file in the same transaction; the
-- trigger needs a function to exist first, so this one stands in until then.
CREATE FUNCTION pgjobd.jobs_progress_reset() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ BEGIN RETURN NEW; END $$;

CREATE TRIGGER jobs_progress_reset BEFORE UPDATE OF status, fence ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.progress IS NOT NULL
                       AND (NEW.status = 'queued' OR NEW.fence IS DISTINCT FROM OLD.fence))
    EXECUTE FUNCTION pgjobd.jobs_progress_reset();

CREATE VIEW pgjobd.job_progress WITH (security_invoker = true) AS
    SELECT j.id AS job_id, j.queue, j.status, j.progress
      FROM pgjobd.jobs j;

COMMENT ON VIEW pgjobd.job_progress IS
    'Each job''s progress as its command last reported it, in either lock mode.';

-- my_jobs: the producer's columns, progress among them now (granted by
-- grant_progress()).
CREATE OR REPLACE VIEW pgjobd.my_jobs WITH (security_invoker = true) AS
    SELECT id, queue, group_id, data, priority, run_at, expires_at, max_attempts, timeout,
           dedupe_key, status, attempts, result, error, created_at, started_at, finished_at,
           updated_at, created_by, history, progress
      FROM pgjobd.jobs;
