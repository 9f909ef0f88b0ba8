-- 006_fencing.sql - schema version 6: every claim is bounded in time on both
-- sides (fencing).
--
-- Until version 5 a running job could be taken over as soon as PostgreSQL
-- released its locks. PostgreSQL releases them when it ends the session,
-- which it may do while the daemon is alive but cannot see it: a daemon
-- paused by SIGSTOP, or cut off by the network, whose session the server
-- ends (keepalive, tcp_user_timeout, idle_session_timeout, a DBA's
-- pg_terminate_backend, a restart). The daemon's command then ran on while
-- another daemon ran the same job.
--
-- Version 6 adds liveness that the server can judge by itself:
--
--   pgjobd.workers   one row per running daemon (an instance: a restarted
--                    daemon registers a new row). The daemon's heartbeat
--                    session moves alive_until forward, to the server's time
--                    plus the daemon's fence deadline plus a margin, every
--                    fifth of that deadline.
--   daemon side      the daemon's supervisor process (not paused with the
--                    daemon, not in its process group) SIGKILLs every command
--                    once the deadline has passed since the daemon *sent* its
--                    last heartbeat that succeeded.
--   server side      a running job whose locks are free is taken over only
--                    once its daemon's alive_until has passed: by then the
--                    commands of that daemon have been dead for at least the
--                    margin.
--
-- A heartbeat is sent at daemon time t; it commits at server time T >= t and
-- sets alive_until = T + deadline + margin; the supervisor kills at
-- t + deadline (the daemon's CLOCK_BOOTTIME). So a takeover, at server time
-- after alive_until, comes at least `margin` after the kill, as long as the
-- two clocks advance at the same rate to within the margin over one
-- deadline, and the server's wall clock is not stepped forward by more than
-- the margin (NTP slewing is fine).
--
-- A job claimed by a daemon that is alive but does not hold it (the claim's
-- answer was lost with the claimer's session, or the slot meant to hold it
-- lost its own session before it could) is handed back by that daemon: its
-- claimer's orphan pass gives back the daemon's own running jobs that none of
-- its slots hold (p_skip lists the held ones), with the attempt not counted,
-- because the command never started; a slot whose command was killed when it
-- lost its session releases its job itself (pgjobd.release_claim), counting
-- the attempt.
--
-- Fencing tokens: every claim draws the next value of pgjobd.fence_seq and
-- stores it in jobs.fence; the command gets it as PGJOBD_FENCE. The sequence
-- is global, so the token increases with every claim of a group (and of an
-- ungrouped job) whoever claims it.
--
-- Also in this version:
--   - a job's timeout and max_attempts are ceilings: the claim returns the
--     smaller of the job's and the queue's (p_timeout_ms, p_max_attempts);
--   - max_data: a job whose data, as stored, is larger than the queue's
--     limit is never loaded: the claim ends it `failed`, reason
--     `data_too_large`, and the group's next job may start.

CREATE TABLE pgjobd.workers (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL,        -- host:pid, the prefix of jobs.worker
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    fence_ms    integer NOT NULL,     -- the daemon's deadline, for display
    alive_until timestamptz NOT NULL
);
CREATE INDEX workers_name ON pgjobd.workers (name);

CREATE SEQUENCE pgjobd.fence_seq;

-- The daemon instance (pgjobd.workers.id) that claimed the job, and the
-- claim's fencing token. NULL worker_id: claimed by a daemon older than
-- version 6 (judged by its locks alone).
ALTER TABLE pgjobd.jobs ADD COLUMN worker_id bigint, ADD COLUMN fence bigint;

-- The margin added to a daemon's deadline on the server side.
CREATE FUNCTION pgjobd.fence_margin(p_fence_ms int) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(1000, p_fence_ms / 5) * interval '1 millisecond'
$$;

-- A daemon starts: a new instance row, alive for one deadline plus margin.
CREATE FUNCTION pgjobd.register_worker(p_name text, p_fence_ms int) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO pgjobd.workers (name, fence_ms, alive_until)
    VALUES (p_name, p_fence_ms, clock_timestamp() + p_fence_ms * interval '1 millisecond'
                                + pgjobd.fence_margin(p_fence_ms))
    RETURNING id
$$;

-- The heartbeat. false: the instance was declared dead (its alive_until
-- passed, or an operator released it) and may have lost its jobs to other
-- daemons; it must not claim again under this id. Never revives a lapsed
-- row: its jobs may already run elsewhere.
CREATE FUNCTION pgjobd.heartbeat(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgjobd.workers w
       SET alive_until = clock_timestamp() + w.fence_ms * interval '1 millisecond'
                         + pgjobd.fence_margin(w.fence_ms)
     WHERE w.id = p_id AND w.alive_until > clock_timestamp();
    RETURN FOUND;
END
$$;

-- The daemon's supervisor, once every command of the instance is dead (or
-- the daemon at a clean exit): its jobs may be taken over at once.
CREATE FUNCTION pgjobd.worker_gone(p_id bigint) RETURNS void
LANGUAGE sql AS $$
    UPDATE pgjobd.workers SET alive_until = '-infinity' WHERE id = p_id
$$;

-- The operator declares the daemon `host:pid` dead (every instance of that
-- name). Its transaction-mode jobs are taken over once their locks are free
-- too. Returns the number of instances released.
CREATE FUNCTION pgjobd.release_worker(p_worker text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    UPDATE pgjobd.workers w SET alive_until = '-infinity'
     WHERE w.name = split_part(p_worker, ':', 1) || ':' || split_part(p_worker, ':', 2)
       AND w.alive_until > '-infinity';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Rows of instances long gone that no running job names any more.
CREATE FUNCTION pgjobd.forget_workers() RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgjobd.workers w
     WHERE w.alive_until < clock_timestamp() - interval '1 day'
       AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs j
                        WHERE j.status = 'running' AND j.worker_id = w.id);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- A slot lost the session that held job p_id (claim p_fence) and its command
-- is dead, or it never started it: put the job back. Returns
--   'released'  done: p_started, an attempt that counts (`failed` once the
--               job's attempts reach p_max_attempts, else `queued` after
--               p_retry_ms); not p_started, queued again with the attempt
--               given back;
--   'locked'    the row is still locked (the old session's backend has not
--               ended yet): try again later;
--   'gone'      the claim is not there any more (finished, or taken over).
CREATE FUNCTION pgjobd.release_claim(p_id bigint, p_fence bigint, p_started boolean,
                                     p_error jsonb, p_max_attempts int, p_retry_ms bigint)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    a int;
BEGIN
    SELECT j.attempts INTO a FROM pgjobd.jobs j
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
               updated_at = clock_timestamp()
         WHERE j.id = p_id;
    ELSIF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = p_id) THEN
        UPDATE pgjobd.jobs j SET status = 'cancelled', error = p_error,
               finished_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE j.id = p_id;
        DELETE FROM pgjobd.cancel_requests c WHERE c.job_id = p_id;
    ELSIF a >= p_max_attempts THEN
        UPDATE pgjobd.jobs j SET status = 'failed', error = p_error,
               finished_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE j.id = p_id;
    ELSE
        UPDATE pgjobd.jobs j SET status = 'queued', error = p_error,
               run_at = clock_timestamp() + p_retry_ms * interval '1 millisecond',
               updated_at = clock_timestamp()
         WHERE j.id = p_id;
    END IF;
    RETURN 'released';
END
$$;

-- Version 3's claim_batch with fencing. New parameters:
--   p_worker_id    the calling daemon's instance (pgjobd.workers.id): jobs it
--                  claims carry it and a new fencing token; a daemon that is
--                  not alive claims nothing;
--   p_timeout_ms   the queue's timeout (0: none), a ceiling for the job's;
--   p_max_data     the queue's max_data in bytes.
-- The orphan pass now distinguishes:
--   - the caller's own running jobs that are not in p_skip and not locked:
--     claimed for this daemon but held by none of its slots (the claim's
--     answer was lost, or the slot's session went before it held the job);
--     their command never started, so they go back to `queued` with the
--     attempt given back;
--   - other daemons' running jobs: taken over only when both their locks
--     are free and their daemon's alive_until has passed (see the top).
DROP FUNCTION pgjobd.claim_batch(text, text[], int, int, boolean, bigint[], bigint[], bigint[]);
CREATE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[],
                                   p_max_attempts int, p_timeout_ms bigint, p_max_data bigint,
                                   p_scan int, p_orphans boolean, p_release_jobs bigint[],
                                   p_release_groups bigint[], p_skip bigint[])
RETURNS TABLE (slot int, job_id bigint, group_row bigint, group_id text, attempts int,
               max_attempts int, timeout_ms bigint, fence bigint, data text, arg_keys text[],
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
    own boolean;
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

    -- A daemon whose heartbeat lapsed may have lost its jobs already: it
    -- starts nothing until it has registered again.
    IF NOT EXISTS (SELECT 1 FROM pgjobd.workers w
                    WHERE w.id = p_worker_id AND w.alive_until > clock_timestamp()) THEN
        RETURN;
    END IF;

    -- Paused: start nothing, not even orphans (running one again is a
    -- start). resume() sends the NOTIFY that brings us back.
    IF EXISTS (SELECT 1 FROM pgjobd.paused_queues p WHERE p.queue = p_queue) THEN
        DELETE FROM pgjobd.waiting w WHERE w.queue = p_queue AND w.pid = pg_backend_pid();
        RETURN;
    END IF;

    -- Orphans first. The bridge is tried before the rows: a live claim
    -- holds one or the other, so live jobs are never row-locked here.
    IF p_orphans THEN
        DELETE FROM pgjobd.waiting w
         WHERE w.queue = p_queue
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid);
        FOR r IN SELECT j.id, j.group_id, j.attempts, j.max_attempts, j.worker_id
                   FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'running'
                  ORDER BY j.id
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            CONTINUE WHEN r.id = ANY(p_skip);
            own := r.worker_id IS NOT DISTINCT FROM p_worker_id;
            -- Another daemon's job: only once that daemon's claim lapsed.
            CONTINUE WHEN NOT own AND EXISTS (
                SELECT 1 FROM pgjobd.workers w
                 WHERE w.id = r.worker_id AND w.alive_until > clock_timestamp());
            gid := NULL;
            IF r.group_id IS NOT NULL THEN
                SELECT g.id INTO gid FROM pgjobd.groups g
                 WHERE g.queue = p_queue AND g.group_id = r.group_id;
                IF gid IS NULL THEN
                    -- maintain() deleted it in a race with this job's
                    -- claim; the job row lock (below) still tells whether
                    -- its daemon holds it.
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
            IF own THEN
                -- Claimed for us, held by none of our slots: it never
                -- started. Queued again, the attempt given back; it is a
                -- candidate again below, in its turn.
                UPDATE pgjobd.jobs j SET status = 'queued', attempts = j.attempts - 1,
                       worker = NULL, worker_id = NULL, started_at = NULL,
                       updated_at = clock_timestamp()
                 WHERE j.id = r.id;
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
            IF r.attempts >= least(coalesce(r.max_attempts, p_max_attempts), p_max_attempts) THEN
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

    -- Data larger than max_data (as stored: pg_column_size reads the size
    -- without loading a TOASTed value) is never loaded: the job fails and
    -- its slot stays idle for this call. Its bridge goes with the caller's
    -- next call like any other; a group's next job may start after it.
    UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(),
           updated_at = clock_timestamp(), worker = NULL, worker_id = NULL,
           error = jsonb_build_object('reason', 'data_too_large', 'exit_code', NULL,
                   'signal', NULL, 'stderr', NULL,
                   'message', 'data is larger than the queue''s max_data',
                   'data_bytes', pg_column_size(j.data), 'max_data', p_max_data)
     WHERE j.id = ANY(ids) AND pg_column_size(j.data) > p_max_data;

    RETURN QUERY
        WITH t AS (SELECT p.id, p.gid, p.n::int AS slot
                     FROM unnest(ids, gids) WITH ORDINALITY AS p(id, gid, n)),
             u AS (
                UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1,
                       worker = p_workers[t.slot], worker_id = p_worker_id,
                       fence = nextval('pgjobd.fence_seq'),
                       started_at = clock_timestamp(),
                       updated_at = clock_timestamp(), finished_at = NULL
                  FROM t
                 WHERE j.id = t.id AND j.status IN ('queued', 'running')
                RETURNING t.slot, j.id, t.gid, j.group_id, j.attempts, j.max_attempts,
                          j.timeout, j.fence, j.data)
        SELECT u.slot, u.id, u.gid, u.group_id, u.attempts,
               least(coalesce(u.max_attempts, p_max_attempts), p_max_attempts),
               -- NULL: the queue's timeout applies. A job's own timeout
               -- is at least 1 ms and never above a queue's non-zero one.
               CASE WHEN u.timeout IS NULL THEN NULL
                    WHEN p_timeout_ms > 0
                    THEN least(p_timeout_ms,
                               greatest(1, ceil(extract(epoch FROM u.timeout) * 1000)))::bigint
                    ELSE greatest(1, ceil(extract(epoch FROM u.timeout) * 1000))::bigint END
               AS job_timeout_ms,
               u.fence, u.data::text, a.keys, a.vals
          FROM u, LATERAL (
              SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
                     coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
                FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object'
                                     THEN u.data ELSE '{}' END) e
               WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
         ORDER BY u.slot;
END
$$;

REVOKE EXECUTE ON FUNCTION
       pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[],
                          bigint[], bigint[]),
       pgjobd.register_worker(text, int), pgjobd.heartbeat(bigint), pgjobd.worker_gone(bigint),
       pgjobd.release_worker(text), pgjobd.forget_workers(),
       pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint) FROM PUBLIC;

-- Version 3's grants, and the new table, sequence and functions for the
-- worker role.
CREATE OR REPLACE FUNCTION pgjobd.grant_fencing() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobd.workers TO pgjobd_worker;
        GRANT USAGE ON SEQUENCE pgjobd.fence_seq TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION
              pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                 bigint[], bigint[], bigint[]),
              pgjobd.register_worker(text, int), pgjobd.heartbeat(bigint),
              pgjobd.worker_gone(bigint), pgjobd.release_worker(text),
              pgjobd.forget_workers(),
              pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint)
              TO pgjobd_worker;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.grant_fencing() FROM PUBLIC;

-- grant_roles() of version 3 granted EXECUTE on the old claim_batch by its
-- signature, which is gone: it now grants what version 3 did minus that,
-- then the fencing grants.
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
              pgjobd.try_group_head_v2(text, text, bigint) TO pgjobd_worker;
    END IF;
    PERFORM pgjobd.grant_fencing();
END
$$;

SELECT pgjobd.grant_roles();
