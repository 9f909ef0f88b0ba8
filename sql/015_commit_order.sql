-- 015_commit_order.sql - schema version 15: a group's jobs start in the order
-- they became visible (commit order), not in id order.
--
-- Up to version 14 a group's head was its unfinished job with the smallest
-- id. An id is drawn when the row is inserted, not when it is committed: a
-- transaction that inserted job A, stayed open, and committed after another
-- one had inserted and committed job B made A (the smaller id) start before
-- B, although B had been visible first.
--
-- The order key. A grouped job's place in its group is
--
--     coalesce(commit_seq, id)
--
-- (the index jobs_group_head is on it). The constraint trigger
-- jobs_commit_order is DEFERRABLE INITIALLY DEFERRED: it runs when the
-- producer's COMMIT is sent, before the commit record is written, once per
-- grouped job the transaction inserted, in the order they were inserted.
-- It places the job after every unfinished job of its group that is visible
-- at that moment: a job whose id already puts it there keeps its id as its
-- key (commit_seq stays NULL, and the row is not written again); any other
-- takes a fresh number, commit_seq = nextval of the id sequence, which is
-- greater than every id and number drawn so far and smaller than every one
-- drawn later. Because the jobs of one transaction are placed in insertion
-- (id) order, each after the ones before it, they keep their id order.
--
-- What "the order they became visible" means, exactly. For two jobs J and K
-- of one group: if K was committed when J's transaction began its COMMIT
-- (ran its deferred triggers), K starts before J. In particular, a producer
-- that sends a COMMIT only after another producer's COMMIT has returned
-- gets its jobs placed after the other's. Jobs committed together start in
-- id order. What is left open is a window, from the moment a transaction's
-- deferred triggers run until its commit becomes visible: the rest of its
-- deferred triggers, the WAL flush of the commit, and with synchronous
-- replication the standby's answer. A transaction of the same group that
-- commits inside that window may be placed either way. That is what a
-- careful operator can expect: two producers whose COMMITs are in flight at
-- the same time have no order between them that either could observe (each
-- learns that its job is enqueued only when its own COMMIT returns), and
-- closing the window would take a lock that makes a group's producers wait
-- for each other's commits.
--
-- Variations, all following from the trigger's nature:
--   - SET CONSTRAINTS ALL IMMEDIATE (or naming jobs_commit_order) in a
--     producer's transaction places its jobs as each statement ends instead
--     of at commit, and the window runs from there to the commit;
--     PREPARE TRANSACTION places them at PREPARE.
--   - Under REPEATABLE READ or SERIALIZABLE the trigger's queries would see
--     the transaction's snapshot, not the jobs committed since: there every
--     grouped job takes a fresh number at commit, so the order is the order
--     in which the transactions began to commit.
--   - A finished job put back to `queued` (pgjobd.retry(), or an UPDATE of
--     its status), and a queued job moved to another queue or group, are
--     placed the same way, by the same function (trigger
--     jobs_commit_order_requeued), when that transaction commits: after the
--     jobs of its group already visible, like a job enqueued by that
--     transaction. A job put back to `queued` after a failed attempt (from
--     `running`) keeps its key: it holds back the later jobs of its group
--     until its retry has run.
--   - A fresh number comes from the id sequence, so ids are not consecutive
--     where one was drawn (they never were promised to be).
--
-- Rows enqueued before this version have commit_seq NULL: their key is their
-- id, as their order was until now. Nothing is backfilled (no row is
-- rewritten); every number drawn later is greater than their ids.
--
-- Why this design. Measured on a 2-core VM shared with other work (so
-- only the differences count): backend CPU per INSERT over 20,000
-- single-row grouped INSERT transactions made by a procedure (no parsing or
-- network; synchronous_commit off), and one 100,000-row INSERT ... SELECT
-- into 1,000 groups (100 jobs per group and transaction) and into 100,000
-- groups (one each):
--                                           single-row       bulk, per job
--                                           CPU    WAL       100/grp 1/grp
--   version 8 (id order)                    36 us  490 B      9 us    7 us
--   a fresh number for every grouped job    73 us  900 B     34 us   31 us
--   at commit (the plain design)
--   this version                            50 us  510 B     28 us   13 us
-- The plain design UPDATEs every grouped row at commit: a second row
-- version, which cannot be a HOT update since the key is indexed, with new
-- entries in every index of the row, and as much WAL again. This version
-- costs one index probe for a job enqueued alone (two or three for the jobs
-- of a multi-row enqueue into one group), and writes only for a job whose
-- transaction was overtaken by another commit of its group. Its price is
-- the column enqueued_xact (8 bytes a row), which tells a transaction's own
-- jobs, placed in their turn, from jobs it must follow. Ungrouped jobs pay
-- that column only: their INSERT queues no trigger event. Like a deferred
-- foreign key, the trigger keeps one pending event per grouped row in the
-- producer's memory until COMMIT (a few dozen bytes each: a transaction
-- that enqueues millions of grouped jobs should be split). Also considered: a
-- transaction-level lock per group taken by the INSERT, so that a group's
-- producers commit in id order (exact, no window, no writes, but a
-- producer's INSERT would wait for another producer's open transaction, and
-- producers of two groups could deadlock); and commit timestamps
-- (track_commit_timestamp is off by default, they are not unique, and they
-- cannot be indexed with the rows). A claim reads what it read before
-- (tests/integration/t_45_backlog.sh, t_47_held_groups.sh).
--
-- Functions restated from their latest versions, each with only these
-- changes (everything that means "the group's head" or "the later jobs of
-- the group" now orders by the key):
--   try_group_head_v2  (version 9) its head read orders by the key;
--   hold_group         (version 9) reads the head's key, and marks the later
--                      jobs by key (key >= the head's, in key order);
--   jobs_head_changed  (version 9) the later jobs are those with a greater
--                      key than the changed job's;
--   claim_batch        (version 14) the head read in its grouped scan orders
--                      by the key; its loose index scan over the groups'
--                      heads orders by (group_id, key).
-- (Written against version 8 and restated on versions 9 and 14 when they
-- landed first; the changes above are the same.)
--
-- Locks taken by this migration (in one transaction with the rest of the
-- upgrade): ACCESS EXCLUSIVE on pgjobd.jobs, for the new columns and to
-- replace jobs_group_head, so the upgrade waits for running jobs of lock
-- mode `transaction` to finish, and INSERTs and claims wait for its commit;
-- the new index is built by one read of the table meanwhile. Daemons of
-- version 8 that are still running call claim_batch and try_group_head_v2
-- with unchanged signatures, so they start jobs in commit order at once,
-- until their listener reconnects and stops them on the version mismatch.

-- commit_seq: NULL, or the number a grouped job was given at its commit
-- when its id would not do (see the top). enqueued_xact: the transaction
-- that inserted the job (pg_current_xact_id(), the top-level transaction
-- even inside a savepoint), so that the trigger can tell that transaction's
-- own jobs from the others; NULL for rows enqueued before this version. Set
-- as a default in a second statement: adding a column with a volatile
-- default would rewrite the table. Producers may write neither column (they
-- are not among their INSERT columns).
ALTER TABLE pgjobd.jobs ADD COLUMN commit_seq bigint, ADD COLUMN enqueued_xact xid8;
ALTER TABLE pgjobd.jobs ALTER COLUMN enqueued_xact SET DEFAULT pg_current_xact_id();

-- A group's unfinished jobs in start order: finds a group's head in one
-- probe, the job just before or after a given one in one probe, and the
-- jobs after it in one range scan.
DROP INDEX pgjobd.jobs_group_head;
CREATE INDEX jobs_group_head ON pgjobd.jobs (queue, group_id, (coalesce(commit_seq, id)))
    WHERE status IN ('queued', 'running') AND group_id IS NOT NULL;

-- The deferred trigger (see the top): places the job NEW after every
-- unfinished job of its group that is visible now. NEW is the row as its
-- event left it (a later change in the same transaction that matters has an
-- event of its own). Under READ COMMITTED each statement here sees the
-- latest committed state.
--
-- The job keeps its id as its key when nothing of its group is above it
-- (one probe: the single-row INSERT's whole cost). When something is, the
-- job is renumbered, except in a multi-row enqueue into one group, where
-- what is above a job the transaction inserted is the transaction's own
-- later job, placed after this one in its turn. Such a job keeps its key
-- too if
--   - the transaction's job of the group just below it kept its key: that
--     one, or the first of the run it belongs to, found nothing above it
--     but the transaction's own later jobs, this one among them (a job of
--     another transaction committed since then did so while this one was
--     committing: the window); or
--   - nothing is above it but the transaction's own jobs not placed yet (a
--     scan over them, once per group and transaction);
-- and provided no job of the transaction was renumbered in this group
-- before (looked for only when one was renumbered at all in this
-- transaction: the setting pgjobd.renumbered), because a renumbered job
-- sorts above every id, and the jobs inserted after it must follow it. A
-- job this transaction put back to `queued` or moved (an UPDATE event) is
-- renumbered whenever anything of its group is above it.
--
-- Writes only the job's own row, which no other session can see or lock
-- yet (an inserted row), or which this transaction has locked already (an
-- updated one): it never waits. SECURITY DEFINER: a producer's row-level
-- security would hide the other producers' jobs of the group, and a
-- producer has no right on the id sequence.
CREATE FUNCTION pgjobd.jobs_commit_order() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    k bigint := coalesce(NEW.commit_seq, NEW.id);
    me xid8;
    r record;
    own_above boolean;
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE the statements here would see
    -- the transaction's snapshot, not what was committed since: renumber.
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT o.commit_seq, o.enqueued_xact INTO r FROM pgjobd.jobs o
         WHERE o.queue = NEW.queue AND o.group_id = NEW.group_id
           AND o.status IN ('queued', 'running') AND o.id <> NEW.id
           AND coalesce(o.commit_seq, o.id) > k
         ORDER BY coalesce(o.commit_seq, o.id) LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL; -- last of its group already
        END IF;
        me := pg_current_xact_id();
        own_above := TG_OP = 'INSERT' AND r.commit_seq IS NULL AND r.enqueued_xact = me;
        IF own_above AND current_setting('pgjobd.renumbered', true) = 'on' THEN
            -- A renumbered job of this group would be its last.
            SELECT o.commit_seq, o.enqueued_xact INTO r FROM pgjobd.jobs o
             WHERE o.queue = NEW.queue AND o.group_id = NEW.group_id
               AND o.status IN ('queued', 'running')
             ORDER BY coalesce(o.commit_seq, o.id) DESC LIMIT 1;
            own_above := r.commit_seq IS NULL AND r.enqueued_xact = me;
        END IF;
        IF own_above THEN
            SELECT o.commit_seq, o.enqueued_xact INTO r FROM pgjobd.jobs o
             WHERE o.queue = NEW.queue AND o.group_id = NEW.group_id
               AND o.status IN ('queued', 'running')
               AND coalesce(o.commit_seq, o.id) < k
             ORDER BY coalesce(o.commit_seq, o.id) DESC LIMIT 1;
            IF FOUND AND r.commit_seq IS NULL AND r.enqueued_xact = me THEN
                RETURN NULL; -- placed with the transaction's job just below
            END IF;
            IF NOT EXISTS (SELECT 1 FROM pgjobd.jobs o
                            WHERE o.queue = NEW.queue AND o.group_id = NEW.group_id
                              AND o.status IN ('queued', 'running') AND o.id <> NEW.id
                              AND coalesce(o.commit_seq, o.id) > k
                              AND (o.commit_seq IS NOT NULL
                                   OR o.enqueued_xact IS DISTINCT FROM me)) THEN
                RETURN NULL; -- only its own transaction's later jobs above
            END IF;
        END IF;
    END IF;
    UPDATE pgjobd.jobs j SET commit_seq = nextval('pgjobd.jobs_id_seq')
     WHERE j.id = NEW.id AND j.status = 'queued' AND j.group_id IS NOT NULL;
    PERFORM set_config('pgjobd.renumbered', 'on', true);
    RETURN NULL;
END
$$;

-- Grouped jobs as they are inserted; nothing for ungrouped ones (the WHEN
-- clause is evaluated at the INSERT, so they queue no event at all).
CREATE CONSTRAINT TRIGGER jobs_commit_order AFTER INSERT ON pgjobd.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.group_id IS NOT NULL)
    EXECUTE FUNCTION pgjobd.jobs_commit_order();

-- A finished job back to `queued`, or a queued job moved to another queue
-- or group. Claims (queued to running) and outcomes (running to anything,
-- a retry's `queued` included) do not match the WHEN clause.
CREATE CONSTRAINT TRIGGER jobs_commit_order_requeued
    AFTER UPDATE OF status, queue, group_id ON pgjobd.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.group_id IS NOT NULL AND NEW.status = 'queued'
                       AND (OLD.status IN ('succeeded', 'failed', 'cancelled')
                            OR NEW.queue <> OLD.queue
                            OR NEW.group_id IS DISTINCT FROM OLD.group_id))
    EXECUTE FUNCTION pgjobd.jobs_commit_order();

REVOKE EXECUTE ON FUNCTION pgjobd.jobs_commit_order() FROM PUBLIC;

-- Version 9's function (sql/009_row_locks.sql); its head read orders by the key.
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
     ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
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
    -- jid heads the group, but a job later in its order may run: one that a
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

-- Version 9's function; the head's key is read with the head, and the later
-- jobs are those after it in key order.
CREATE OR REPLACE FUNCTION pgjobd.hold_group(q text, g text, p_head bigint, p_until timestamptz,
                                             p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    n int;
    head_key bigint;
BEGIN
    SELECT coalesce(j.commit_seq, j.id) INTO head_key FROM pgjobd.jobs j
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
                     WHERE s.queue = q AND s.group_id = g
                       AND coalesce(s.commit_seq, s.id) >= head_key
                       AND s.status = 'queued' AND s.held_until IS NULL
                       AND (s.id = p_head OR s.run_at <= statement_timestamp())
                     ORDER BY coalesce(s.commit_seq, s.id) LIMIT p_limit
                     FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- Version 9's trigger function; the group's later jobs are those with a
-- greater key than the changed job's.
CREATE OR REPLACE FUNCTION pgjobd.jobs_head_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.queue = OLD.queue AND j.group_id = OLD.group_id
           AND coalesce(j.commit_seq, j.id) > coalesce(OLD.commit_seq, OLD.id)
           AND j.status = 'queued'
           AND j.held_until IS NOT NULL;
    ELSE
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.queue = OLD.queue AND j.group_id = OLD.group_id
           AND coalesce(j.commit_seq, j.id) > coalesce(OLD.commit_seq, OLD.id)
           AND j.status = 'queued';
    END IF;
    RETURN NULL;
END
$$;

-- Version 14's claim_batch (sql/014_schedules.sql; see 009_row_locks.sql,
-- 007_held_groups.sql, 006_fencing.sql and 002_fast_claim.sql for the
-- protocol and what each statement locks), with
-- the same signature; the grouped scan's read of a candidate's head, and the
-- loose index scan over the groups' heads, order by the key. Also: a
-- compressed value whose text is over 16 times max_data fails like one over
-- max_data as stored (see below).
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[],
                                   p_max_attempts int, p_timeout_ms bigint, p_max_data bigint,
                                   p_scan int, p_orphans boolean, p_release_jobs bigint[],
                                   p_release_groups bigint[], p_skip bigint[])
RETURNS TABLE (slot int, job_id bigint, group_row bigint, group_id text, attempts int,
               max_attempts int, timeout_ms bigint, fence bigint, data text, arg_keys text[],
               arg_vals text[],
               -- 014: the job's schedule and tick (ISO 8601, UTC), NULL if none
               schedule text, scheduled_for text)
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
             ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
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
                       ORDER BY j.group_id, coalesce(j.commit_seq, j.id) LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at, nx.expires_at,
                            nx.held_until FROM heads h,
                       LATERAL (SELECT j.group_id, j.id, j.status, j.run_at, j.expires_at,
                                       j.held_until
                                  FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND j.group_id > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY j.group_id, coalesce(j.commit_seq, j.id) LIMIT 1) nx)
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

    -- Data larger than max_data is never loaded: the job fails and its slot
    -- stays idle for this call; a group's next job may start after it. The
    -- size is the data's as stored (pg_column_size reads it without loading
    -- a TOASTed value). A value that compresses very well (20 MB of one
    -- repeated character is stored in about 230 kB) would still bring far
    -- more than that into the daemon, so a compressed value whose text is
    -- longer than 16 times max_data fails too: a daemon never loads more
    -- than that per job. Only compressed values are decompressed for this.
    UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(),
           updated_at = clock_timestamp(), worker = NULL, worker_id = NULL,
           error = jsonb_build_object('reason', 'data_too_large', 'exit_code', NULL,
                   'signal', NULL, 'stderr', NULL,
                   'message', 'data is larger than the queue''s max_data',
                   'data_bytes', pg_column_size(j.data),
                   'text_bytes', CASE WHEN pg_column_compression(j.data) IS NOT NULL
                                      THEN octet_length(j.data::text) END,
                   'max_data', p_max_data)
     WHERE j.id = ANY(ids)
       AND (pg_column_size(j.data) > p_max_data
            OR (pg_column_compression(j.data) IS NOT NULL
                AND octet_length(j.data::text) > 16 * p_max_data));

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
                          j.timeout, j.fence, j.data,
                          j.schedule, j.scheduled_for)  -- 014
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
               u.fence, u.data::text, a.keys, a.vals,
               -- 014: the schedule and its tick
               u.schedule,
               to_char(u.scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
          FROM u, LATERAL (
              SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
                     coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
                FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object'
                                     THEN u.data ELSE '{}' END) e
               WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
         ORDER BY u.slot;
END
$$;

SELECT pgjobd.grant_roles();
