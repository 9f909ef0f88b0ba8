-- 001_init.sql - pgjobd schema version 1: jobs, group lock rows, wake-ups,
-- queue_stats, and the claim protocol's two functions.
--
-- Claim protocol (lock mode `transaction`). The status a job is given when it
-- starts must be committed (others see `running`, `worker`, `attempts`, and a
-- crash is counted), yet the job must stay locked while its command runs, with
-- no instant in between at which another daemon could take it:
--
--   1. pgjobd.claim(queue, ...)   one statement in its own transaction.
--      Picks the job (row locks taken with FOR UPDATE SKIP LOCKED while it
--      looks), takes a SESSION-level advisory lock (the "bridge") on the job
--      (ungrouped) or on its group, marks the row running/attempts+1, commits.
--      The row locks end with that commit; the bridge survives it.
--   2. BEGIN; pgjobd.hold()       in the same session, pipelined right behind
--      step 1. Takes FOR UPDATE row locks on the group row and the job row,
--      then drops the bridge. This transaction stays open while the command
--      runs: it is the claim.
--   3. UPDATE ... outcome; COMMIT  releases the row locks.
--
-- A job is claimable by another daemon only if its row (and its group's row)
-- can be locked AND its bridge lock is free: at every instant of a live claim
-- one of the two is held, and both vanish together with the session when a
-- daemon dies (guarantee 4: crash detection by lock). A `running` row that
-- passes both tests is an orphan: its daemon is gone, and it is taken over at
-- once, counting a new attempt.
--
-- Group exclusivity and order: a group's jobs start only while its row in
-- pgjobd.groups is locked by the claimer, and only the group's head (the
-- smallest id among its queued or running jobs) may start.

CREATE TABLE pgjobd.jobs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue        text NOT NULL
                 CONSTRAINT "queue must be 1 to 63 characters of A-Z a-z 0-9 _ . -"
                 CHECK (queue ~ '^[A-Za-z0-9_.-]{1,63}$'),
    group_id     text,
    data         jsonb NOT NULL DEFAULT '{}',
    priority     integer NOT NULL DEFAULT 0,
    run_at       timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    max_attempts integer CONSTRAINT "max_attempts must be at least 1" CHECK (max_attempts >= 1),
    timeout      interval CONSTRAINT "timeout must be positive" CHECK (timeout > interval '0'),
    dedupe_key   text,
    status       text NOT NULL DEFAULT 'queued'
                 CONSTRAINT "status must be queued, running, succeeded, failed or cancelled"
                 CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    attempts     integer NOT NULL DEFAULT 0,
    result       jsonb,
    error        jsonb,
    worker       text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz,
    finished_at  timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 80);
-- fillfactor leaves room on each page so that updates of rows can stay on
-- the same page.

-- Ready jobs of a queue in start order, split by whether they have a group
-- (each row is in exactly one, so this costs what a single index would): the
-- best ungrouped job is always one index probe away, however many grouped
-- jobs wait behind a running head.
CREATE INDEX jobs_ready_free ON pgjobd.jobs (queue, priority, run_at, id)
    WHERE status = 'queued' AND group_id IS NULL;
CREATE INDEX jobs_ready_grouped ON pgjobd.jobs (queue, priority, run_at, id)
    WHERE status = 'queued' AND group_id IS NOT NULL;
-- A group's unfinished jobs in id order: finds a group's head in one probe.
CREATE INDEX jobs_group_head ON pgjobd.jobs (queue, group_id, id)
    WHERE status IN ('queued', 'running') AND group_id IS NOT NULL;
-- Running jobs: the orphan scan reads only these (as many as busy slots).
CREATE INDEX jobs_running ON pgjobd.jobs (queue, id)
    WHERE status = 'running';

-- One lock row per (queue, group_id), created by the INSERT trigger, so a
-- producer never has to know about it. Claimers lock it; producers never do.
CREATE TABLE pgjobd.groups (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue    text NOT NULL,
    group_id text NOT NULL,
    UNIQUE (queue, group_id)
);

-- After each INSERT statement: create missing group rows (ON CONFLICT DO
-- NOTHING does not wait for a group row locked by a running job), and wake
-- the daemons once per queue per statement (NOTIFY is delivered at commit,
-- and identical notifications of one transaction are folded into one).
CREATE FUNCTION pgjobd.jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    INSERT INTO pgjobd.groups (queue, group_id)
        SELECT DISTINCT n.queue, n.group_id FROM new_jobs n WHERE n.group_id IS NOT NULL
        ON CONFLICT DO NOTHING;
    FOR q IN SELECT DISTINCT n.queue FROM new_jobs n LOOP
        PERFORM pg_notify('pgjobd', q);
    END LOOP;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_inserted AFTER INSERT ON pgjobd.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobd.jobs_inserted();

CREATE VIEW pgjobd.queue_stats AS
SELECT queue,
       count(*) FILTER (WHERE status = 'queued')    AS queued,
       count(*) FILTER (WHERE status = 'running')   AS running,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed')    AS failed,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
       max(now() - run_at) FILTER (WHERE status = 'queued' AND run_at <= now())
                                                    AS oldest_queued_age
FROM pgjobd.jobs
GROUP BY queue;

-- Advisory lock keys of the bridge: (class, object) int4 pairs, a key space
-- apart from single-bigint advisory locks an application may use.
--   class 1886020100 ('pjb' + 4): a job id (low 32 bits)
--   class 1886020103 ('pjb' + 7): a group row id (low 32 bits)
CREATE FUNCTION pgjobd.bridge_key(p_job bigint, p_group bigint, OUT k1 int, OUT k2 int)
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_group IS NULL THEN 1886020100 ELSE 1886020103 END,
           (coalesce(p_group, p_job) & 2147483647)::int
$$;

-- The job's text environment arguments: top-level scalars of data.
CREATE FUNCTION pgjobd.job_args(p_data jsonb, OUT keys text[], OUT vals text[])
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}'),
           coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}')
    FROM jsonb_each(CASE WHEN jsonb_typeof(p_data) = 'object' THEN p_data ELSE '{}' END) e
    WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')
$$;

-- Try to take group g of queue q for its job `jid`: lock the group row
-- (SKIP LOCKED), check that jid is the group's head (the smallest id among
-- its queued or running jobs: strict FIFO), take the bridge lock and lock the
-- job row. Returns the group row's id; 0 when the group is busy (its row is
-- locked or its bridge held: no job of it can start now); -1 when jid may not
-- start but another job of the group may (jid is not the head). Nothing is
-- kept on failure but row locks that end with the claim's transaction.
CREATE FUNCTION pgjobd.try_group_head(q text, g text, jid bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    gid bigint;
    head bigint;
    k record;
BEGIN
    SELECT gr.id INTO gid FROM pgjobd.groups gr
     WHERE gr.queue = q AND gr.group_id = g FOR UPDATE SKIP LOCKED;
    IF gid IS NULL THEN
        RETURN 0;
    END IF;
    SELECT j.id INTO head FROM pgjobd.jobs j
     WHERE j.queue = q AND j.group_id = g AND j.status IN ('queued', 'running')
     ORDER BY j.id LIMIT 1;
    IF head IS DISTINCT FROM jid THEN
        RETURN -1;
    END IF;
    k := pgjobd.bridge_key(jid, gid);
    IF NOT pg_try_advisory_lock(k.k1, k.k2) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = jid AND j.status = 'queued' AND j.run_at <= now()
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        PERFORM pg_advisory_unlock(k.k1, k.k2);
        RETURN -1;
    END IF;
    RETURN gid;
END
$$;

-- Mark a locked, bridged, queued job running for p_worker and return the
-- row pgjobd.claim() returns. Records the bridge for pgjobd.hold().
-- Times are clock_timestamp(): a claim's transaction may have begun before
-- the previous job of the group finished, and started_at must follow the
-- order in which jobs really start.
CREATE FUNCTION pgjobd.start_job(jid bigint, gid bigint, p_worker text, p_max_attempts int)
RETURNS TABLE (job_id bigint, group_id text, attempts int, max_attempts int,
               timeout_ms bigint, data text, arg_keys text[], arg_vals text[])
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('pgjobd.claim', jid || ':' || coalesce(gid::text, ''), false);
    RETURN QUERY
        WITH u AS (
            UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1,
                   worker = p_worker, started_at = clock_timestamp(),
                   updated_at = clock_timestamp(), finished_at = NULL
             WHERE j.id = jid
            RETURNING j.id, j.group_id, j.attempts, j.max_attempts, j.timeout, j.data)
        SELECT u.id, u.group_id, u.attempts, coalesce(u.max_attempts, p_max_attempts),
               (extract(epoch FROM u.timeout) * 1000)::bigint, u.data::text, a.keys, a.vals
          FROM u, pgjobd.job_args(u.data) a;
END
$$;

-- Step 1 of the protocol (see the top of this file). Runs in its own
-- transaction. Returns no row when nothing can start now. Locks, while it
-- runs: candidate job rows and group rows, FOR UPDATE SKIP LOCKED (never
-- waits); on success it also holds the bridge advisory lock, which outlives
-- its transaction and is released by pgjobd.hold().
CREATE FUNCTION pgjobd.claim(p_queue text, p_worker text, p_max_attempts int, p_scan int)
RETURNS TABLE (job_id bigint, group_id text, attempts int, max_attempts int,
               timeout_ms bigint, data text, arg_keys text[], arg_vals text[])
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    gid bigint;
    k record;
    f record;
    got bigint;
    busy text[] := '{}';
    scan_cut boolean := false;
    n int := 0;
BEGIN
    PERFORM set_config('pgjobd.claim', '', false);

    -- Orphans first: running rows nobody holds (their daemon is gone).
    FOR r IN SELECT j.id, j.group_id, j.attempts, j.max_attempts FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND j.status = 'running'
             ORDER BY j.id FOR UPDATE SKIP LOCKED
    LOOP
        gid := NULL;
        IF r.group_id IS NOT NULL THEN
            SELECT g.id INTO gid FROM pgjobd.groups g
             WHERE g.queue = p_queue AND g.group_id = r.group_id FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN gid IS NULL;
        END IF;
        k := pgjobd.bridge_key(r.id, gid);
        CONTINUE WHEN NOT pg_try_advisory_lock(k.k1, k.k2);
        IF r.attempts >= coalesce(r.max_attempts, p_max_attempts) THEN
            -- Its last attempt died with its daemon: that is a failed attempt.
            UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(),
                   updated_at = clock_timestamp(),
                   error = jsonb_build_object('reason', 'lost_lock', 'exit_code', NULL,
                           'signal', NULL, 'stderr', NULL,
                           'message', 'the daemon running this job lost its claim')
             WHERE j.id = r.id;
            PERFORM pg_advisory_unlock(k.k1, k.k2);
            CONTINUE;
        END IF;
        -- An orphan: run it again, counting a new attempt.
        RETURN QUERY SELECT * FROM pgjobd.start_job(r.id, gid, p_worker, p_max_attempts);
        RETURN;
    END LOOP;

    -- The best ready ungrouped job: one probe of jobs_ready_free, locked.
    SELECT j.id, j.priority, j.run_at INTO f FROM pgjobd.jobs j
     WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NULL
       AND j.run_at <= now()
     ORDER BY j.priority, j.run_at, j.id
     FOR UPDATE SKIP LOCKED LIMIT 1;

    -- Grouped jobs that would start before it, in start order (the row
    -- comparison is an index condition, so the scan stops at the ungrouped
    -- candidate; without one, a sentinel bound keeps it an index condition
    -- rather than an OR that would filter the whole index). The cursor
    -- takes no locks; a candidate is locked (group row first, then job row)
    -- only when it is tried. Rows of busy groups are skipped; the scan is
    -- bounded by p_scan.
    FOR r IN SELECT j.id, j.group_id FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NOT NULL
               AND j.run_at <= now()
               AND (j.priority, j.run_at, j.id) <
                   (coalesce(f.priority, 2147483647), coalesce(f.run_at, 'infinity'),
                    coalesce(f.id, 9223372036854775807))
             ORDER BY j.priority, j.run_at, j.id
             -- The LIMIT is the scan's bound, and it also keeps the generic
             -- plan that plpgsql settles on after five calls an ordered index
             -- scan: without it the planner may sort the whole backlog.
             LIMIT p_scan + 1
    LOOP
        n := n + 1;
        IF n > p_scan THEN
            scan_cut := true;
            EXIT;
        END IF;
        CONTINUE WHEN r.group_id = ANY(busy);
        got := pgjobd.try_group_head(p_queue, r.group_id, r.id);
        IF got <= 0 THEN
            -- A busy group is skipped for the rest of this claim; a job that
            -- is not its group's head is not: the head (say, back from a
            -- retry with a later run_at) may come later in the scan.
            IF got = 0 THEN
                busy := busy || r.group_id;
            END IF;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT * FROM pgjobd.start_job(r.id, got, p_worker, p_max_attempts);
        RETURN;
    END LOOP;

    IF f.id IS NOT NULL THEN
        k := pgjobd.bridge_key(f.id, NULL);
        IF pg_try_advisory_lock(k.k1, k.k2) THEN
            RETURN QUERY SELECT * FROM pgjobd.start_job(f.id, NULL, p_worker, p_max_attempts);
            RETURN;
        END IF;
    END IF;

    -- The bounded scan met only busy groups (one group's long backlog can
    -- fill it). For liveness, visit each group's head once, skipping from
    -- group to group through jobs_group_head (a loose index scan), and start
    -- the first that can start. Rare, and O(groups) rather than O(jobs).
    IF scan_cut THEN
        FOR r IN WITH RECURSIVE heads AS (
                     (SELECT j.group_id, j.id, j.status, j.run_at FROM pgjobd.jobs j
                       WHERE j.queue = p_queue AND j.group_id IS NOT NULL
                         AND j.status IN ('queued', 'running')
                       ORDER BY j.group_id, j.id LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at FROM heads h,
                       LATERAL (SELECT j.group_id, j.id, j.status, j.run_at FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND j.group_id > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY j.group_id, j.id LIMIT 1) nx)
                 SELECT h.group_id, h.id FROM heads h
                  WHERE h.status = 'queued' AND h.run_at <= now()
        LOOP
            CONTINUE WHEN r.group_id = ANY(busy);
            got := pgjobd.try_group_head(p_queue, r.group_id, r.id);
            CONTINUE WHEN got <= 0;
            RETURN QUERY SELECT * FROM pgjobd.start_job(r.id, got, p_worker, p_max_attempts);
            RETURN;
        END LOOP;
    END IF;
END
$$;

-- Step 2: called in the transaction that will hold the claim while the
-- command runs. Locks the group row, then the job row (FOR UPDATE, waiting:
-- only SKIP LOCKED probes of other claimers can hold them, briefly), then
-- drops the bridge. Returns the job id, or NULL when step 1 claimed nothing.
CREATE FUNCTION pgjobd.hold() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c text := current_setting('pgjobd.claim', true);
    jid bigint;
    gid bigint;
    k record;
BEGIN
    IF c IS NULL OR c = '' THEN
        RETURN NULL;
    END IF;
    jid := split_part(c, ':', 1)::bigint;
    gid := nullif(split_part(c, ':', 2), '')::bigint;
    IF gid IS NOT NULL THEN
        PERFORM 1 FROM pgjobd.groups g WHERE g.id = gid FOR UPDATE;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j WHERE j.id = jid FOR UPDATE;
    k := pgjobd.bridge_key(jid, gid);
    PERFORM pg_advisory_unlock(k.k1, k.k2);
    PERFORM set_config('pgjobd.claim', '', false);
    RETURN jid;
END
$$;
