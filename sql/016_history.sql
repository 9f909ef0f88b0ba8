-- 016_history.sql - schema version 16: what each attempt did, kept; finished jobs run again on
-- an operator's word.
--
--   jobs.history   a jsonb array, one object per attempt that ended, oldest
--                  first, at most 20 (the newest are kept). Each entry:
--                    attempt      the attempt's number (jobs.attempts while
--                                 it ran)
--                    worker       the slot that ran it (host:pid:queue.N)
--                    started_at   when it was claimed
--                    finished_at  when its outcome was written (for an
--                                 attempt taken over from a daemon that was
--                                 gone: the time of the takeover)
--                    reason       none (exit 0), exit, signal, timeout,
--                                 spawn, lost_lock, cancelled or shutdown
--                    exit_code, signal   null when there is none
--                    stderr       the tail of its stderr (null when empty);
--                                 the newest entry keeps up to the queue's
--                                 max_output, older ones their last 4096
--                                 characters; "truncated": true when cut
--                    cpu_ms       user + system CPU time of the command and
--                                 of the descendants it waited for (wait4)
--                    max_rss_kb   the largest resident set of those
--                    duration_ms  the command's run time
--                  cpu_ms, max_rss_kb and duration_ms are null when the
--                  daemon could not know them (the command never started,
--                  or the attempt was taken over).
--
--   which attempts  every attempt that counted (attempts went up for it and
--                  was not given back) gets an entry, and so does a run
--                  interrupted by a shutdown: that one was given back, so
--                  its entry has the same attempt number as the next one.
--                  A claim given back before its command started (the
--                  daemon's own orphan pass, a slot that lost its session
--                  first, a shutdown or lapsed fence before the start) is no
--                  attempt and gets none.
--
--   how            the daemon's outcome statements append the entry
--                  themselves, with what only the daemon knows (rusage, the
--                  stderr of a success, the run time): the finish UPDATE
--                  (src/claim.c) and release_claim() with the new p_entry
--                  argument. Every other way an attempt ends, above all a
--                  running job taken over by another daemon's claim
--                  (claim_batch's orphan pass: a new claim, a `failed` last
--                  attempt, or a `cancelled` one), gets its entry from the
--                  trigger jobs_attempt_ended, from the row alone, so no
--                  function that ends attempts needs restating here. The
--                  trigger fires only when a running row's status or fencing
--                  token changes and the statement left history alone.
--
--   pgjobd.retry(id)  a finished job (succeeded, failed, cancelled) back to
--                  queued: attempts 0, run_at now(), error, result,
--                  finished_at, started_at and worker cleared, history kept;
--                  an expires_at that has passed is cleared too (the job
--                  would expire again at once otherwise). false for a job
--                  that is queued, running or does not exist, and for one
--                  whose dedupe_key another unfinished job of its queue
--                  holds (the dedupe rule of INSERT). Wakes the queue's
--                  daemons like an INSERT. For operators: EXECUTE for
--                  pgjobd_worker only.
--
--   group order of a retried job: it is an unfinished job of its group
--                  again, and a group's unfinished jobs start in the group's
--                  start order, so it takes its place among them by that
--                  order; it never runs beside another job of its group.
--
-- Locks taken by this migration: ACCESS EXCLUSIVE on pgjobd.jobs for the new
-- column (its default is a constant: no rewrite) and the new trigger, for a
-- moment once running jobs of lock mode `transaction` have ended (their slots
-- hold ROW SHARE), as every migration's grant_roles() takes.
--
-- Daemons of version 8 go on running against this schema until they stop on
-- the version mismatch: their outcomes do not append entries, so the trigger
-- makes them from the row (without rusage or the stderr of a success).

ALTER TABLE pgjobd.jobs ADD COLUMN history jsonb NOT NULL DEFAULT '[]';

-- p_history with p_entry appended: at most 20 entries (the oldest dropped),
-- and the stderr of the entry that was the newest cut to its last 4096
-- characters (then "truncated": true), so that a job's row stays small
-- however often it is retried. Every entry goes through here, so the older
-- ones were cut when they were in its place, and one jsonb_set does. Anything
-- but an array in p_history counts as empty; a NULL p_entry appends nothing.
-- jsonb operators only, in PL/pgSQL, whose plans a session keeps: this runs
-- in every outcome statement. Pure; reads and locks nothing.
CREATE FUNCTION pgjobd.history_add(p_history jsonb, p_entry jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    h jsonb := CASE WHEN jsonb_typeof(p_history) = 'array' THEN p_history ELSE '[]' END;
    e jsonb := h -> -1;
BEGIN
    IF p_entry IS NULL THEN
        RETURN h;
    END IF;
    IF length(e ->> 'stderr') > 4096 THEN
        h := jsonb_set(h, '{-1}', e || jsonb_build_object('stderr', right(e ->> 'stderr', 4096),
                                                          'truncated', true));
    END IF;
    h := h || jsonb_build_array(p_entry);
    WHILE jsonb_array_length(h) > 20 LOOP
        h := h - 0;
    END LOOP;
    RETURN h;
END
$$;

-- The entry of an attempt that ended without its daemon's outcome statement
-- (see the top), from the row: a new fencing token means another claim took
-- the job over (lost_lock, nothing known of how the command ended); else
-- the reason, exit code, signal and stderr of the error written (none for
-- a success). A running job given back with its attempt not counted never
-- started its command: no entry.
CREATE FUNCTION pgjobd.jobs_attempt_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    e jsonb;
BEGIN
    IF NEW.status = 'queued' AND NEW.attempts < OLD.attempts THEN
        RETURN NEW;
    END IF;
    IF NEW.fence IS DISTINCT FROM OLD.fence THEN
        e := jsonb_build_object('reason', 'lost_lock', 'exit_code', NULL, 'signal', NULL,
                                'stderr', NULL,
                                'message', 'the daemon running it was gone; taken over');
    ELSIF NEW.status = 'succeeded' THEN
        e := jsonb_build_object('reason', 'none', 'exit_code', 0, 'signal', NULL, 'stderr', NULL);
    ELSE
        e := jsonb_build_object('reason', coalesce(NEW.error ->> 'reason', 'lost_lock'),
                                'exit_code', NEW.error -> 'exit_code',
                                'signal', NEW.error -> 'signal',
                                'stderr', NEW.error -> 'stderr');
    END IF;
    NEW.history := pgjobd.history_add(OLD.history,
        jsonb_build_object('attempt', OLD.attempts, 'worker', OLD.worker,
                           'started_at', OLD.started_at, 'finished_at', clock_timestamp(),
                           'cpu_ms', NULL, 'max_rss_kb', NULL, 'duration_ms', NULL) || e);
    RETURN NEW;
END
$$;

-- UPDATE OF status, fence: the statements that end an attempt set one of
-- them; markings (held_until) and the like never reach the WHEN clause.
CREATE TRIGGER jobs_attempt_ended BEFORE UPDATE OF status, fence ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.status = 'running'
                       AND (NEW.status <> 'running' OR NEW.fence IS DISTINCT FROM OLD.fence)
                       AND NEW.history IS NOT DISTINCT FROM OLD.history)
    EXECUTE FUNCTION pgjobd.jobs_attempt_ended();

-- Version 6's release_claim with the attempt's entry: p_entry (reason,
-- exit_code, signal, stderr, cpu_ms, max_rss_kb, duration_ms, from the
-- daemon) is completed with attempt, worker, started_at and finished_at from
-- the row and appended to history when p_started. The six-argument version
-- stays for daemons of version 8 (the trigger records their attempts).
-- Locks the job's row (SKIP LOCKED) like the original.
CREATE FUNCTION pgjobd.release_claim(p_id bigint, p_fence bigint, p_started boolean,
                                     p_error jsonb, p_max_attempts int, p_retry_ms bigint,
                                     p_entry jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a int;
    t timestamptz := clock_timestamp();
    h jsonb;
BEGIN
    SELECT j.attempts, CASE WHEN p_started
                            THEN pgjobd.history_add(j.history,
                                     jsonb_build_object('attempt', j.attempts,
                                                        'worker', j.worker,
                                                        'started_at', j.started_at,
                                                        'finished_at', t)
                                     || coalesce(p_entry, '{}'))
                            ELSE j.history END
      INTO a, h
      FROM pgjobd.jobs j
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
               updated_at = t
         WHERE j.id = p_id;
    ELSIF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = p_id) THEN
        UPDATE pgjobd.jobs j SET status = 'cancelled', error = p_error, history = h,
               finished_at = t, updated_at = t
         WHERE j.id = p_id;
        DELETE FROM pgjobd.cancel_requests c WHERE c.job_id = p_id;
    ELSIF a >= p_max_attempts THEN
        UPDATE pgjobd.jobs j SET status = 'failed', error = p_error, history = h,
               finished_at = t, updated_at = t
         WHERE j.id = p_id;
    ELSE
        UPDATE pgjobd.jobs j SET status = 'queued', error = p_error, history = h,
               run_at = t + p_retry_ms * interval '1 millisecond',
               updated_at = t
         WHERE j.id = p_id;
    END IF;
    RETURN 'released';
END
$$;

-- The lock on a dedupe key that the INSERT trigger jobs_dedupe takes
-- (sql/009_row_locks.sql): a row of pgjobd.dedupe_locks, held until the
-- transaction ends. As the owner, because no other role may touch that
-- table; only the owner and the worker role may call it.
CREATE FUNCTION pgjobd.lock_dedupe_key(p_queue text, p_key text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOOP
        INSERT INTO pgjobd.dedupe_locks (queue, dedupe_key)
        VALUES (p_queue, p_key)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        PERFORM 1 FROM pgjobd.dedupe_locks d
         WHERE d.queue = p_queue AND d.dedupe_key = p_key
         FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.lock_dedupe_key(text, text) FROM PUBLIC;

-- See the top. Row-locks the job (FOR UPDATE: a finished row is locked by
-- nobody but a retention DELETE, which skips locked rows, or another
-- retry), and for a job with a dedupe_key takes the INSERT trigger's lock
-- on the key (lock_dedupe_key), so that a concurrent INSERT of the same key
-- and this retry see each other. The status change back to `queued` places
-- a grouped job behind the jobs of its group already visible (the trigger
-- jobs_commit_order_requeued, sql/015_commit_order.sql).
CREATE FUNCTION pgjobd.retry(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    j record;
BEGIN
    SELECT r.queue, r.dedupe_key INTO j FROM pgjobd.jobs r
     WHERE r.id = p_id AND r.status IN ('succeeded', 'failed', 'cancelled')
     FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF j.dedupe_key IS NOT NULL THEN
        PERFORM pgjobd.lock_dedupe_key(j.queue, j.dedupe_key);
        IF EXISTS (SELECT 1 FROM pgjobd.jobs o
                    WHERE o.queue = j.queue AND o.dedupe_key = j.dedupe_key
                      AND o.status IN ('queued', 'running') AND o.id <> p_id) THEN
            RETURN false;
        END IF;
    END IF;
    UPDATE pgjobd.jobs r SET status = 'queued', attempts = 0, run_at = now(),
           error = NULL, result = NULL, finished_at = NULL, started_at = NULL,
           worker = NULL, worker_id = NULL, held_until = NULL,
           expires_at = CASE WHEN r.expires_at <= now() THEN NULL ELSE r.expires_at END,
           updated_at = clock_timestamp()
     WHERE r.id = p_id;
    IF EXISTS (SELECT 1 FROM pgjobd.waiting w WHERE w.queue = j.queue) THEN
        PERFORM pg_notify('pgjobd', pgjobd.wake_payload(j.queue));
    END IF;
    RETURN true;
END
$$;

REVOKE EXECUTE ON FUNCTION pgjobd.retry(bigint),
       pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint, jsonb) FROM PUBLIC;

-- This version's grants, for the roles that exist; called by grant_roles().
-- A producer reads the history of its own jobs (row-level security as for
-- the other columns); the worker role ends attempts with the new
-- release_claim and may retry any job. history_add() stays executable by
-- everyone: it is pure and reads nothing.
CREATE FUNCTION pgjobd.grant_history() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT SELECT (history) ON pgjobd.jobs TO pgjobd_producer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT EXECUTE ON FUNCTION pgjobd.retry(bigint), pgjobd.lock_dedupe_key(text, text),
              pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint, jsonb)
              TO pgjobd_worker;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.grant_history() FROM PUBLIC;

-- Version 14's grant_roles(), everything it granted kept, then this
-- version's grants.
CREATE OR REPLACE FUNCTION pgjobd.grant_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT USAGE ON SCHEMA pgjobd TO pgjobd_producer;
        GRANT INSERT (queue, group_id, data, priority, run_at, expires_at, max_attempts,
                      timeout, dedupe_key) ON pgjobd.jobs TO pgjobd_producer;
        GRANT SELECT (id, queue, group_id, data, priority, run_at, expires_at, max_attempts,
                      timeout, dedupe_key, status, attempts, result, error, created_at,
                      started_at, finished_at, updated_at, created_by)
              ON pgjobd.jobs TO pgjobd_producer;
        GRANT SELECT ON pgjobd.queue_stats TO pgjobd_producer;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'jobs'
                          AND policyname = 'producer_insert') THEN
            CREATE POLICY producer_insert ON pgjobd.jobs FOR INSERT TO pgjobd_producer
                WITH CHECK (created_by = current_user
                            AND (EXISTS (SELECT 1 FROM pgjobd.queue_grants g
                                          WHERE g.queue IN (jobs.queue, '*')
                                            AND pg_catalog.pg_has_role(current_user, g.role,
                                                                       'MEMBER'))
                                 OR pgjobd.check_queue_grant(jobs.queue)));
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'jobs'
                          AND policyname = 'producer_select') THEN
            CREATE POLICY producer_select ON pgjobd.jobs FOR SELECT TO pgjobd_producer
                USING (created_by = current_user);
        END IF;
        ALTER TABLE pgjobd.jobs ENABLE ROW LEVEL SECURITY;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT USAGE ON SCHEMA pgjobd TO pgjobd_worker;
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobd.jobs, pgjobd.groups, pgjobd.waiting,
              pgjobd.cancel_requests, pgjobd.paused_queues TO pgjobd_worker;
        GRANT SELECT ON pgjobd.schema_version, pgjobd.queue_stats TO pgjobd_worker;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'jobs'
                          AND policyname = 'worker_all') THEN
            CREATE POLICY worker_all ON pgjobd.jobs TO pgjobd_worker
                USING (true) WITH CHECK (true);
        END IF;
        GRANT EXECUTE ON FUNCTION pgjobd.cancel(bigint), pgjobd.pause(text),
              pgjobd.resume(text), pgjobd.maintain(text[], bigint[], int),
              pgjobd.try_group_head_v2(text, text, bigint) TO pgjobd_worker;
    END IF;
    PERFORM pgjobd.grant_fencing();
    PERFORM pgjobd.grant_security();
    PERFORM pgjobd.grant_locks();
    PERFORM pgjobd.grant_ops();
    PERFORM pgjobd.grant_schedules();
    PERFORM pgjobd.grant_history();
END
$$;

SELECT pgjobd.grant_roles();
