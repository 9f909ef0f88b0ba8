-- 007_held_groups.sql - schema version 7: groups held back by a retry cost a
-- claim nothing.
--
-- A job whose attempt failed goes back to `queued` with run_at in the future
-- (its backoff). As its group's head (the group's smallest id among queued
-- and running jobs) it holds back the later jobs of its group, which are
-- ready. Up to version 6 those later jobs stayed in jobs_ready_grouped, so
-- every claim met each of them: try_group_head_v2 locked the group row (a
-- row lock writes the tuple's xmax: WAL) or created it, found the head
-- waiting and gave up; after p_scan of them the claim fell back to a loose
-- index scan over the head of every group. With 20,000 such groups and
-- nothing to claim, one claim read 88,000 buffers in 120-180 ms and wrote
-- 56 KB of WAL (2,000 groups: 13,000 buffers, 36 ms), against 6 buffers and
-- 0.06 ms with none.
--
-- Version 7 takes such a group out of the claim's scan for as long as its
-- head waits:
--
--   jobs.held_until  on a queued job of a group whose head is queued with
--                    run_at in the future: that run_at (on the head too).
--                    jobs_ready_grouped leaves marked jobs out; the small
--                    index jobs_held finds them by time.
--   marking          the claim reads each grouped candidate's head before it
--                    locks anything. When the head waits out a backoff, the
--                    claim marks the head and the group's ready later jobs
--                    (pgjobd.hold_group); so does its walk over the groups'
--                    heads, when it walks. At most p_scan groups per call.
--                    Once marked, the group costs a claim nothing, and no
--                    claim writes for it.
--   unmarking        by time: every claim first clears the marks whose time
--                    has come (one probe of jobs_held), so that the head,
--                    due now, and the later jobs are back in the scan;
--                    early: when the head stops waiting sooner (cancelled,
--                    expired, deleted, its run_at or group changed), the
--                    trigger jobs_head_changed clears the marks of the
--                    group's later jobs in the same transaction; and a
--                    marked job that leaves `queued` or its group, or whose
--                    run_at changes, loses its own mark (trigger
--                    jobs_unheld).
--
-- A mark never lets a job start: whether a job heads its group is still
-- decided by try_group_head_v2 under the group row lock. A mark only keeps a
-- job out of the scan while it could not start anyway (its group's head
-- waits, and strict FIFO holds the later jobs back), and it goes at its time
-- whatever happens.
--
-- WAL: marking is a row lock and an update per job, once per backoff, and
-- unmarking one more update when the backoff ends. Nothing in between: the
-- claim locks (or creates) a group row only for a candidate that heads its
-- group, so groups whose head runs or waits are skipped without a write.
--
-- Measured as above after this version (tests/integration/t_47_held_groups.sh,
-- `make bench` figure 7): with 20,000 such groups a claim reads what it reads
-- with none (14-16 buffers finding nothing, about 60 taking a job) and writes
-- no WAL for them. The first claims after 20,000 groups became held pay for
-- it: 25 claims, 1.5-3 s and about 20-26 MB of WAL in all. While they do, a
-- claim's scan may still be cut short by held groups not marked yet, as any
-- scan cut by p_scan (see version 2), and take a ready job that comes later
-- in start order than one behind them; once the groups are marked, start
-- order across groups holds again. What every claim pays: one probe of
-- jobs_held, and a second read of a grouped candidate's head when it heads
-- its group (once without a lock, once under the group row lock); every
-- UPDATE or DELETE of a job reads the old row once more for the AFTER
-- trigger.

ALTER TABLE pgjobd.jobs ADD COLUMN held_until timestamptz;

-- The claim's grouped scan: ready grouped jobs that no waiting head holds
-- back. Rebuilt with the new condition (the migration's transaction holds
-- the table's lock meanwhile).
DROP INDEX pgjobd.jobs_ready_grouped;
CREATE INDEX jobs_ready_grouped ON pgjobd.jobs (queue, priority, run_at, id)
    WHERE status = 'queued' AND group_id IS NOT NULL AND held_until IS NULL;
-- Marked jobs by the time their mark runs out: the claim's unmarking is one
-- probe of it.
CREATE INDEX jobs_held ON pgjobd.jobs (queue, held_until)
    WHERE status = 'queued' AND held_until IS NOT NULL;

-- Marks group g held until p_until, the run_at of its head p_head, if
-- p_head is still queued and waiting for that time: the head itself and the
-- group's ready later jobs, at most p_limit rows (by id). The head is marked
-- too because a waiting job is still in jobs_ready_grouped, whose scan reads
-- (though never returns) the index entries of jobs not due yet. Returns the
-- number of jobs marked; 0 when it did nothing.
--
-- Locks: a transaction-level try-lock on the group's marks (class
-- 1886020108, a hash of queue and group; a collision only makes a claim skip
-- marking a group for one call), then row locks on the jobs it marks, with
-- SKIP LOCKED (a locked one stays unmarked, and costs its claims a visit).
-- Never waits. The try-lock is what jobs_head_changed waits for: a change
-- of the head committed before the try-lock was taken is seen by the
-- statement that checks p_head again (READ COMMITTED: a new snapshot); one
-- not committed yet either holds the lock already (this call marks nothing)
-- or takes it when this transaction has ended, and then sees and clears the
-- marks made here.
CREATE FUNCTION pgjobd.hold_group(q text, g text, p_head bigint, p_until timestamptz,
                                  p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    IF NOT pg_try_advisory_xact_lock(1886020108, hashtext(q || E'\n' || g)) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = p_head AND j.status = 'queued' AND j.run_at = p_until
       AND j.run_at > statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp());
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

-- A marked job that leaves `queued`, its queue or its group, or whose
-- run_at changes, loses its mark: a mark stands only on a queued job of the
-- group, and at the time, that set it (a job put back to `queued` later is
-- judged afresh; a head whose run_at moves waits for its new time only).
CREATE FUNCTION pgjobd.jobs_unheld() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.held_until := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_unheld BEFORE UPDATE OF status, run_at, queue, group_id ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.held_until IS NOT NULL
                       AND (NEW.status <> 'queued' OR NEW.run_at IS DISTINCT FROM OLD.run_at
                            OR NEW.queue <> OLD.queue
                            OR NEW.group_id IS DISTINCT FROM OLD.group_id))
    EXECUTE FUNCTION pgjobd.jobs_unheld();

-- A grouped job that was queued with run_at in the future (a head waiting
-- out its backoff, or any job that might be one) changed or went: the later
-- jobs of its group may be able to start before their marks run out, so the
-- marks go now. The WHEN clause keeps this off every path of the protocol:
-- claims start ready jobs, and outcomes update running ones.
--
-- Waits for the group's marking try-lock (see hold_group): a claim that is
-- marking the group right now holds it until its transaction ends (a claim
-- is short and never waits itself), and the UPDATE below, a new statement,
-- then sees its marks. Waits for row locks on the later jobs like any
-- UPDATE. Under REPEATABLE READ or SERIALIZABLE the statement's snapshot is
-- the transaction's, older than marks committed since: every later queued
-- job is updated instead, so that a mark made since raises a serialization
-- failure (the caller retries) rather than stay.
CREATE FUNCTION pgjobd.jobs_head_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1886020108, hashtext(OLD.queue || E'\n' || OLD.group_id));
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

CREATE TRIGGER jobs_head_changed AFTER UPDATE OF status, run_at, queue, group_id OR DELETE
    ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.status = 'queued' AND OLD.group_id IS NOT NULL AND OLD.run_at > now())
    EXECUTE FUNCTION pgjobd.jobs_head_changed();

-- Version 6's claim_batch (see 006_fencing.sql and 002_fast_claim.sql for
-- the protocol and what each statement locks), with the same signature, and
-- further:
--   - it first clears the marks whose time has come;
--   - its grouped scan reads only jobs no waiting head holds back;
--   - a grouped candidate that does not head its group costs a plain read of
--     its head: no group row is locked or created for it; when that head
--     waits out a backoff, the group's later jobs are marked held.
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
    head record;
    budget int := p_scan;   -- groups this call may still mark held
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

    -- Marks whose time has come: the head they wait for is due now, so it
    -- and its group's later jobs go back into jobs_ready_grouped before the
    -- scans below. A plain probe of jobs_held first: usually there are none.
    -- At most p_scan a call (the rest go in the next calls), row locks with
    -- SKIP LOCKED (a locked one is cleared by a later call).
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
        IF pg_try_advisory_lock(1886020100, (u_ids[ui] & 2147483647)::int) THEN
            ids := ids || u_ids[ui];
            gids := gids || NULL::bigint;
        END IF;
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
                -- A head waiting out a backoff that is not marked yet (marks
                -- made above are seen here): this walk meets it anyway, and
                -- may as well mark its group, so that the next calls neither
                -- meet its later jobs in their ordered scan nor need this
                -- walk because of them.
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

-- Version 6's grants, and the marking function (called by claim_batch with
-- the caller's rights).
REVOKE EXECUTE ON FUNCTION pgjobd.hold_group(text, text, bigint, timestamptz, int) FROM PUBLIC;
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
              pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint),
              pgjobd.hold_group(text, text, bigint, timestamptz, int)
              TO pgjobd_worker;
    END IF;
END
$$;

SELECT pgjobd.grant_roles();
