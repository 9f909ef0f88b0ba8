-- 033_progress.sql - schema version 33: a running command's progress.
--
-- A command writes lines to the fd PGJOBD_PROGRESS_FD names (a number from
-- 0 to 100, or a JSON value); its daemon keeps the latest and writes it at
-- most every 500 ms, from a session of its own (pgjobd progress), with
-- pgjobd.report_progress() (sql/functions/progress.sql). Where it goes
-- depends on how the job is held (sql/README, "Progress"):
--
--   jobs.progress            the job's latest progress: while it runs in
--                            lock mode lease (its row is not locked then),
--                            and once it has finished in either mode (the
--                            last value stays). NULL again when the job is
--                            queued once more (a retry, a give-back,
--                            pgjobd.retry()) or taken over: a new attempt
--                            starts with none (trigger jobs_progress_reset).
--   pgjobd.running_progress  (unlogged) a running transaction-mode job's
--                            latest progress under its claim's fence: its
--                            row is locked by its slot's open transaction
--                            until the outcome, so nobody else can update
--                            it. Its daemon copies the last value into the
--                            finished row once the outcome is written, and
--                            deletes this one.
--   pgjobd.job_progress      (view) a job's progress, wherever it is:
--                            running_progress under the job's current fence
--                            while it has a row there, else jobs.progress.
--
-- The outcome statements are unchanged: nothing of this costs a job that
-- reports no progress anything but the trigger's WHEN, which reads one
-- column of the old row.
ALTER TABLE pgjobd.jobs ADD COLUMN progress jsonb;

CREATE UNLOGGED TABLE pgjobd.running_progress (
    job_id     bigint PRIMARY KEY,
    fence      bigint NOT NULL,
    progress   jsonb,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

COMMENT ON TABLE pgjobd.running_progress IS
    'The latest progress of running jobs of lock mode transaction (their rows are locked by '
    'their slots); read it through pgjobd.job_progress.';

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
    SELECT j.id AS job_id, j.queue, j.status,
           CASE WHEN r.job_id IS NOT NULL THEN r.progress ELSE j.progress END AS progress
      FROM pgjobd.jobs j
      LEFT JOIN pgjobd.running_progress r
             ON r.job_id = j.id AND r.fence = j.fence AND j.status <> 'queued';

COMMENT ON VIEW pgjobd.job_progress IS
    'Each job''s progress as its command last reported it, in either lock mode (a running '
    'transaction-mode job''s is in pgjobd.running_progress, not yet in jobs.progress).';

-- my_jobs: the producer's columns, progress among them now (granted by
-- grant_progress()).
CREATE OR REPLACE VIEW pgjobd.my_jobs WITH (security_invoker = true) AS
    SELECT id, queue, group_id, data, priority, run_at, expires_at, max_attempts, timeout,
           dedupe_key, status, attempts, result, error, created_at, started_at, finished_at,
           updated_at, created_by, history, progress
      FROM pgjobd.jobs;
