-- 002_fast_claim.sql - schema version 2: claims in batches.
--
-- Profiling a busy daemon showed PostgreSQL, not the spawning of
-- commands, setting the pace: every slot claimed for itself, so sixteen
-- sessions probed the head of the same index at once, skipping each other's
-- locked rows and the entries of just-started jobs, and every job paid a
-- PL/pgSQL call, two commits and SQL helper functions that were parsed again
-- on every call. Version 2 keeps the guarantees and the row locks and changes
-- who claims:
--
--   1. One session per queue per daemon, the claimer, runs
--      pgjobd.claim_batch(queue, workers[], ...) in its own transaction. It
--      picks up to one job per idle slot (same order and group rules as
--      version 1), marks each `running` for its slot's worker name with
--      attempts+1, takes the job's bridge advisory lock (session-level) and
--      commits.
--   2. Each slot, in its own session: BEGIN; FOR UPDATE on the group row and
--      the job row (checking that the row is still the one claimed for it:
--      running, its worker, its attempt). That transaction stays open while
--      the command runs; the outcome UPDATE and COMMIT end it.
--   3. The claimer drops the bridges of jobs whose slots hold them (or
--      failed to), in its next call.
--
-- At every instant a claimed job is protected by its bridge (held by the
-- claimer's session) or by its rows (locked by its slot's session), or both;
-- a job protected by neither is an orphan, and any claimer that asks for the
-- orphan pass takes it over. The daemon asks at most once per poll_interval,
-- so a dead daemon's jobs are taken over within that time, by lock, with no
-- timeout (guarantee 4). Readiness is judged against statement_timestamp().
--
-- The version 1 functions stay, unchanged, for daemons of that version during
-- a rolling upgrade.

-- Who needs waking. NOTIFY serialises the commits of the transactions that
-- send one (PostgreSQL queues notifications in commit order under one
-- lock), so a NOTIFY on every enqueue cost 60-80 % of the INSERT throughput
-- of 16 producers. A claimer that leaves slots idle registers here (one row
-- per queue and claimer session, kept by claim_batch); a claimer whose call
-- filled every slot removes its row, because a busy daemon claims again
-- whenever a slot finishes. Producers NOTIFY only a queue with a row. Rows of
-- sessions that are gone are removed by the orphan pass. Unlogged: after a
-- crash the daemons register again with their first claim.
CREATE UNLOGGED TABLE pgjobd.waiting (
    queue text NOT NULL,
    pid   integer NOT NULL,
    since timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, pid)
);

-- Replaces version 1's trigger function: group rows only when the statement
-- has grouped jobs, and one NOTIFY per queue per statement only when a
-- daemon of that queue is waiting. (BEFORE row triggers were tried
-- instead; they were no cheaper for a one-row INSERT.)
CREATE OR REPLACE FUNCTION pgjobd.jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_jobs n WHERE n.group_id IS NOT NULL) THEN
        INSERT INTO pgjobd.groups (queue, group_id)
            SELECT DISTINCT n.queue, n.group_id FROM new_jobs n WHERE n.group_id IS NOT NULL
            ON CONFLICT DO NOTHING;
    END IF;
    PERFORM pg_notify('pgjobd', d.queue)
       FROM (SELECT DISTINCT n.queue FROM new_jobs n) d
      WHERE EXISTS (SELECT 1 FROM pgjobd.waiting w WHERE w.queue = d.queue);
    RETURN NULL;
END
$$;

-- Try to take group g of queue q for its job `jid`: version 1's function with
-- the bridge key inline and readiness at statement_timestamp(). Returns the
-- group row's id; 0 when no job of the group can start now (its row is
-- locked, its bridge held, or its head is running or waiting for a retry);
-- -1 when jid may not start but the group's ready head may.
CREATE FUNCTION pgjobd.try_group_head_v2(q text, g text, jid bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    gid bigint;
    head record;
BEGIN
    SELECT gr.id INTO gid FROM pgjobd.groups gr
     WHERE gr.queue = q AND gr.group_id = g FOR UPDATE SKIP LOCKED;
    IF gid IS NULL THEN
        RETURN 0;
    END IF;
    SELECT j.id, j.status, j.run_at INTO head FROM pgjobd.jobs j
     WHERE j.queue = q AND j.group_id = g AND j.status IN ('queued', 'running')
     ORDER BY j.id LIMIT 1;
    IF head.id IS DISTINCT FROM jid THEN
        -- Only a ready, queued head can start (later in the caller's scan);
        -- a running head, or one waiting out a retry, keeps the group busy.
        IF head.status = 'queued' AND head.run_at <= statement_timestamp() THEN
            RETURN -1;
        END IF;
        RETURN 0;
    END IF;
    IF NOT pg_try_advisory_lock(1886020103, (gid & 2147483647)::int) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = jid AND j.status = 'queued' AND j.run_at <= statement_timestamp()
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        PERFORM pg_advisory_unlock(1886020103, (gid & 2147483647)::int);
        RETURN -1;
    END IF;
    RETURN gid;
END
$$;

-- Step 1. Claims up to one job per element of p_workers and returns them,
-- each with `slot` = the index of the worker it was claimed for (1-based);
-- fewer rows when the queue has no more to start now. Before that it drops
-- the bridges listed in p_release_jobs (ungrouped jobs) and p_release_groups
-- (group row ids). p_skip: jobs this session claimed whose slots do not hold
-- them yet (the session holds their bridges, so the orphan pass must not
-- mistake them for orphans: advisory locks are re-entrant). p_orphans: run
-- the orphan pass. Row locks (FOR UPDATE SKIP LOCKED, never waiting) on
-- candidate job and group rows last until the end of the transaction; the
-- bridges of the returned jobs stay with the session.
--
-- Jobs are picked in start order (priority, run_at, id), ungrouped and
-- grouped interleaved: the best `want` ungrouped jobs come from one probe of
-- jobs_ready_free, and the grouped candidates that sort before the last of
-- them from one bounded scan of jobs_ready_grouped.
CREATE FUNCTION pgjobd.claim_batch(p_queue text, p_workers text[], p_max_attempts int,
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
    SELECT array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.priority ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.run_at ORDER BY c.priority, c.run_at, c.id)
      INTO u_ids, u_pri, u_run
      FROM (SELECT j.id, j.priority, j.run_at FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NULL
               AND j.run_at <= statement_timestamp()
             ORDER BY j.priority, j.run_at, j.id
             FOR UPDATE SKIP LOCKED
             LIMIT want - coalesce(array_length(ids, 1), 0)) c;
    nu := coalesce(array_length(u_ids, 1), 0);

    -- Grouped jobs in start order, up to the last ungrouped candidate when
    -- there are enough of those (the row comparison is an index condition;
    -- without a candidate a sentinel keeps it one), bounded by p_scan (the
    -- LIMIT also keeps the generic plan an ordered index scan). Ungrouped
    -- candidates that sort before a grouped one are picked first. A busy
    -- group is skipped for the rest of the call; a job that is not its
    -- group's head is not (the head may come later in the scan).
    IF coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN SELECT j.id, j.group_id, j.priority, j.run_at FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NOT NULL
                    AND j.run_at <= statement_timestamp()
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

    -- The bounded scan met only busy groups (one group's long backlog can
    -- fill it): visit each group's head once through jobs_group_head (a
    -- loose index scan), O(groups) rather than O(jobs).
    IF scan_cut AND coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN WITH RECURSIVE heads AS (
                     (SELECT j.group_id, j.id, j.status, j.run_at FROM pgjobd.jobs j
                       WHERE j.queue = p_queue AND j.group_id IS NOT NULL
                         AND j.status IN ('queued', 'running')
                       ORDER BY j.group_id, j.id LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at FROM heads h,
                       LATERAL (SELECT j.group_id, j.id, j.status, j.run_at
                                  FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND j.group_id > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY j.group_id, j.id LIMIT 1) nx)
                 SELECT h.group_id, h.id FROM heads h
                  WHERE h.status = 'queued' AND h.run_at <= statement_timestamp()
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
    -- Every picked job is locked and bridged: start the i-th for slot i.
    -- clock_timestamp(): started_at follows the real order of starts.
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
              -- the job's text environment arguments: top-level scalars
              SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
                     coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
                FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object'
                                     THEN u.data ELSE '{}' END) e
               WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
         ORDER BY u.slot;
END
$$;
