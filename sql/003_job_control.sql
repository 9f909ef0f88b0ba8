-- 003_job_control.sql - schema version 3: job control from SQL.
--
--   dedupe_key   a BEFORE INSERT row trigger drops the row (INSERT 0 0, no
--                error) while a job of the same (queue, dedupe_key) is queued
--                or running; concurrent inserters of one key are serialised
--                by a transaction-level advisory lock on the key, and a
--                partial unique index backs it up.
--   expires_at   claims never start an expired job; pgjobd.maintain() marks
--                expired queued jobs `cancelled` (reason `expired`).
--   cancel       pgjobd.cancel(id) cancels a queued job at once. A running
--                job's row is locked by its daemon's transaction, so for it
--                cancel() records a request in pgjobd.cancel_requests (a
--                side table nobody holds locks on) and sends NOTIFY on
--                channel pgjobd_cancel; the daemon that runs the job
--                terminates its command and writes `cancelled`.
--   pause        a row in pgjobd.paused_queues; claim_batch starts nothing
--                of a paused queue; resume() deletes it and wakes daemons.
--   retention    pgjobd.maintain() deletes finished jobs past their queue's
--                retention in small batches, one daemon at a time.
--   roles        pgjobd.setup_roles() / pgjobd.grant_roles(): a producer
--                role that may only INSERT jobs and read them, a worker role
--                that may run the protocol but owns nothing.

-- ---------------------------------------------------------------- dedupe

-- Backs up the trigger (and makes its lookup one probe): under REPEATABLE
-- READ or SERIALIZABLE the trigger cannot see a concurrent producer's
-- committed row, and the second INSERT fails here instead of duplicating.
CREATE UNIQUE INDEX jobs_dedupe ON pgjobd.jobs (queue, dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running');

-- Runs only for rows with a dedupe_key (the trigger's WHEN clause is
-- evaluated without calling it). The advisory lock (class 1886020106, a hash
-- of queue and key; a collision only serialises two keys) is held until the
-- producer's transaction ends, so a second producer of the same key waits
-- here and then, under READ COMMITTED, sees the first one's row: this
-- statement takes a new snapshot after the lock is granted. Rows inserted
-- earlier by the same statement are visible too. SECURITY DEFINER: a
-- producer role may insert jobs without reading all of pgjobd.jobs.
CREATE FUNCTION pgjobd.jobs_dedupe() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1886020106, hashtext(NEW.queue || E'\n' || NEW.dedupe_key));
    IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                WHERE j.queue = NEW.queue AND j.dedupe_key = NEW.dedupe_key
                  AND j.status IN ('queued', 'running')) THEN
        RETURN NULL; -- an unfinished job has this key: insert nothing
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_dedupe BEFORE INSERT ON pgjobd.jobs
    FOR EACH ROW WHEN (NEW.dedupe_key IS NOT NULL)
    EXECUTE FUNCTION pgjobd.jobs_dedupe();

-- The INSERT trigger of version 2, now SECURITY DEFINER so that a producer
-- role needs no rights on pgjobd.groups or pgjobd.waiting.
ALTER FUNCTION pgjobd.jobs_inserted() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------- cancel

-- A person's `UPDATE ... SET status = 'cancelled'` (or any other path to
-- `cancelled`) gets finished_at and, when it set none, an error saying why.
-- A job that has finished stays as it finished (the row is left out of the
-- UPDATE): an UPDATE aimed at a running job waits for its daemon's row lock
-- and, under READ COMMITTED, would otherwise overwrite `succeeded` once the
-- job is done. Running jobs are cancelled with pgjobd.cancel().
CREATE FUNCTION pgjobd.jobs_cancelled() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('succeeded', 'failed') THEN
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

CREATE TRIGGER jobs_cancelled BEFORE UPDATE OF status ON pgjobd.jobs
    FOR EACH ROW WHEN (NEW.status = 'cancelled' AND OLD.status <> 'cancelled')
    EXECUTE FUNCTION pgjobd.jobs_cancelled();

-- Cancel requests for running jobs. Nobody keeps a lock on these rows. A
-- request is acted on by the daemon that runs the job (NOTIFY, or its
-- periodic look at this table), by the slot about to start the job (hold),
-- or by the orphan pass; pgjobd.maintain() cancels the job if it went back
-- to `queued` meanwhile and drops requests of finished jobs.
CREATE TABLE pgjobd.cancel_requests (
    job_id       bigint PRIMARY KEY,
    requested_at timestamptz NOT NULL DEFAULT now(),
    requested_by text NOT NULL DEFAULT current_user
);

-- true: the job was queued and is now cancelled, or it is running and its
-- daemon was asked to terminate it (it then ends `cancelled`, reason
-- `cancelled`, not retried). false: no such job, or it has finished.
-- Never waits for a running job's row lock: the queued-only UPDATE does not
-- lock a row whose visible status is `running`.
CREATE FUNCTION pgjobd.cancel(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
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
            PERFORM pg_notify('pgjobd_cancel', p_id::text);
            RETURN true;
        END IF;
        EXIT WHEN s IS DISTINCT FROM 'queued';
    END LOOP;
    RETURN false;
END
$$;

-- ---------------------------------------------------------------- pause

CREATE TABLE pgjobd.paused_queues (
    queue     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL DEFAULT current_user
);

-- Raises for a name the jobs table's CHECK constraint would refuse.
CREATE FUNCTION pgjobd.check_queue_name(p_queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_queue IS NULL OR p_queue !~ '^[A-Za-z0-9_.-]{1,63}$' THEN
        RAISE EXCEPTION 'bad queue name %: use 1 to 63 characters of A-Z a-z 0-9 _ . -',
            coalesce(quote_literal(p_queue), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- true when this call paused the queue, false when it was paused already.
CREATE FUNCTION pgjobd.pause(p_queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    INSERT INTO pgjobd.paused_queues (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- true when this call resumed the queue, false when it was not paused.
-- Wakes the daemons of the queue (at commit).
CREATE FUNCTION pgjobd.resume(p_queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    DELETE FROM pgjobd.paused_queues p WHERE p.queue = p_queue;
    IF FOUND THEN
        PERFORM pg_notify('pgjobd', p_queue);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- ---------------------------------------------------------------- claims

-- Queued jobs that expire, in expiry order: pgjobd.maintain() finds the
-- expired ones in one probe.
CREATE INDEX jobs_expiry ON pgjobd.jobs (expires_at)
    WHERE status = 'queued' AND expires_at IS NOT NULL;
-- Finished jobs per queue by age: retention deletes the oldest in one probe.
CREATE INDEX jobs_finished ON pgjobd.jobs (queue, finished_at)
    WHERE status IN ('succeeded', 'failed', 'cancelled');

-- Version 2's function, and further: a job past expires_at is not ready (a
-- group whose head expired is busy until maintain() cancels the head, so
-- order holds); a missing group row is created (maintain() deletes group
-- rows of groups with nothing left to run, and a producer's trigger may
-- have found the row just before it went).
CREATE OR REPLACE FUNCTION pgjobd.try_group_head_v2(q text, g text, jid bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    gid bigint;
    head record;
BEGIN
    SELECT gr.id INTO gid FROM pgjobd.groups gr
     WHERE gr.queue = q AND gr.group_id = g FOR UPDATE SKIP LOCKED;
    IF gid IS NULL THEN
        IF EXISTS (SELECT 1 FROM pgjobd.groups gr WHERE gr.queue = q AND gr.group_id = g) THEN
            RETURN 0; -- locked: busy
        END IF;
        INSERT INTO pgjobd.groups (queue, group_id) VALUES (q, g)
            ON CONFLICT DO NOTHING RETURNING id INTO gid;
        IF gid IS NULL THEN
            RETURN 0; -- someone else just created it
        END IF;
    END IF;
    SELECT j.id, j.status, j.run_at, j.expires_at INTO head FROM pgjobd.jobs j
     WHERE j.queue = q AND j.group_id = g AND j.status IN ('queued', 'running')
     ORDER BY j.id LIMIT 1;
    IF head.id IS DISTINCT FROM jid THEN
        -- Only a ready, queued head can start (later in the caller's scan);
        -- a running head, one waiting out a retry, or an expired one keeps
        -- the group busy.
        IF head.status = 'queued' AND head.run_at <= statement_timestamp()
           AND (head.expires_at IS NULL OR head.expires_at > statement_timestamp()) THEN
            RETURN -1;
        END IF;
        RETURN 0;
    END IF;
    IF NOT pg_try_advisory_lock(1886020103, (gid & 2147483647)::int) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = jid AND j.status = 'queued' AND j.run_at <= statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        PERFORM pg_advisory_unlock(1886020103, (gid & 2147483647)::int);
        RETURN -1;
    END IF;
    RETURN gid;
END
$$;

-- Version 2's claim_batch (see 002_fast_claim.sql for the protocol and the
-- locks each statement takes), and further:
--   - a paused queue starts nothing (bridges are still released);
--   - expired jobs are not candidates;
--   - an orphan with a cancel request ends `cancelled` instead of running
--     again.
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_workers text[], p_max_attempts int,
                                   p_scan int, p_orphans boolean, p_release_jobs bigint[],
                                   p_release_groups bigint[], p_skip bigint[])
RETURNS TABLE (slot int, job_id bigint, group_row bigint, group_id text, attempts int,
               max_attempts int, timeout_ms bigint, data text, arg_keys text[],
               arg_vals text[])
LANGUAGE plpgsql AS $$
DECLARE
    want int := coalesce(array_length(p_workers, 1), 0);
    ids bigint[] := '{}';   -- picked jobs, in start order
    gids bigint[] := '{}';  -- their group rows (NULL: ungrouped)
    r record;
    x bigint;
    gid bigint;
    k1 int;
    k2 int;
    u_ids bigint[];
    u_pri int[];
    u_run timestamptz[];
    nu int;
    ui int := 1;
    busy text[] := '{}';
    n int := 0;
    scan_cut boolean := false;
BEGIN
    FOREACH x IN ARRAY coalesce(p_release_jobs, '{}') LOOP
        PERFORM pg_advisory_unlock(1886020100, (x & 2147483647)::int);
    END LOOP;
    FOREACH x IN ARRAY coalesce(p_release_groups, '{}') LOOP
        PERFORM pg_advisory_unlock(1886020103, (x & 2147483647)::int);
    END LOOP;
    IF want = 0 THEN
        RETURN;
    END IF;

    -- Paused: start nothing, not even orphans (running one again is a
    -- start). resume() sends the NOTIFY that brings us back.
    IF EXISTS (SELECT 1 FROM pgjobd.paused_queues p WHERE p.queue = p_queue) THEN
        DELETE FROM pgjobd.waiting w WHERE w.queue = p_queue AND w.pid = pg_backend_pid();
        RETURN;
    END IF;

    -- Orphans first: running rows nobody holds (their daemon is gone). The
    -- bridge is tried before the rows: a live claim holds one or the other,
    -- so live jobs are never row-locked here.
    IF p_orphans THEN
        DELETE FROM pgjobd.waiting w
         WHERE w.queue = p_queue
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid);
        FOR r IN SELECT j.id, j.group_id, j.attempts, j.max_attempts FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'running'
                  ORDER BY j.id
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            CONTINUE WHEN r.id = ANY(p_skip);
            gid := NULL;
            IF r.group_id IS NOT NULL THEN
                SELECT g.id INTO gid FROM pgjobd.groups g
                 WHERE g.queue = p_queue AND g.group_id = r.group_id;
                IF gid IS NULL THEN
                    -- maintain() deleted it in a race with this job's
                    -- claim; the job row lock (below) still tells whether
                    -- its daemon lives.
                    INSERT INTO pgjobd.groups (queue, group_id) VALUES (p_queue, r.group_id)
                        ON CONFLICT DO NOTHING RETURNING id INTO gid;
                END IF;
                CONTINUE WHEN gid IS NULL;
                k1 := 1886020103;
                k2 := (gid & 2147483647)::int;
            ELSE
                k1 := 1886020100;
                k2 := (r.id & 2147483647)::int;
            END IF;
            CONTINUE WHEN NOT pg_try_advisory_lock(k1, k2);
            IF gid IS NOT NULL THEN
                PERFORM 1 FROM pgjobd.groups g WHERE g.id = gid FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    PERFORM pg_advisory_unlock(k1, k2);
                    CONTINUE;
                END IF;
            END IF;
            PERFORM 1 FROM pgjobd.jobs j WHERE j.id = r.id AND j.status = 'running'
             FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                PERFORM pg_advisory_unlock(k1, k2);
                CONTINUE;
            END IF;
            IF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = r.id) THEN
                -- Cancelled while its daemon died: it stays cancelled.
                UPDATE pgjobd.jobs j SET status = 'cancelled', finished_at = clock_timestamp(),
                       updated_at = clock_timestamp(),
                       error = jsonb_build_object('reason', 'cancelled', 'exit_code', NULL,
                               'signal', NULL, 'stderr', NULL,
                               'message', 'cancelled; the daemon running it was gone')
                 WHERE j.id = r.id;
                DELETE FROM pgjobd.cancel_requests c WHERE c.job_id = r.id;
                PERFORM pg_advisory_unlock(k1, k2);
                CONTINUE;
            END IF;
            IF r.attempts >= coalesce(r.max_attempts, p_max_attempts) THEN
                -- Its last attempt died with its daemon: a failed attempt.
                UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(),
                       updated_at = clock_timestamp(),
                       error = jsonb_build_object('reason', 'lost_lock', 'exit_code', NULL,
                               'signal', NULL, 'stderr', NULL,
                               'message', 'the daemon running this job lost its claim')
                 WHERE j.id = r.id;
                PERFORM pg_advisory_unlock(k1, k2);
                CONTINUE;
            END IF;
            -- An orphan: run it again, counting a new attempt.
            ids := ids || r.id;
            gids := gids || gid;
            IF r.group_id IS NOT NULL THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;

    -- The best ready ungrouped jobs: one probe of jobs_ready_free, locked.
    -- (Expired rows are filtered here until maintain() cancels them.)
    SELECT array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.priority ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.run_at ORDER BY c.priority, c.run_at, c.id)
      INTO u_ids, u_pri, u_run
      FROM (SELECT j.id, j.priority, j.run_at FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NULL
               AND j.run_at <= statement_timestamp()
               AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
             ORDER BY j.priority, j.run_at, j.id
             FOR UPDATE SKIP LOCKED
             LIMIT want - coalesce(array_length(ids, 1), 0)) c;
    nu := coalesce(array_length(u_ids, 1), 0);

    -- Grouped jobs in start order, up to the last ungrouped candidate when
    -- there are enough of those, bounded by p_scan (see version 2).
    IF coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN SELECT j.id, j.group_id, j.priority, j.run_at FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NOT NULL
                    AND j.run_at <= statement_timestamp()
                    AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
                    AND (j.priority, j.run_at, j.id) <
                        (CASE WHEN nu > 0 AND nu + coalesce(array_length(ids, 1), 0) >= want
                              THEN u_pri[nu] ELSE 2147483647 END,
                         CASE WHEN nu > 0 AND nu + coalesce(array_length(ids, 1), 0) >= want
                              THEN u_run[nu] ELSE 'infinity' END,
                         CASE WHEN nu > 0 AND nu + coalesce(array_length(ids, 1), 0) >= want
                              THEN u_ids[nu] ELSE 9223372036854775807 END)
                  ORDER BY j.priority, j.run_at, j.id
                  LIMIT p_scan + 1
        LOOP
            WHILE ui <= nu AND coalesce(array_length(ids, 1), 0) < want
                  AND (u_pri[ui], u_run[ui], u_ids[ui]) < (r.priority, r.run_at, r.id) LOOP
                IF pg_try_advisory_lock(1886020100, (u_ids[ui] & 2147483647)::int) THEN
                    ids := ids || u_ids[ui];
                    gids := gids || NULL::bigint;
                END IF;
                ui := ui + 1;
            END LOOP;
            EXIT WHEN array_length(ids, 1) >= want;
            n := n + 1;
            IF n > p_scan THEN
                scan_cut := true;
                EXIT;
            END IF;
            CONTINUE WHEN r.group_id = ANY(busy);
            gid := pgjobd.try_group_head_v2(p_queue, r.group_id, r.id);
            IF gid > 0 THEN
                ids := ids || r.id;
                gids := gids || gid;
                busy := busy || r.group_id;
            ELSIF gid = 0 THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;
    WHILE ui <= nu AND coalesce(array_length(ids, 1), 0) < want LOOP
        IF pg_try_advisory_lock(1886020100, (u_ids[ui] & 2147483647)::int) THEN
            ids := ids || u_ids[ui];
            gids := gids || NULL::bigint;
        END IF;
        ui := ui + 1;
    END LOOP;

    -- The bounded scan met only busy groups: visit each group's head once
    -- (a loose index scan over jobs_group_head), O(groups).
    IF scan_cut AND coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN WITH RECURSIVE heads AS (
                     (SELECT j.group_id, j.id, j.status, j.run_at, j.expires_at
                        FROM pgjobd.jobs j
                       WHERE j.queue = p_queue AND j.group_id IS NOT NULL
                         AND j.status IN ('queued', 'running')
                       ORDER BY j.group_id, j.id LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at, nx.expires_at FROM heads h,
                       LATERAL (SELECT j.group_id, j.id, j.status, j.run_at, j.expires_at
                                  FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND j.group_id > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY j.group_id, j.id LIMIT 1) nx)
                 SELECT h.group_id, h.id FROM heads h
                  WHERE h.status = 'queued' AND h.run_at <= statement_timestamp()
                    AND (h.expires_at IS NULL OR h.expires_at > statement_timestamp())
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            CONTINUE WHEN r.group_id = ANY(busy);
            gid := pgjobd.try_group_head_v2(p_queue, r.group_id, r.id);
            IF gid > 0 THEN
                ids := ids || r.id;
                gids := gids || gid;
                busy := busy || r.group_id;
            ELSIF gid = 0 THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;

    -- Slots left idle: wake me (see pgjobd.waiting).
    IF coalesce(array_length(ids, 1), 0) < want THEN
        INSERT INTO pgjobd.waiting (queue, pid) VALUES (p_queue, pg_backend_pid())
            ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM pgjobd.waiting w WHERE w.queue = p_queue AND w.pid = pg_backend_pid();
    END IF;
    IF coalesce(array_length(ids, 1), 0) = 0 THEN
        RETURN;
    END IF;
    RETURN QUERY
        WITH t AS (SELECT p.id, p.gid, p.n::int AS slot
                     FROM unnest(ids, gids) WITH ORDINALITY AS p(id, gid, n)),
             u AS (
                UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1,
                       worker = p_workers[t.slot], started_at = clock_timestamp(),
                       updated_at = clock_timestamp(), finished_at = NULL
                  FROM t
                 WHERE j.id = t.id
                RETURNING t.slot, j.id, t.gid, j.group_id, j.attempts, j.max_attempts,
                          j.timeout, j.data)
        SELECT u.slot, u.id, u.gid, u.group_id, u.attempts,
               coalesce(u.max_attempts, p_max_attempts),
               (extract(epoch FROM u.timeout) * 1000)::bigint, u.data::text, a.keys, a.vals
          FROM u, LATERAL (
              SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
                     coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
                FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object'
                                     THEN u.data ELSE '{}' END) e
               WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
         ORDER BY u.slot;
END
$$;

-- ---------------------------------------------------------------- maintenance

-- One pass of housekeeping, run by every daemon about once a second on its
-- maintenance session; a transaction-level try-lock lets exactly one of
-- them work at a time and the others return at once (they never wait or
-- fight). Each step is bounded by p_limit rows and takes row locks with
-- SKIP LOCKED only, for the length of this short transaction:
--   1. queued jobs past expires_at end `cancelled`, reason `expired`
--      (attempts kept), in every queue, served or not;
--   2. cancel requests: a job that went back to `queued` is cancelled; the
--      requests of finished or deleted jobs are dropped;
--   3. retention (only queues listed in p_queues, with p_retention_ms > 0):
--      the oldest finished jobs past it are deleted, and the group rows of
--      groups that have nothing left to run.
-- Returns what it did; `more` is true when a step hit p_limit (call again
-- soon). `locked` is false when another daemon holds the lock.
CREATE FUNCTION pgjobd.maintain(p_queues text[], p_retention_ms bigint[], p_limit int,
                                OUT locked boolean, OUT expired int, OUT deleted int,
                                OUT more boolean)
LANGUAGE plpgsql AS $$
DECLARE
    i int;
    n int;
BEGIN
    expired := 0;
    deleted := 0;
    more := false;
    locked := pg_try_advisory_xact_lock(1886020105, 0);
    IF NOT locked THEN
        RETURN;
    END IF;

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
            RETURNING j.queue, j.group_id),
        gone AS (
            -- A group with nothing left to run needs no lock row; a job
            -- enqueued into it later gets a new one (the INSERT trigger, or
            -- the claim when it raced with this delete).
            DELETE FROM pgjobd.groups g
             WHERE g.id IN (SELECT gr.id FROM pgjobd.groups gr
                             WHERE (gr.queue, gr.group_id) IN
                                   (SELECT DISTINCT d.queue, d.group_id FROM d
                                     WHERE d.group_id IS NOT NULL)
                               AND NOT EXISTS (
                                   SELECT 1 FROM pgjobd.jobs u
                                    WHERE u.queue = gr.queue AND u.group_id = gr.group_id
                                      AND u.status IN ('queued', 'running'))
                             FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT (SELECT count(*) FROM d) INTO n;
        deleted := deleted + n;
        more := more OR n >= p_limit;
    END LOOP;
END
$$;

-- ---------------------------------------------------------------- observing

DROP VIEW pgjobd.queue_stats;
-- Per queue (every queue with jobs, and every paused queue): counts by
-- status, the age of the oldest queued job that is due, paused, and jobs
-- that ended `failed` in the last hour.
CREATE VIEW pgjobd.queue_stats AS
WITH s AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'queued')    AS queued,
           count(*) FILTER (WHERE status = 'running')   AS running,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'failed')    AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           max(now() - run_at) FILTER (WHERE status = 'queued' AND run_at <= now())
                                                        AS oldest_queued_age,
           count(*) FILTER (WHERE status = 'failed' AND finished_at > now() - interval '1 hour')
                                                        AS failed_last_hour
      FROM pgjobd.jobs
     GROUP BY queue)
SELECT coalesce(s.queue, p.queue) AS queue,
       coalesce(s.queued, 0) AS queued,
       coalesce(s.running, 0) AS running,
       coalesce(s.succeeded, 0) AS succeeded,
       coalesce(s.failed, 0) AS failed,
       coalesce(s.cancelled, 0) AS cancelled,
       s.oldest_queued_age,
       p.queue IS NOT NULL AS paused,
       coalesce(s.failed_last_hour, 0) AS failed_last_hour
  FROM s FULL JOIN pgjobd.paused_queues p ON p.queue = s.queue;

-- ---------------------------------------------------------------- roles

-- Who inserted the job: the role a producer's row-level security policy
-- (below) matches, so that a producer reads its own jobs only. Producers
-- cannot write it (it is not among their INSERT columns). A default that is
-- not volatile: adding the column does not rewrite the table.
ALTER TABLE pgjobd.jobs ADD COLUMN created_by text NOT NULL DEFAULT current_user;

-- Grants to the group roles pgjobd_producer and pgjobd_worker, those of them
-- that exist (pgjobd.setup_roles() creates them). Idempotent; every later
-- migration calls it again. A producer may INSERT a job's input columns and
-- read its own jobs (row-level security on created_by); nothing in a row can
-- name a command or reach the command's environment except as PGJOBD_ARG_*.
-- A worker may run the protocol and the operator functions on every job,
-- and owns nothing (it cannot drop or alter).
--
-- Row-level security is turned on once pgjobd_producer exists: from then on
-- a role other than the owner (and superusers) sees and writes jobs only
-- through these policies, that is, as a member of one of the two roles.
CREATE FUNCTION pgjobd.grant_roles() RETURNS void
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
                WITH CHECK (created_by = current_user);
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
              pgjobd.claim_batch(text, text[], int, int, boolean, bigint[], bigint[], bigint[]),
              pgjobd.try_group_head_v2(text, text, bigint) TO pgjobd_worker;
    END IF;
END
$$;

-- Creates the two NOLOGIN group roles when missing (needs CREATEROLE), then
-- grants. Applications get them with GRANT pgjobd_producer TO app_role.
CREATE FUNCTION pgjobd.setup_roles() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        CREATE ROLE pgjobd_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        CREATE ROLE pgjobd_worker NOLOGIN;
    END IF;
    PERFORM pgjobd.grant_roles();
END
$$;

-- Functions are executable by PUBLIC by default; the operator functions and
-- the protocol are for workers (and the owner) only. Trigger functions need
-- no EXECUTE right to fire.
REVOKE EXECUTE ON FUNCTION pgjobd.cancel(bigint), pgjobd.pause(text), pgjobd.resume(text),
       pgjobd.maintain(text[], bigint[], int), pgjobd.grant_roles(), pgjobd.setup_roles(),
       pgjobd.claim_batch(text, text[], int, int, boolean, bigint[], bigint[], bigint[]),
       pgjobd.try_group_head_v2(text, text, bigint),
       pgjobd.claim(text, text, int, int), pgjobd.hold(),
       pgjobd.try_group_head(text, text, bigint),
       pgjobd.start_job(bigint, bigint, text, int) FROM PUBLIC;

SELECT pgjobd.grant_roles();
