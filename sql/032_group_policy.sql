-- 032_group_policy.sql - schema version 32: what a group does after a job
-- failed for good, and groups paused one by one.
--
--   pgjobd.group_blocks  one row per reason a group may start nothing:
--                  (queue, group_id, reason, since, job, blocked_by), group_id
--                  the group's identity (coalesce(group_key, group_id), as
--                  in pgjobd.groups), reason `held` (job: the job whose
--                  failure held it; a queue with group_on_failure = hold) or
--                  `paused` (pause_group). Rows of the owner and the worker
--                  role only; producers read pgjobd.blocked_groups.
--
--   the marks      every queued job of a blocked group carries held_until =
--                  'infinity', the mark of held groups (version 7) that never
--                  falls due: claims leave it out of their scans as they do a
--                  backoff's mark, and try_group_head starts no head that
--                  carries it. Set by whatever blocks the group (the trigger
--                  jobs_failed_hold, pause_group), by jobs_commit_order for a
--                  job that enters a blocked group (an INSERT, a retry, a
--                  move) and by jobs_backed_off for one that comes back to
--                  `queued` in it (a retry, a give-back); kept by jobs_unheld
--                  and jobs_head_changed; cleared when the group's last block
--                  goes (release_group, resume_group, the trigger
--                  jobs_failed_undone for the held job's retry).
--
--   the policy     the daemon writes the queue's group_on_failure into the
--                  failed attempt's error ("group_on_failure": "hold"); the
--                  trigger jobs_failed_hold holds the group when the job
--                  ends `failed` with it. The database reads no INI file;
--                  the error says why the group stopped.
--
--   pgjobd.blocked_groups  the groups that cannot start now: held, paused,
--                  or retry (the group's head waits out a retry's backoff).
--
-- Functions (sql/functions/groups.sql): pause_group, resume_group,
-- release_group, group_blocked, group_mark, group_mark_job, group_unmark, group_name,
-- group_producer, sees_group, and the trigger functions; restated there:
-- jobs_commit_order, jobs_backed_off, jobs_head_changed, jobs_unheld; in
-- claim.sql: claim_batch and try_group_head (a marked head never starts).

CREATE TABLE pgjobd.group_blocks (
    queue text NOT NULL,
    group_id text NOT NULL,
    reason text NOT NULL CHECK (reason IN ('held', 'paused')),
    since timestamptz NOT NULL DEFAULT clock_timestamp(),
    job bigint,
    blocked_by text NOT NULL DEFAULT current_user,
    PRIMARY KEY (queue, group_id, reason)
);

-- Stand-ins: the function files, applied after this migration in the same
-- transaction, define them; the view and the triggers need them to exist.
CREATE FUNCTION pgjobd.group_name(p_group text) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT p_group $$;

CREATE FUNCTION pgjobd.group_producer(p_group text) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT NULL::text $$;

CREATE FUNCTION pgjobd.sees_group(p_group text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT false $$;

CREATE FUNCTION pgjobd.jobs_failed_hold() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ BEGIN RETURN NULL; END $$;

CREATE FUNCTION pgjobd.jobs_failed_undone() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ BEGIN RETURN NULL; END $$;

-- A grouped job's attempt ends it `failed` under a queue whose policy is
-- hold: its group stops.
CREATE TRIGGER jobs_failed_hold AFTER UPDATE OF status ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status = 'failed'
                       AND NEW.group_id IS NOT NULL
                       AND NEW.error ->> 'group_on_failure' = 'hold')
    EXECUTE FUNCTION pgjobd.jobs_failed_hold();

-- A failed grouped job leaves `failed` (pgjobd.retry, an operator's
-- UPDATE): the hold it made goes.
CREATE TRIGGER jobs_failed_undone AFTER UPDATE OF status ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.status = 'failed' AND NEW.status <> 'failed'
                       AND NEW.group_id IS NOT NULL)
    EXECUTE FUNCTION pgjobd.jobs_failed_undone();

-- The groups that cannot start now. Runs with its owner's rights and shows
-- each reader what sees_group lets it see: a producer only its own groups
-- (the identity its INSERTs get), everyone else all of them. A security
-- barrier: a reader's own functions in its WHERE clause run only on the
-- rows sees_group let through, and cannot see the others.
CREATE VIEW pgjobd.blocked_groups WITH (security_barrier = true) AS
    SELECT b.queue, pgjobd.group_name(b.group_id) AS group_id, b.reason, b.since, b.job,
           NULL::timestamptz AS until, pgjobd.group_producer(b.group_id) AS producer
      FROM pgjobd.group_blocks b
     WHERE pgjobd.sees_group(b.group_id)
    UNION ALL
    SELECT j.queue, j.group_id, 'retry', j.updated_at, j.id, j.run_at,
           pgjobd.group_producer(j.group_key)
      FROM pgjobd.jobs j
     WHERE j.status = 'queued' AND j.group_id IS NOT NULL AND j.attempts > 0
       AND j.run_at > now()
       AND pgjobd.sees_group(coalesce(j.group_key, j.group_id))
       AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs o
                        WHERE o.queue = j.queue
                          AND coalesce(o.group_key, o.group_id) = coalesce(j.group_key, j.group_id)
                          AND o.status IN ('queued', 'running')
                          AND coalesce(o.commit_seq, o.id) < coalesce(j.commit_seq, j.id));

COMMENT ON VIEW pgjobd.blocked_groups IS
    'Groups that cannot start a job now: held (a job failed for good under group_on_failure = '
    'hold), paused (pause_group) or retry (the head waits out a retry''s backoff).';
