-- 023_my_jobs.sql - schema version 23: pgjobd.my_jobs, the columns a
-- producer may read.
--
-- A producer may read its own jobs, but not every column of pgjobd.jobs: the
-- daemons' bookkeeping (worker, worker_id, fence, held_until, commit_seq,
-- enqueued_xact, lease_until, lease_ms, schedule, scheduled_for) is for the
-- owner and the worker role only (the worker names the daemon's host and
-- process; the others are claim protocol state). So `SELECT * FROM
-- pgjobd.jobs` as a producer fails with PostgreSQL's "permission denied for
-- table jobs", which names no column: the first thing a new producer tries.
--
-- pgjobd.my_jobs is every column a producer may read, in the table's order.
-- It runs with its reader's rights (security_invoker): row-level security
-- still shows a producer its own jobs only, and a role without the column
-- privileges is refused as it is on the table. So it gives nobody anything
-- the table does not, and SELECT is granted to PUBLIC, which keeps
-- grant_roles() (and setup_roles()) as they are. Nothing else changes: no
-- lock beyond the catalog rows of the new view.
CREATE VIEW pgjobd.my_jobs WITH (security_invoker = true) AS
    SELECT id, queue, group_id, data, priority, run_at, expires_at, max_attempts, timeout,
           dedupe_key, status, attempts, result, error, created_at, started_at, finished_at,
           updated_at, created_by, history
      FROM pgjobd.jobs;

COMMENT ON VIEW pgjobd.my_jobs IS
    'The jobs of pgjobd.jobs its reader may read, with the columns a producer may read: '
    'SELECT * FROM pgjobd.my_jobs works for producers, SELECT * FROM pgjobd.jobs does not.';

GRANT SELECT ON pgjobd.my_jobs TO PUBLIC;
