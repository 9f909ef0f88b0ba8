-- sql/functions/control.sql - what operators and the daemons' maintenance
-- sessions call: cancel, pause and resume, retry, maintenance, queue grants,
-- shared queues and quotas.

-- cancel(id): a queued job is cancelled at once; a running one gets a
-- cancel request (NOTIFY pgjobd_cancel, without the id) that its daemon reads
-- and acts on. False when the job is finished or missing.
CREATE OR REPLACE FUNCTION pgjobd.cancel(p_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s text;
BEGIN
    -- A job can move between the two statements (a claim makes it running;
    -- a failed attempt makes it queued again), and each statement sees the
    -- latest committed state: a few rounds settle it.
    FOR round IN 1 .. 5 LOOP
        -- jobs_cancelled fills finished_at, updated_at and the error.
        UPDATE pgjobd.jobs j SET status = 'cancelled'
         WHERE j.id = p_id AND j.status = 'queued';
        IF FOUND THEN
            RETURN true;
        END IF;
        SELECT j.status INTO s FROM pgjobd.jobs j WHERE j.id = p_id;
        IF s = 'running' THEN
            INSERT INTO pgjobd.cancel_requests (job_id) VALUES (p_id) ON CONFLICT DO NOTHING;
            PERFORM pg_notify('pgjobd_cancel', '');
            RETURN true;
        END IF;
        EXIT WHEN s IS DISTINCT FROM 'queued';
    END LOOP;
    RETURN false;
END
$$;

-- grant_queue(role, queue or '*'): let a producer role enqueue into queue.
CREATE OR REPLACE FUNCTION pgjobd.grant_queue(p_role name, p_queue text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    rid oid;
BEGIN
    SELECT r.oid INTO rid FROM pg_roles r WHERE r.rolname = p_role;
    IF rid IS NULL THEN
        RAISE EXCEPTION 'role % does not exist', coalesce(quote_ident(p_role), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF p_queue IS DISTINCT FROM '*' THEN
        PERFORM pgjobd.check_queue_name(p_queue);
    END IF;
    INSERT INTO pgjobd.queue_grants (queue, role, granted_by)
    VALUES (p_queue, rid::regrole, session_user)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Trigger jobs_cancelled (any path to `cancelled`): finished_at and an error
-- for the job; a finished job is left alone.
CREATE OR REPLACE FUNCTION pgjobd.jobs_cancelled() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF OLD.status IN ('succeeded', 'failed') THEN
        RETURN NULL;
    END IF;
    -- A running job set `cancelled` by an UPDATE (an operator's, as for a
    -- queued one; the daemons' own outcomes fill finished_at): its command
    -- still runs, so the row stays `running` (its group and its queue's
    -- limits count it) and the update becomes a cancel request, as
    -- pgjobd.cancel() makes one; the daemon ends it `cancelled`. The slot of
    -- a transaction-mode job holds its row FOR KEY SHARE, which an UPDATE
    -- does not wait for.
    IF OLD.status = 'running' AND NEW.finished_at IS NULL THEN
        INSERT INTO pgjobd.cancel_requests (job_id) VALUES (OLD.id) ON CONFLICT DO NOTHING;
        PERFORM pg_notify('pgjobd_cancel', '');
        RETURN NULL;
    END IF;
    IF NEW.finished_at IS NULL THEN
        NEW.finished_at := clock_timestamp();
    END IF;
    IF NEW.error IS NULL OR NEW.error IS NOT DISTINCT FROM OLD.error THEN
        NEW.error := jsonb_build_object('reason', 'cancelled', 'exit_code', NULL,
                                        'signal', NULL, 'stderr', NULL,
                                        'message', 'cancelled before it started');
    END IF;
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END
$$;

-- maintain(queues, retention_ms, limit, keep_ms): the maintenance pass, one
-- daemon at a time (maintenance_lock, SKIP LOCKED): expire queued jobs past
-- expires_at, cancel queued jobs with a cancel request, drop requests of
-- finished jobs, delete the group rates' states that have passed and the
-- finished jobs past each queue's retention (at most `limit`) and the group
-- rows they leave empty. Returns whether it ran and what it did, `more` when
-- a batch was full, and `keeper`: whether the caller keeps the pace (passes
-- every second; the others pass seldom). The caller keeps it, for keep_ms
-- from now, when it kept it already (its session's backend is the row's
-- keeper) or the keeper's time ran out; keep_ms 0 never takes it. NULL when
-- the lock was busy: nothing changed.
CREATE OR REPLACE FUNCTION pgjobd.maintain(p_queues text[], p_retention_ms bigint[], p_limit integer, p_keep_ms integer, OUT locked boolean, OUT keeper boolean, OUT expired integer, OUT deleted integer, OUT more boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    i int;
    n int;
BEGIN
    expired := 0;
    deleted := 0;
    more := false;
    PERFORM 1 FROM pgjobd.maintenance_lock FOR UPDATE SKIP LOCKED;
    locked := FOUND;
    IF NOT locked THEN
        RETURN;
    END IF;
    UPDATE pgjobd.maintenance_lock m
       SET keeper = pg_backend_pid(),
           keeper_until = clock_timestamp() + p_keep_ms * interval '1 millisecond'
     WHERE p_keep_ms > 0
       AND (m.keeper IS NOT DISTINCT FROM pg_backend_pid() OR m.keeper_until IS NULL
            OR m.keeper_until <= clock_timestamp());
    keeper := FOUND;

    UPDATE pgjobd.jobs j SET status = 'cancelled', finished_at = clock_timestamp(),
           updated_at = clock_timestamp(),
           error = jsonb_build_object('reason', 'expired', 'exit_code', NULL, 'signal', NULL,
                   'stderr', NULL, 'message', 'expired before it started',
                   'expires_at', j.expires_at)
     WHERE j.id IN (SELECT e.id FROM pgjobd.jobs e
                     WHERE e.status = 'queued' AND e.expires_at <= statement_timestamp()
                     ORDER BY e.expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS expired = ROW_COUNT;
    more := expired >= p_limit;

    -- jobs_cancelled fills finished_at, updated_at and the error.
    UPDATE pgjobd.jobs j SET status = 'cancelled'
     WHERE j.id IN (SELECT q.id FROM pgjobd.jobs q
                      JOIN pgjobd.cancel_requests c ON c.job_id = q.id
                     WHERE q.status = 'queued' FOR UPDATE OF q SKIP LOCKED);
    DELETE FROM pgjobd.cancel_requests c
     WHERE NOT EXISTS (SELECT 1 FROM pgjobd.jobs j
                        WHERE j.id = c.job_id AND j.status IN ('queued', 'running'));

    -- A group rate's state whose time has passed means what no row means.
    -- Rows a claim is planning with are skipped (a claim locks several in
    -- its own order: waiting here could deadlock with it).
    DELETE FROM pgjobd.group_rates t
     WHERE t.ctid = ANY (ARRAY(SELECT o.ctid FROM pgjobd.group_rates o
                                WHERE o.tat < statement_timestamp() LIMIT p_limit
                                  FOR UPDATE SKIP LOCKED));

    FOR i IN 1 .. coalesce(array_length(p_queues, 1), 0) LOOP
        CONTINUE WHEN coalesce(p_retention_ms[i], 0) <= 0;
        WITH d AS (
            DELETE FROM pgjobd.jobs j
             WHERE j.id IN (SELECT f.id FROM pgjobd.jobs f
                             WHERE f.queue = p_queues[i]
                               AND f.status IN ('succeeded', 'failed', 'cancelled')
                               AND f.finished_at < statement_timestamp()
                                   - p_retention_ms[i] * interval '1 millisecond'
                             ORDER BY f.finished_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
            RETURNING j.queue, coalesce(j.group_key, j.group_id) AS group_id),
        gone AS (
            -- A group with nothing left to run needs no lock row; a job
            -- enqueued into it later gets a new one (its first claim).
            DELETE FROM pgjobd.groups g
             WHERE g.id IN (SELECT gr.id FROM pgjobd.groups gr
                             WHERE (gr.queue, gr.group_id) IN
                                   (SELECT DISTINCT d.queue, d.group_id FROM d
                                     WHERE d.group_id IS NOT NULL)
                               AND NOT EXISTS (
                                   SELECT 1 FROM pgjobd.jobs u
                                    WHERE u.queue = gr.queue AND coalesce(u.group_key, u.group_id) = gr.group_id
                                      AND u.status IN ('queued', 'running'))
                             FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT (SELECT count(*) FROM d) INTO n;
        deleted := deleted + n;
        more := more OR n >= p_limit;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.maintain(text[], bigint[], int, int) FROM PUBLIC;

-- pause(queue): claims of the queue start nothing until resume().
CREATE OR REPLACE FUNCTION pgjobd.pause(p_queue text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    INSERT INTO pgjobd.paused_queues (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- resume(queue): undo pause(), with a wake-up for the queue.
CREATE OR REPLACE FUNCTION pgjobd.resume(p_queue text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    DELETE FROM pgjobd.paused_queues p WHERE p.queue = p_queue;
    IF FOUND THEN
        PERFORM pg_notify('pgjobd', pgjobd.wake_payload(p_queue));
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- retry(id): put a finished job back to `queued` as new (attempts 0, run now),
-- unless an unfinished job has its dedupe key in its scope (then false).
CREATE OR REPLACE FUNCTION pgjobd.retry(p_id bigint) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    j record;
    s text;
BEGIN
    SELECT r.queue, r.dedupe_key, r.created_by INTO j FROM pgjobd.jobs r
     WHERE r.id = p_id AND r.status IN ('succeeded', 'failed', 'cancelled')
     FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF j.dedupe_key IS NOT NULL THEN
        s := pgjobd.dedupe_scope(j.queue, j.created_by);
        PERFORM pgjobd.lock_dedupe_key(j.queue, j.dedupe_key, s);
        IF EXISTS (SELECT 1 FROM pgjobd.jobs o
                    WHERE o.queue = j.queue AND o.dedupe_key = j.dedupe_key
                      AND (s = '' OR o.created_by = j.created_by)
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

-- revoke_queue(role, queue or '*'): undo grant_queue.
CREATE OR REPLACE FUNCTION pgjobd.revoke_queue(p_role name, p_queue text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM pgjobd.queue_grants g
     WHERE g.queue = p_queue
       AND g.role = (SELECT r.oid FROM pg_roles r WHERE r.rolname = p_role);
    RETURN FOUND;
END
$$;

-- set_quota(role, queue or '*', max_queued): how many jobs a role may have
-- queued in a queue (NULL: no quota).
CREATE OR REPLACE FUNCTION pgjobd.set_quota(p_role name, p_queue text, p_max_queued integer) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    rid oid;
BEGIN
    SELECT r.oid INTO rid FROM pg_roles r WHERE r.rolname = p_role;
    IF rid IS NULL THEN
        RAISE EXCEPTION 'role % does not exist', coalesce(quote_ident(p_role), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF p_queue IS DISTINCT FROM '*' THEN
        PERFORM pgjobd.check_queue_name(p_queue);
    END IF;
    IF p_max_queued IS NULL THEN
        DELETE FROM pgjobd.quotas q WHERE q.role = rid::regrole AND q.queue = p_queue;
        RETURN FOUND;
    END IF;
    INSERT INTO pgjobd.quotas AS q (role, queue, max_queued)
    VALUES (rid::regrole, p_queue, p_max_queued)
    ON CONFLICT (role, queue) DO UPDATE SET max_queued = EXCLUDED.max_queued
    WHERE q.max_queued IS DISTINCT FROM EXCLUDED.max_queued;
    RETURN FOUND;
END
$$;

-- share_queue(queue, shared): its producers share dedupe keys and groups
-- (else each role's are its own).
CREATE OR REPLACE FUNCTION pgjobd.share_queue(p_queue text, p_shared boolean DEFAULT true) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    was boolean;
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    SELECT p.shared INTO was FROM pgjobd.queue_policies p WHERE p.queue = p_queue FOR UPDATE;
    IF coalesce(was, false) = coalesce(p_shared, false) THEN
        RETURN false;
    END IF;
    INSERT INTO pgjobd.queue_policies AS p (queue, shared) VALUES (p_queue, coalesce(p_shared, false))
    ON CONFLICT (queue) DO UPDATE SET shared = EXCLUDED.shared, changed_at = now(),
                                      changed_by = session_user;
    RETURN true;
END
$$;

