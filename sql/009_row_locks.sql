-- 009_row_locks.sql - schema version 9: pgjobd takes no advisory locks, only
-- row locks that no role without pgjobd rights can take.
--
-- Any role that can connect may take any advisory lock (pg_advisory_lock and
-- its kin need no privilege), and pg_locks shows every advisory key held, to
-- every role: a key cannot be kept secret. Up to version 8 the claim, the
-- maintenance pass and the INSERT trigger took advisory locks with keys
-- anyone could compute (job ids, group row ids, hashes of queue, group and
-- dedupe key names), so a session of any role holding them stalled new jobs
-- and groups, held back every daemon's maintenance, and made a producer's
-- INSERT with a dedupe key wait until it let go. From this version on the
-- schema and the daemon take no advisory lock at all. What each lock did,
-- and why what replaces it holds:
--
--   bridges      (session-level, on a job id or a group row id, held by the
--                claimer from its claim's commit until the slot held the job
--                with row locks.) Redundant since fencing (version 6) for
--                what they were meant to cover, with one exception:
--                - another daemon's running job is taken over only when its
--                  rows can be locked AND its daemon's alive_until has
--                  passed. A daemon whose alive_until passed never starts a
--                  command again under that claim: the slot's hold checks,
--                  under the job row's lock, that its daemon is alive by the
--                  server's clock (and a lapsed row is never revived), so a
--                  job taken over while its claimer's slot had not held it
--                  yet is never run by that slot;
--                - our own running jobs are handed back by our orphan pass
--                  only when they are not in p_skip, which lists every job a
--                  slot of ours is being handed, holds, or still answers for
--                  (src/claimer.c, src/daemon.c). A claimer's own bridges
--                  never stopped its own orphan pass anyway (advisory locks
--                  are re-entrant within a session): p_skip always did that;
--                - a queued job is a candidate only while its status is
--                  `queued`, and a claim takes it under its row lock: a job
--                  between claim and hold is `running`, and is no candidate;
--                - the exception: a group's lock row is not locked between
--                  the claim's commit and the slot's hold, and a job of the
--                  group with a smaller id may become its head meanwhile (a
--                  producer's transaction that commits late, a job put back
--                  to `queued`). The group's bridge kept that job from
--                  starting. Now a group with a `running` job does not start
--                  another (try_group_head_v2 checks it under the group row's
--                  lock, through the small index jobs_group_running): the
--                  running job's claim commits its status and lets go of the
--                  group row in one commit, and its outcome commits the new
--                  status and lets go of both rows in one commit, so at every
--                  instant the group is either locked or visibly running
--                  (also once the daemon died: its job stays `running` until
--                  it is taken over). A claim never makes a second job of a
--                  group `running`.
--   group rows   (a try-lock on a hash of queue and group, so that two
--                claimers never create the same pgjobd.groups row at once.)
--                Dropped: a claimer that creates a group row another claimer
--                is creating waits for that claim's commit (a claim is one
--                short transaction that never waits for a job), then finds
--                the group taken. Two claims meet a queue's groups in the
--                same order (start order; the walk over every group's head
--                comes only after the ordered scan went through the same
--                candidates), so they wait for each other in a cycle only
--                when their snapshots disagree about the heads, or the
--                orphan pass recreates a group row that maintain() deleted
--                in a race; then PostgreSQL's deadlock detector ends one of
--                them (after deadlock_timeout) and its claimer, on a new
--                session, claims again.
--   hold_group   (a try-lock on a hash of queue and group, which the trigger
--                jobs_head_changed waited for.) Now hold_group locks the head
--                it marks for, with FOR UPDATE SKIP LOCKED: whoever changes
--                or deletes that head locks the same row, so a change that
--                came first makes hold_group mark nothing (the head is
--                locked, or no longer waiting), and a change that comes later
--                waits for the claim's commit and then clears its marks.
--   maintenance  (a transaction-level try-lock, so that one daemon at a time
--                runs the pass.) Now a row lock, FOR UPDATE SKIP LOCKED, on
--                the one row of pgjobd.maintenance_lock. Locking a row with
--                SELECT ... FOR UPDATE (or SHARE) needs the UPDATE privilege
--                on the table, LOCK TABLE needs it (or DELETE, TRUNCATE) for
--                any mode that conflicts with a row lock, and a foreign key
--                to the table needs REFERENCES: only the owner and the worker
--                role hold any of these.
--   dedupe       (a transaction-level lock on a hash of queue and dedupe
--                key, taken by the INSERT trigger.) Now the trigger, which
--                runs as the owner, inserts the key into the unlogged table
--                pgjobd.dedupe_locks, on which no other role has any
--                privilege, and that row is deleted when the producer's
--                transaction commits (a deferred trigger). A second producer
--                of the same key meets the first one's row in the primary
--                key and waits for the first one's transaction to end, as
--                before; then, under READ COMMITTED, it sees the first job.
--                Only a producer granted the queue gets that far
--                (jobs_check_grant fires first), so a producer can delay the
--                dedupe INSERTs of its own queues only, as it always could
--                through the unique index jobs_dedupe.
--
-- Also: the dead functions of version 1 (claim, hold, try_group_head,
-- start_job, bridge_key, job_args; the daemon has not called them since
-- version 2) are dropped, and with them the last mention of an advisory lock
-- in a live function. claim_batch keeps its signature; its p_release_jobs
-- and p_release_groups (the bridges to drop) are ignored, so that daemons of
-- version 8 go on claiming against this schema until they are upgraded.
--
-- Locks taken by this migration, in one transaction with every other
-- statement of the upgrade: SHARE on pgjobd.jobs while jobs_group_running is
-- built (one scan of the table; INSERTs and outcomes wait, running jobs do
-- not), then, as in every migration once producers exist, ACCESS EXCLUSIVE
-- on pgjobd.jobs in grant_roles(), which waits for running jobs of lock mode
-- `transaction` to finish. Daemons of version 8 keep running against this
-- schema (this migration changes no signature they call) until their
-- listener reconnects and stops them on the version mismatch.

-- ---------------------------------------------------------------- dead functions

DROP FUNCTION IF EXISTS pgjobd.claim(text, text, int, int);
DROP FUNCTION IF EXISTS pgjobd.hold();
DROP FUNCTION IF EXISTS pgjobd.try_group_head(text, text, bigint);
DROP FUNCTION IF EXISTS pgjobd.start_job(bigint, bigint, text, int);
DROP FUNCTION IF EXISTS pgjobd.bridge_key(bigint, bigint);
DROP FUNCTION IF EXISTS pgjobd.job_args(jsonb);

-- ---------------------------------------------------------------- groups

-- Running jobs of a group: as many entries as running grouped jobs, so the
-- check "does the group run a job" is one probe of a small index.
CREATE INDEX jobs_group_running ON pgjobd.jobs (queue, group_id)
    WHERE status = 'running' AND group_id IS NOT NULL;

-- Version 5's function without advisory locks: group g of queue q starts its
-- job jid only if, under the group row's lock, jid heads the group and no
-- job of the group is running (see the top of this file). A missing group
-- row is created; a claimer that creates the same row at the same time
-- makes this wait for its claim's commit, after which the group is busy.
-- Returns the group row's id; 0 when no job of the group can start now (its
-- row is locked, a job of it runs, or its head waits for a retry or has
-- expired); -1 when jid may not start but the group's ready head may.
CREATE OR REPLACE FUNCTION pgjobd.try_group_head_v2(q text, g text, jid bigint) RETURNS bigint
LANGUAGE plpgsql SET enable_seqscan = off AS $$
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
            RETURN 0; -- another claim created it since our first look
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
    -- jid heads the group, but a job with a larger id may run: one that a
    -- claim started before jid became visible (or queued again), whose slot
    -- does not hold the group row yet, or whose daemon died.
    IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                WHERE j.queue = q AND j.group_id = g AND j.status = 'running') THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = jid AND j.status = 'queued' AND j.run_at <= statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    RETURN gid;
END
$$;

-- Version 7's function, with the head's row lock instead of the advisory
-- try-lock: marks group g held until p_until, the run_at of its head p_head,
-- if p_head is still the group's queued job waiting for that time; the head
-- and the group's ready later jobs, at most p_limit rows (by id). Returns the
-- number of jobs marked; 0 when it did nothing.
--
-- Locks, never waiting: the head's row (FOR UPDATE SKIP LOCKED), then the
-- rows it marks (SKIP LOCKED: a locked one stays unmarked, and costs its
-- claims a visit). Whoever changes or deletes the head locks its row too
-- (and then clears the marks, in jobs_head_changed): a change committed
-- before this call's check is seen by the check (a new snapshot, or the
-- row's newest version under FOR UPDATE); one not committed yet holds the
-- row, and this call marks nothing; one that comes later waits for this
-- claim's commit, and then sees and clears the marks made here.
CREATE OR REPLACE FUNCTION pgjobd.hold_group(q text, g text, p_head bigint, p_until timestamptz,
                                             p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = p_head AND j.queue = q AND j.group_id = g AND j.status = 'queued'
       AND j.run_at = p_until AND j.run_at > statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- Of the later jobs only ready ones: one with a later run_at of its own
    -- is not in the scan's range; when it is, a claim marks it if need be.
    UPDATE pgjobd.jobs j SET held_until = p_until
     WHERE j.id IN (SELECT s.id FROM pgjobd.jobs s
                     WHERE s.queue = q AND s.group_id = g AND s.id >= p_head
                       AND s.status = 'queued' AND s.held_until IS NULL
                       AND (s.id = p_head OR s.run_at <= statement_timestamp())
                     ORDER BY s.id LIMIT p_limit
                     FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Version 7's trigger function without the advisory lock: the row it fires
-- for is locked by the statement that changed it, and hold_group locks the
-- head it marks for (see there), so a claim marking the group for this row
-- has committed before this runs, and the UPDATE below, a new statement,
-- sees its marks. Waits for row locks on the later jobs like any UPDATE.
-- Under REPEATABLE READ or SERIALIZABLE the statement's snapshot is the
-- transaction's, older than marks committed since: every later queued job
-- is updated instead, so that a mark made since raises a serialization
-- failure (the caller retries) rather than stay.
CREATE OR REPLACE FUNCTION pgjobd.jobs_head_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.queue = OLD.queue AND j.group_id = OLD.group_id AND j.id > OLD.id
           AND j.status = 'queued'
           AND j.held_until IS NOT NULL;
    ELSE
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.queue = OLD.queue AND j.group_id = OLD.group_id AND j.id > OLD.id
           AND j.status = 'queued';
    END IF;
    RETURN NULL;
END
$$;

-- ---------------------------------------------------------------- claims

-- Version 7's claim_batch (see 002_fast_claim.sql, 006_fencing.sql and
-- 007_held_groups.sql for the protocol and what each statement locks),
-- with the same signature, and without bridges:
--   - p_release_jobs and p_release_groups are ignored (daemons of version 8
--     pass the bridges they would have dropped);
--   - the orphan pass judges a running job by its rows' locks and its
--     daemon's liveness alone (see the top of this file);
--   - an ungrouped candidate is taken once its row is locked;
--   - a group starts a job only when none of its jobs runs
--     (try_group_head_v2).
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[],
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
    gid bigint;
    u_ids bigint[];
    u_pri int[];
    u_run timestamptz[];
    nu int;
    ui int := 1;
    busy text[] := '{}';
    n int := 0;
    scan_cut boolean := false;
    own boolean;
    head record;
    budget int := p_scan;   -- groups this call may still mark held
BEGIN
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

    -- Marks whose time has come (see version 7).
    IF EXISTS (SELECT 1 FROM pgjobd.jobs h
                WHERE h.queue = p_queue AND h.status = 'queued'
                  AND h.held_until <= statement_timestamp()) THEN
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.id IN (SELECT h.id FROM pgjobd.jobs h
                         WHERE h.queue = p_queue AND h.status = 'queued'
                           AND h.held_until <= statement_timestamp()
                         ORDER BY h.held_until LIMIT p_scan
                         FOR UPDATE SKIP LOCKED);
    END IF;

    -- Orphans first: running jobs that no slot holds and that may be taken,
    -- our own that none of our slots answers for (not in p_skip: claimed
    -- for us, but never started) and other daemons' whose daemon's
    -- alive_until has passed. A slot that holds a job holds its group row
    -- and its job row; both are tried with SKIP LOCKED, group row first, the
    -- order every claim and hold locks them in.
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
                    -- a slot holds it.
                    INSERT INTO pgjobd.groups (queue, group_id) VALUES (p_queue, r.group_id)
                        ON CONFLICT DO NOTHING RETURNING id INTO gid;
                END IF;
                CONTINUE WHEN gid IS NULL;
                PERFORM 1 FROM pgjobd.groups g WHERE g.id = gid FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
            END IF;
            PERFORM 1 FROM pgjobd.jobs j WHERE j.id = r.id AND j.status = 'running'
             FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            IF own THEN
                -- Claimed for us, held by none of our slots: it never
                -- started. Queued again, the attempt given back; it is a
                -- candidate again below, in its turn.
                UPDATE pgjobd.jobs j SET status = 'queued', attempts = j.attempts - 1,
                       worker = NULL, worker_id = NULL, started_at = NULL,
                       updated_at = clock_timestamp()
                 WHERE j.id = r.id;
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
    -- (Expired rows are filtered here until maintain() cancels them.) A
    -- locked queued job is ours to start: any other claim of it would have
    -- to lock it first.
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
    -- there are enough of those, bounded by p_scan (see version 2). Jobs
    -- marked held are not in jobs_ready_grouped, and not candidates.
    IF coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN SELECT j.id, j.group_id, j.priority, j.run_at FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NOT NULL
                    AND j.held_until IS NULL AND j.run_at <= statement_timestamp()
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
                ids := ids || u_ids[ui];
                gids := gids || NULL::bigint;
                ui := ui + 1;
            END LOOP;
            EXIT WHEN array_length(ids, 1) >= want;
            n := n + 1;
            IF n > p_scan THEN
                scan_cut := true;
                EXIT;
            END IF;
            CONTINUE WHEN r.group_id = ANY(busy);
            -- The group's head, by a plain read of jobs_group_head (no lock,
            -- nothing written). Only a candidate that heads its group goes
            -- on to try_group_head_v2, which locks the group row and checks
            -- the head again under that lock.
            SELECT j.id, j.status, j.run_at, j.expires_at INTO head FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND j.group_id = r.group_id
               AND j.status IN ('queued', 'running')
             ORDER BY j.id LIMIT 1;
            IF head.id IS DISTINCT FROM r.id THEN
                -- A ready head comes later in this scan (or in a later
                -- call); a running head, or one that expired, keeps the
                -- group busy.
                CONTINUE WHEN head.status = 'queued'
                              AND (head.expires_at IS NULL
                                   OR head.expires_at > statement_timestamp())
                              AND head.run_at <= statement_timestamp();
                busy := busy || r.group_id;
                -- A head waiting out a backoff: take the group's later jobs
                -- out of the scan until it is due.
                IF head.status = 'queued' AND head.run_at > statement_timestamp()
                   AND (head.expires_at IS NULL OR head.expires_at > statement_timestamp())
                   AND budget > 0 THEN
                    PERFORM pgjobd.hold_group(p_queue, r.group_id, head.id, head.run_at,
                                              p_scan);
                    budget := budget - 1;
                END IF;
                CONTINUE;
            END IF;
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
        ids := ids || u_ids[ui];
        gids := gids || NULL::bigint;
        ui := ui + 1;
    END LOOP;

    -- The bounded scan met only busy groups: visit each group's head once
    -- (a loose index scan over jobs_group_head), O(groups). Only ready heads
    -- are tried, so only groups that may start have their row locked.
    IF scan_cut AND coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN WITH RECURSIVE heads AS (
                     (SELECT j.group_id, j.id, j.status, j.run_at, j.expires_at, j.held_until
                        FROM pgjobd.jobs j
                       WHERE j.queue = p_queue AND j.group_id IS NOT NULL
                         AND j.status IN ('queued', 'running')
                       ORDER BY j.group_id, j.id LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at, nx.expires_at,
                            nx.held_until FROM heads h,
                       LATERAL (SELECT j.group_id, j.id, j.status, j.run_at, j.expires_at,
                                       j.held_until
                                  FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND j.group_id > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY j.group_id, j.id LIMIT 1) nx)
                 SELECT h.group_id, h.id, h.run_at, h.held_until FROM heads h
                  WHERE h.status = 'queued'
                    AND (h.expires_at IS NULL OR h.expires_at > statement_timestamp())
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            IF r.run_at > statement_timestamp() THEN
                -- A head waiting out a backoff that is not marked yet (see
                -- version 7): mark its group while this walk meets it.
                IF r.held_until IS NULL AND budget > 0 THEN
                    PERFORM pgjobd.hold_group(p_queue, r.group_id, r.id, r.run_at, p_scan);
                    budget := budget - 1;
                END IF;
                CONTINUE;
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
    -- its slot stays idle for this call; a group's next job may start after
    -- it.
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

-- ---------------------------------------------------------------- maintenance

-- The lock of the maintenance pass: one row, locked by the pass that runs.
-- Only the owner and the worker role may lock it (see the top).
CREATE TABLE pgjobd.maintenance_lock (
    one boolean PRIMARY KEY DEFAULT true CONSTRAINT "maintenance_lock has one row" CHECK (one)
);
INSERT INTO pgjobd.maintenance_lock DEFAULT VALUES;

-- Version 3's function, with a row lock instead of the advisory try-lock:
-- of the daemons that call it at once, the one that locks the row of
-- pgjobd.maintenance_lock works, and the others return at once with
-- `locked` false (SKIP LOCKED: they never wait). The lock lasts until the
-- end of the caller's transaction. The rest is as in version 3.
CREATE OR REPLACE FUNCTION pgjobd.maintain(p_queues text[], p_retention_ms bigint[], p_limit int,
                                           OUT locked boolean, OUT expired int,
                                           OUT deleted int, OUT more boolean)
LANGUAGE plpgsql AS $$
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
            -- enqueued into it later gets a new one (its first claim).
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

-- ---------------------------------------------------------------- dedupe

-- The dedupe keys being inserted right now: a row lives from the INSERT
-- trigger of a job with that (queue, dedupe_key) to the end of the
-- inserting transaction (dedupe_lock_done), so the table is empty but for
-- transactions in progress. Written by the two trigger functions below,
-- which run as the owner; no other role has any privilege on it, so no
-- other role can lock, insert or probe a key here. Unlogged: nothing in it
-- outlives its transaction, so it needs no WAL, and after a crash it starts
-- empty.
CREATE UNLOGGED TABLE pgjobd.dedupe_locks (
    queue      text NOT NULL,
    dedupe_key text NOT NULL,
    PRIMARY KEY (queue, dedupe_key)
);

-- Version 3's trigger function (rows with a dedupe_key, after
-- jobs_check_grant), with a row in pgjobd.dedupe_locks instead of the
-- advisory lock. The INSERT of the key's row waits while another
-- transaction has inserted the same key and not ended (the primary key's
-- uniqueness check waits for it, and the row it finds is gone once that
-- transaction has committed or rolled back); so a second producer of a key
-- waits here, and then, under READ COMMITTED, sees the first one's job: the
-- next statement takes a new snapshot. A row of the key that is there for
-- good (inserted earlier in this transaction, or left behind by a
-- transaction that never deleted it) is locked instead. Rows inserted
-- earlier by the same statement are visible too. SECURITY DEFINER: a
-- producer role may insert jobs without reading all of pgjobd.jobs or
-- touching pgjobd.dedupe_locks.
CREATE OR REPLACE FUNCTION pgjobd.jobs_dedupe() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOOP
        INSERT INTO pgjobd.dedupe_locks (queue, dedupe_key)
        VALUES (NEW.queue, NEW.dedupe_key)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        PERFORM 1 FROM pgjobd.dedupe_locks d
         WHERE d.queue = NEW.queue AND d.dedupe_key = NEW.dedupe_key
         FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                WHERE j.queue = NEW.queue AND j.dedupe_key = NEW.dedupe_key
                  AND j.status IN ('queued', 'running')) THEN
        RETURN NULL; -- an unfinished job has this key: insert nothing
    END IF;
    RETURN NEW;
END
$$;

-- A key row goes when its transaction commits: a deferred constraint
-- trigger fires then, in that transaction. (A producer that sets its
-- constraints IMMEDIATE has it deleted at the end of the trigger's INSERT;
-- a concurrent inserter of the key still waits for the producer's
-- transaction, because PostgreSQL's uniqueness check waits for the
-- transaction that inserted a row it finds, deleted since or not.) A
-- rolled-back transaction leaves no row behind either.
CREATE FUNCTION pgjobd.dedupe_lock_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgjobd.dedupe_locks d
     WHERE d.queue = NEW.queue AND d.dedupe_key = NEW.dedupe_key;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER dedupe_lock_done AFTER INSERT ON pgjobd.dedupe_locks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION pgjobd.dedupe_lock_done();

-- ---------------------------------------------------------------- roles

-- The grants of this version, for the roles that exist; idempotent, called
-- by grant_roles(). The worker role locks the maintenance row (UPDATE is
-- what SELECT ... FOR UPDATE needs); pgjobd.dedupe_locks is the owner's
-- alone.
CREATE FUNCTION pgjobd.grant_locks() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, UPDATE ON pgjobd.maintenance_lock TO pgjobd_worker;
    END IF;
END
$$;

-- Version 8's grant_roles(), everything it granted kept, then this
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
END
$$;

REVOKE EXECUTE ON FUNCTION pgjobd.grant_locks() FROM PUBLIC;

SELECT pgjobd.grant_roles();
