-- sql/functions/claim.sql - the claim: how a daemon takes queued jobs.
--
-- The current definitions; `pgjobd migrate` applies this file after the
-- migrations (sql/README, "Where the code is"). The daemon claims with one
-- statement, sql/claim.sql: the common case there, everything else here. The
-- protocol around these functions (the hold, the outcome, the windows between
-- them) is sql/README's "The claim protocol".
--
--   claim_batch     the whole claim: up to one job per idle slot, marked
--                   `running` for it and returned
--   try_group_head  may this group start its head now? (the group row lock)
--   hold_group      mark the later jobs of a group whose head waits out a
--                   backoff, so that claims do not scan them
--
-- claim_batch plans its statements generically (plan_cache_mode): a claim is
-- the statement a busy daemon sends most, and a plan made once per session
-- costs less than one made per call. Like every function of the schema, each
-- runs with search_path = pg_catalog, pg_temp.

-- claim_batch(queue, worker_id, workers, max_attempts, timeout_ms, max_data,
-- scan, orphans, skip, lease_ms): claim up to cardinality(workers) jobs of
-- `queue` for instance worker_id, the i-th for slot i (its worker name
-- workers[i]); lease_ms NULL in lock mode `transaction`, the lease in lock mode
-- `lease`; skip: the running jobs of the queue the caller answers for, which
-- its orphan pass leaves alone. Runs in the caller's transaction, which is the
-- claim: nothing stays locked after its commit. Returns one row per job: its
-- slot (1-based), id, group row (NULL: ungrouped), group id, this attempt's
-- number, the effective max_attempts and timeout, the new fencing token, the
-- data and its top-level scalars as argument keys and values, the
-- schedule and tick that enqueued it, and under a rate its planned start
-- (start_in_ms, start_by_ms: from the claim, for the daemons of version 41;
-- start_at_us, late_us: on the server's clock) with two readings of that
-- clock (stmt_us, clock_us), sql/README "Limits".
--
-- In order: nothing unless the instance is alive and the queue not paused;
-- the marks of held groups that are due cleared; if asked, the orphan pass
-- over the queue's running jobs not in skip; the best ready ungrouped jobs
-- (one probe, locked); the ready grouped jobs in start order (at most scan),
-- each group's head tried under its group row's lock (try_group_head), heads
-- waiting out a backoff marked (hold_group); if that walk met only busy
-- groups, one loose index scan over the groups' heads; the waiting row; jobs
-- too large failed; the rest marked `running`. sql/README, "The claim
-- protocol", explains each step and its races.
--
-- The daemon calls it through its claim statement, sql/claim.sql, which does
-- the common case (only ungrouped jobs may start) itself and calls this
-- function for everything else.
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[], p_max_attempts integer, p_timeout_ms bigint, p_max_data bigint, p_scan integer, p_orphans boolean, p_skip bigint[], p_lease_ms bigint) RETURNS TABLE(slot integer, job_id bigint, group_row bigint, group_id text, attempts integer, max_attempts integer, timeout_ms bigint, fence bigint, data text, arg_keys text[], arg_vals text[], schedule text, scheduled_for text, start_in_ms bigint, start_by_ms bigint, start_at_us bigint, late_us bigint, stmt_us bigint, clock_us bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    want int := coalesce(array_length(p_workers, 1), 0);
    ids bigint[] := '{}';   -- picked jobs, in start order
    gids bigint[] := '{}';  -- their group rows (NULL: ungrouped)
    gks text[] := '{}';     -- their groups (coalesce(group_key, group_id))
    gts timestamptz[] := '{}'; -- under a group rate, their groups' next
                            -- starts as the scans read them (NULL: none)
    r record;
    gid bigint;
    u_ids bigint[];
    u_pri int[];
    u_run timestamptz[];
    nu int;
    ui int := 1;
    busy text[] := '{}';
    later text[] := '{}';   -- groups whose ready head comes later in the scan
    later_heads bigint[] := '{}'; -- and those heads
    n int := 0;
    scan_cut boolean := false;
    own boolean;
    head record;
    budget int := p_scan;   -- groups this call may still mark held
    -- Flow control (sql/README, "Limits"): the queue's limits, NULL fields
    -- where it has none.
    want0 int := want;      -- the idle slots, before any limit
    lim pgjobd.queue_limits;
    k int := 1;             -- group concurrency
    nrun bigint;
    tnow timestamptz;       -- the rates' clock: when this call planned
    -- How far ahead of tnow a rate plans its first start: the answer's way
    -- back and, in lock mode transaction, the slot's hold come before the
    -- start, not late. (pgjobd.rate_late counts on it.)
    lead constant interval := interval '20 milliseconds';
    base timestamptz;       -- the first start it may plan: tnow and a lead
    hlen interval;          -- the horizon's length
    horizon timestamptz;    -- a rate plans starts up to here
    tq interval;            -- the queue's rate: one start per tq
    tg interval;            -- the group rate's
    lag_ms bigint;          -- how late a planned start may still be made:
                            -- a fifth of the lag, the rest is the command's own
                            -- (its exec, its first instruction)
    lag_us bigint;          -- the same in microseconds
    lq interval;            -- the rate's lag (rate_lag), and the group rate's
    lg interval;
    qtat timestamptz;       -- the queue's next start allowed
    lim_tat timestamptz;    -- as read (pgjobd.queue_rates)
    tokens int;             -- starts the queue's rate allows this call
    ghorizon timestamptz;   -- under a group rate, the horizon: a group
                            -- whose next start is later is busy
    plan timestamptz[];     -- each job's planned start
    p_ids bigint[];
    p_gids bigint[];
    p_plan timestamptz[];
    gk text;
    st timestamptz;
    -- the groups this call plans (uk) and their next starts (un), and
    -- those it wrote
    uk text[];
    un timestamptz[];
    written text[];
    nxt timestamptz;        -- rate-held: the next start a rate allows
    rate_cut boolean := false;
    i int;
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

    -- The queue's limits. Concurrency and rate take turns on the queue's
    -- limits row: the count of running jobs below is read after the lock,
    -- by a statement with a snapshot of its own, so that it sees every job
    -- the claims before us started (sql/README, "Limits").
    SELECT * INTO lim FROM pgjobd.queue_limits l WHERE l.queue = p_queue;
    IF lim.concurrency IS NOT NULL OR lim.rate_n IS NOT NULL THEN
        SELECT * INTO lim FROM pgjobd.queue_limits l WHERE l.queue = p_queue FOR UPDATE;
    END IF;
    k := coalesce(lim.group_concurrency, 1);
    IF lim.concurrency IS NOT NULL THEN
        SELECT count(*) INTO nrun FROM pgjobd.jobs rj
         WHERE rj.queue = p_queue AND rj.status = 'running';
    END IF;
    IF lim.rate_n IS NOT NULL OR lim.group_rate_n IS NOT NULL THEN
        tnow := clock_timestamp();
        base := tnow + lead;
        hlen := least(interval '100 milliseconds', lim.rate_period, lim.group_rate_period);
        horizon := base + hlen;
        -- rate_lag(), in place: a function that sets its own search_path
        -- is never inlined, and a SQL function called from PL/pgSQL is
        -- parsed again in each transaction
        lq := CASE WHEN lim.rate_n IS NOT NULL
                   THEN greatest(lim.rate_period / 40, interval '20 milliseconds') END;
        lg := CASE WHEN lim.group_rate_n IS NOT NULL
                   THEN greatest(lim.group_rate_period / 40, interval '20 milliseconds') END;
        lag_ms := floor(extract(epoch FROM least(lq, lg)) * 1000 / 5)::bigint;
        lag_us := floor(extract(epoch FROM least(lq, lg)) * 1000000 / 5)::bigint;
    END IF;
    IF lim.rate_n IS NOT NULL THEN
        tq := (lim.rate_period + lq) / lim.rate_n;
        -- (its state in a table of its own: an UPDATE of the limits row
        -- would check its ten constraints each claim)
        SELECT qr.tat INTO qtat FROM pgjobd.queue_rates qr WHERE qr.queue = p_queue;
        lim_tat := qtat;
        qtat := greatest(coalesce(qtat, base), base);
        tokens := CASE WHEN qtat > horizon THEN 0
                       ELSE floor(extract(epoch FROM horizon - qtat)
                                  / extract(epoch FROM tq))::int + 1 END;
    END IF;
    IF lim.group_rate_n IS NOT NULL THEN
        tg := (lim.group_rate_period + lg) / lim.group_rate_n;
        ghorizon := horizon;
    END IF;

    -- Marks whose time has come (sql/README, "Held groups").
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
    -- order every claim and hold locks them in. A lease-held job holds
    -- neither: its lease decides (sql/README, "Lock mode lease").
    IF p_orphans THEN
        -- The backend of each waiting row looked up by its pid
        -- (pg_stat_activity would build a row for every session of the
        -- server: 15 ms with 700 sessions).
        DELETE FROM pgjobd.waiting w
         WHERE w.queue = p_queue
           AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(w.pid) a);
        -- also the claim's fence and lease. The statement leaves out the
        -- rows the loop below would skip at once (in our skip list; another
        -- daemon's job whose claim has not lapsed), so that the loop's cost
        -- is the orphans', not every running job's of every daemon; the loop
        -- decides again, row by row.
        FOR r IN SELECT j.id, coalesce(j.group_key, j.group_id) AS group_id, j.attempts, j.max_attempts, j.worker_id, j.fence,
                        j.lease_until, j.lease_ms
                   FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'running'
                    AND (j.id = ANY(p_skip)) IS NOT TRUE
                    AND (j.worker_id IS NOT DISTINCT FROM p_worker_id
                         AND (j.lease_until IS NULL OR j.lease_until > clock_timestamp())
                         OR j.lease_until IS NOT NULL
                            AND j.lease_until <= clock_timestamp()
                            AND j.lease_until + pgjobd.lease_margin(j.lease_ms) <= clock_timestamp()
                         OR j.lease_until IS NULL
                            AND NOT EXISTS (SELECT 1 FROM pgjobd.workers w
                                             WHERE w.id = j.worker_id
                                               AND w.alive_until > clock_timestamp()))
                  ORDER BY j.id
        LOOP
            -- A takeover needs no concurrency (its job is running and
            -- counted), but it is a start: the rate's.
            EXIT WHEN coalesce(array_length(ids, 1), 0) >= least(want, tokens);
            CONTINUE WHEN r.id = ANY(p_skip);
            own := r.worker_id IS NOT DISTINCT FROM p_worker_id;
            -- Our own lease-held job whose lease has run out, not in
            -- p_skip: its command ran (a claim whose answer was lost is
            -- handed back by the first claim of the next session, long
            -- before its lease runs out), and its daemon gave up writing
            -- its outcome. It is taken over as another daemon's would be,
            -- once the margin has passed too: a new attempt, and the
            -- trigger jobs_attempt_ended records the lost run. Given back,
            -- it would run again under the same attempt, its first run in
            -- no history entry.
            IF own AND r.lease_until IS NOT NULL AND r.lease_until <= clock_timestamp() THEN
                own := false;
            END IF;
            -- Another daemon's job: only once that daemon's claim lapsed.
            -- A lease-held job: once its lease and the margin have
            -- passed, whatever its daemon's alive_until says; a job held by
            -- an open transaction: once its daemon's alive_until passed.
            CONTINUE WHEN NOT own AND r.lease_until IS NOT NULL
                          AND r.lease_until + pgjobd.lease_margin(r.lease_ms) > clock_timestamp();
            CONTINUE WHEN NOT own AND r.lease_until IS NULL AND EXISTS (
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
                PERFORM 1 FROM pgjobd.groups g WHERE g.id = gid FOR NO KEY UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
            END IF;
            -- Still the same claim (nobody took it over since the
            -- loop read it: a lease claim leaves no lock behind), and for a
            -- lease not extended meanwhile: the row as locked is rechecked.
            PERFORM 1 FROM pgjobd.jobs j WHERE j.id = r.id AND j.status = 'running'
               AND j.fence IS NOT DISTINCT FROM r.fence
               AND (own OR j.lease_until IS NULL
                    OR j.lease_until + pgjobd.lease_margin(j.lease_ms) <= clock_timestamp())
             FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            IF own THEN
                -- Claimed for us, held by none of our slots: it never
                -- started. Queued again, the attempt given back; it is a
                -- candidate again below, in its turn.
                -- Its lease goes with it (as below, whenever a
                -- running job ends here)
                UPDATE pgjobd.jobs j SET status = 'queued', attempts = j.attempts - 1,
                       worker = NULL, worker_id = NULL, started_at = NULL,
                       lease_until = NULL, lease_ms = NULL,
                       updated_at = clock_timestamp()
                 WHERE j.id = r.id;
                CONTINUE;
            END IF;
            IF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = r.id) THEN
                -- Cancelled while its daemon died: it stays cancelled.
                UPDATE pgjobd.jobs j SET status = 'cancelled', finished_at = clock_timestamp(),
                       updated_at = clock_timestamp(), lease_until = NULL, lease_ms = NULL,
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
                       updated_at = clock_timestamp(), lease_until = NULL, lease_ms = NULL,
                       error = jsonb_build_object('reason', 'lost_lock', 'exit_code', NULL,
                               'signal', NULL, 'stderr', NULL,
                               'message', 'the daemon running this job lost its claim')
                 WHERE j.id = r.id;
                CONTINUE;
            END IF;
            -- An orphan: run it again, counting a new attempt.
            ids := ids || r.id;
            gids := gids || gid;
            gks := gks || r.group_id;
            gts := gts || (SELECT t.tat FROM pgjobd.group_rates t
                            WHERE ghorizon IS NOT NULL AND t.queue = p_queue
                              AND t.group_id = r.group_id);
            IF r.group_id IS NOT NULL THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;

    -- What the limits leave of the idle slots: takeovers, plus the
    -- concurrency's free places, at most the rate's starts.
    want := least(want, coalesce(array_length(ids, 1), 0)
                        + CASE WHEN lim.concurrency IS NOT NULL
                               THEN greatest(lim.concurrency - nrun, 0) END,
                  tokens);

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
    -- there are enough of those, bounded by p_scan. Jobs
    -- marked held are not in jobs_ready_grouped, and not candidates.
    IF coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN SELECT j.id, coalesce(j.group_key, j.group_id) AS group_id, j.priority, j.run_at,
                        -- under a group rate, the group's next start allowed
                        -- (a subquery: read only for the rows the loop takes)
                        (SELECT t.tat FROM pgjobd.group_rates t
                          WHERE ghorizon IS NOT NULL AND t.queue = p_queue
                            AND t.group_id = coalesce(j.group_key, j.group_id)) AS gtat
                   FROM pgjobd.jobs j
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
                gks := gks || NULL::text;
                gts := gts || NULL::timestamptz;
                ui := ui + 1;
            END LOOP;
            EXIT WHEN array_length(ids, 1) >= want;
            n := n + 1;
            IF n > p_scan THEN
                scan_cut := true;
                EXIT;
            END IF;
            CONTINUE WHEN r.group_id = ANY(busy);
            -- A group whose rate allows no start before the horizon is busy
            -- for this call (read without a lock: the plan counts from this
            -- reading, and its write checks it).
            IF r.gtat > ghorizon THEN
                busy := busy || r.group_id;
                CONTINUE;
            END IF;
            -- A group whose ready head comes later in the scan (below):
            -- its jobs before that head are passed over without a read.
            CONTINUE WHEN r.group_id = ANY(later) AND r.id <> ALL(later_heads);
            -- The group's head, by a plain read of jobs_group_head (no lock,
            -- nothing written). Only a candidate that heads its group goes
            -- on to try_group_head, which locks the group row and checks
            -- the head again under that lock.
            -- Under a group concurrency above 1, the head is the first
            -- queued job (its running jobs are counted under the lock).
            -- A job of a group in `later` is the head read before: it is
            -- tried at once.
            IF NOT r.group_id = ANY(later) THEN
                IF k = 1 THEN
                    SELECT j.id, j.status, j.run_at, j.expires_at INTO head FROM pgjobd.jobs j
                     WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) = r.group_id
                       AND j.status IN ('queued', 'running')
                     ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
                ELSE
                    SELECT j.id, j.status, j.run_at, j.expires_at INTO head FROM pgjobd.jobs j
                     WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) = r.group_id
                       AND j.status = 'queued'
                     ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
                END IF;
                IF head.id IS DISTINCT FROM r.id THEN
                    -- A ready head comes later in this scan (or in a later
                    -- call): a head that waited out a retry, or was given
                    -- back, starts in its group's order but may have a
                    -- later run_at than the group's next jobs. Remembered,
                    -- so that those jobs cost one read of the head per
                    -- claim, not one each. A running head, or one that
                    -- expired, keeps the group busy.
                    IF head.status = 'queued'
                       AND (head.expires_at IS NULL OR head.expires_at > statement_timestamp())
                       AND head.run_at <= statement_timestamp() THEN
                        later := later || r.group_id;
                        later_heads := later_heads || head.id;
                        CONTINUE;
                    END IF;
                    busy := busy || r.group_id;
                    -- A head waiting out a backoff: take the group's later
                    -- jobs out of the scan until it is due.
                    IF head.status = 'queued' AND head.run_at > statement_timestamp()
                       AND (head.expires_at IS NULL OR head.expires_at > statement_timestamp())
                       AND budget > 0 THEN
                        PERFORM pgjobd.hold_group(p_queue, r.group_id, head.id, head.run_at,
                                                  p_scan);
                        budget := budget - 1;
                    END IF;
                    CONTINUE;
                END IF;
            END IF;
            gid := pgjobd.try_group_head(p_queue, r.group_id, r.id, k);
            IF gid > 0 THEN
                ids := ids || r.id;
                gids := gids || gid;
                gks := gks || r.group_id;
                gts := gts || r.gtat;
                busy := busy || r.group_id;
            ELSIF gid = 0 THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;
    WHILE ui <= nu AND coalesce(array_length(ids, 1), 0) < want LOOP
        ids := ids || u_ids[ui];
        gids := gids || NULL::bigint;
        gks := gks || NULL::text;
        gts := gts || NULL::timestamptz;
        ui := ui + 1;
    END LOOP;

    -- The bounded scan met only busy groups: visit each group's head once
    -- (a loose index scan over jobs_group_head), O(groups). Only ready heads
    -- are tried, so only groups that may start have their row locked.
    IF scan_cut AND coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN WITH RECURSIVE heads AS (
                     (SELECT coalesce(j.group_key, j.group_id) AS group_id, j.id, j.status, j.run_at, j.expires_at, j.held_until
                        FROM pgjobd.jobs j
                       WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) IS NOT NULL
                         AND j.status IN ('queued', 'running')
                       ORDER BY coalesce(j.group_key, j.group_id), coalesce(j.commit_seq, j.id) LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at, nx.expires_at,
                            nx.held_until FROM heads h,
                       LATERAL (SELECT coalesce(j.group_key, j.group_id) AS group_id, j.id, j.status, j.run_at, j.expires_at,
                                       j.held_until
                                  FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY coalesce(j.group_key, j.group_id), coalesce(j.commit_seq, j.id) LIMIT 1) nx)
                 SELECT h.group_id, h.id, h.run_at, h.held_until,
                        (SELECT t.tat FROM pgjobd.group_rates t
                          WHERE ghorizon IS NOT NULL AND t.queue = p_queue
                            AND t.group_id = h.group_id) AS gtat
                   FROM heads h
                  WHERE h.status = 'queued'
                 -- (under a group concurrency above 1 a group whose first
                 -- unfinished job runs is left to the bounded scan)
                    AND (h.expires_at IS NULL OR h.expires_at > statement_timestamp())
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            CONTINUE WHEN r.held_until = 'infinity'; -- a blocked group
            IF r.run_at > statement_timestamp() THEN
                -- A head waiting out a backoff that is not marked yet: mark
                -- its group while this walk meets it.
                IF r.held_until IS NULL AND budget > 0 THEN
                    PERFORM pgjobd.hold_group(p_queue, r.group_id, r.id, r.run_at, p_scan);
                    budget := budget - 1;
                END IF;
                CONTINUE;
            END IF;
            CONTINUE WHEN r.group_id = ANY(busy);
            CONTINUE WHEN r.gtat > ghorizon;
            gid := pgjobd.try_group_head(p_queue, r.group_id, r.id, k);
            IF gid > 0 THEN
                ids := ids || r.id;
                gids := gids || gid;
                gks := gks || r.group_id;
                gts := gts || r.gtat;
                busy := busy || r.group_id;
            ELSIF gid = 0 THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;

    -- A rate plans each start: the queue's next allowed start, and the
    -- group's, each one tq (tg) after the one before; a job whose planned
    -- start falls beyond the horizon is left for a later claim (sql/README,
    -- "Limits").
    -- All the rate's starts taken: there may be more to start.
    IF tokens < want0 AND coalesce(array_length(ids, 1), 0) >= tokens THEN
        rate_cut := true;
    END IF;
    IF tnow IS NOT NULL THEN
        -- The plan counts from now, not from the start of this call: what
        -- the call did since (a long scan of groups) would otherwise count
        -- against the daemon's lag as if the answer had been late.
        tnow := clock_timestamp();
        base := tnow + lead;
        horizon := base + hlen;
        IF tq IS NOT NULL THEN
            qtat := greatest(coalesce(lim_tat, base), base);
        END IF;
    END IF;
    IF tnow IS NOT NULL AND coalesce(array_length(ids, 1), 0) > 0 THEN
        p_ids := '{}';
        p_gids := '{}';
        plan := '{}';
        -- The groups' next starts are those the scans read (gts), without
        -- a lock: one moved on since (pgjobd.rate_late) fails the write's
        -- check below, and its job waits for a later claim.
        uk := '{}';
        un := '{}';
        FOR i IN 1 .. array_length(ids, 1) LOOP
            st := greatest(base, qtat);
            gk := CASE WHEN tg IS NOT NULL THEN gks[i] END;
            IF gk IS NOT NULL THEN
                -- (one job of a group a call: the scans pass over a group
                -- once it has one; should a second come, it waits for a
                -- later claim)
                IF gk = ANY(uk) THEN
                    nxt := least(nxt, horizon);
                    CONTINUE;
                END IF;
                st := greatest(st, gts[i]);
            END IF;
            IF st > horizon THEN
                nxt := least(nxt, st);
                CONTINUE;
            END IF;
            IF gk IS NOT NULL THEN
                uk := uk || gk;
                un := un || (st + tg);
            END IF;
            p_ids := p_ids || ids[i];
            p_gids := p_gids || gids[i];
            gks[coalesce(array_length(p_ids, 1), 0)] := gks[i];
            plan := plan || st;
            IF tq IS NOT NULL THEN
                qtat := st + tq;
            END IF;
        END LOOP;
        ids := p_ids;
        gids := p_gids;
        IF cardinality(uk) > 0 THEN
            -- The groups' next starts, under their rows' locks (in the
            -- order of group, as pgjobd.rate_late locks them): a start
            -- made late may have moved one on since the scans read it
            -- (rate_late); that group's jobs wait for a later claim.
            -- (a planned start is its group's new tat less tg)
            WITH w AS (INSERT INTO pgjobd.group_rates AS t (queue, group_id, tat)
                       SELECT p_queue, g.k, g.nx FROM unnest(uk, un) AS g(k, nx) ORDER BY g.k
                       ON CONFLICT ON CONSTRAINT group_rates_pkey DO UPDATE SET tat = EXCLUDED.tat
                        WHERE t.tat <= EXCLUDED.tat - tg
                       RETURNING t.group_id)
            SELECT array_agg(w.group_id) INTO written FROM w;
            IF cardinality(written) IS DISTINCT FROM cardinality(uk) THEN
                p_ids := '{}';
                p_gids := '{}';
                p_plan := '{}';
                FOR i IN 1 .. array_length(ids, 1) LOOP
                    CONTINUE WHEN gks[i] IS NOT NULL AND gks[i] <> ALL(coalesce(written, '{}'));
                    p_ids := p_ids || ids[i];
                    p_gids := p_gids || gids[i];
                    p_plan := p_plan || plan[i];
                END LOOP;
                ids := p_ids;
                gids := p_gids;
                plan := p_plan;
                nxt := least(nxt, horizon);
            END IF;
        END IF;
        IF tq IS NOT NULL THEN
            UPDATE pgjobd.queue_rates qr SET tat = qtat WHERE qr.queue = p_queue;
            IF NOT FOUND THEN
                -- (the limits row's lock: no other claim inserts it)
                INSERT INTO pgjobd.queue_rates (queue, tat) VALUES (p_queue, qtat);
            END IF;
        END IF;
    END IF;
    -- Held back by a rate: tell the daemon when to claim again (a row with
    -- no job), half a horizon and the lead before the next start the rate
    -- allows.
    IF tnow IS NOT NULL AND coalesce(array_length(ids, 1), 0) < want0 THEN
        IF rate_cut THEN
            nxt := least(nxt, qtat);
        END IF;
        IF tg IS NOT NULL THEN
            nxt := least(nxt, (SELECT min(t.tat) FROM pgjobd.group_rates t
                                WHERE t.queue = p_queue AND t.tat > horizon));
        END IF;
        IF nxt IS NOT NULL THEN
            slot := 0;
            start_in_ms := greatest(1, ceil(extract(epoch FROM nxt - tnow) * 1000)
                                       - ceil(extract(epoch FROM horizon - base) * 500)
                                       - ceil(extract(epoch FROM lead) * 1000))::bigint;
            stmt_us := ceil(extract(epoch FROM statement_timestamp()) * 1000000)::bigint;
            clock_us := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            RETURN NEXT;
            start_in_ms := NULL;
            stmt_us := NULL;
            clock_us := NULL;
        END IF;
    END IF;

    -- Slots left idle: wake me (see pgjobd.waiting).
    IF coalesce(array_length(ids, 1), 0) < want0 THEN
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
           lease_until = NULL, lease_ms = NULL,
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
        WITH t AS (SELECT p.id, p.gid, p.n::int AS slot, p.st
                     FROM unnest(ids, gids, plan) WITH ORDINALITY AS p(id, gid, st, n)),
             u AS (
                -- a lease claim commits its lease; a transaction
                -- claim has none (also when it takes over a lease-held job)
                UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1,
                       worker = p_workers[t.slot], worker_id = p_worker_id,
                       fence = nextval('pgjobd.fence_seq'),
                       lease_until = clock_timestamp() + p_lease_ms * interval '1 millisecond',
                       lease_ms = p_lease_ms,
                       started_at = clock_timestamp(),
                       updated_at = clock_timestamp(), finished_at = NULL
                  FROM t
                 WHERE j.id = t.id AND j.status IN ('queued', 'running')
                RETURNING t.slot, j.id, t.gid, j.group_id, j.attempts, j.max_attempts,
                          j.timeout, j.fence, j.data,
                          j.schedule, j.scheduled_for, t.st)
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
               -- the schedule and its tick
               u.schedule,
               to_char(u.scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
               -- a rate's planned start, and the latest the daemon may make
               -- it, in ms from when it sent the claim
               CASE WHEN u.st IS NOT NULL
                    THEN greatest(0, ceil(extract(epoch FROM u.st - tnow) * 1000))::bigint END,
               -- (from the statement's start, which came after the claim
               -- was sent: a wait for the limits row does not count as
               -- lateness)
               CASE WHEN u.st IS NOT NULL
                    THEN (greatest(0, floor(extract(epoch FROM u.st - statement_timestamp())
                                            * 1000))
                          + lag_ms)::bigint END,
               -- the same on the server's clock, in microseconds since
               -- the epoch: the planned start and how late it may be made;
               -- and two readings of the clock, when this statement
               -- started and as its rows are made, from which the daemon
               -- bounds how far the server's clock is from its own
               CASE WHEN u.st IS NOT NULL
                    THEN ceil(extract(epoch FROM u.st) * 1000000)::bigint END,
               CASE WHEN u.st IS NOT NULL THEN lag_us END,
               CASE WHEN tnow IS NOT NULL
                    THEN ceil(extract(epoch FROM statement_timestamp()) * 1000000)::bigint END,
               CASE WHEN tnow IS NOT NULL
                    THEN floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint END
          FROM u, LATERAL (
              SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
                     coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
                FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object'
                                     THEN u.data ELSE '{}' END) e
               WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
         ORDER BY u.slot;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                          bigint[], bigint) FROM PUBLIC;

-- rate_lag(period): how much later than planned a rate's start may come
-- (claim_batch computes it in place);
-- NULL for no rate. A rate of N per period plans one start per (period +
-- lag) / N, so that the starts i and i + N are at least a period apart even
-- when i came late by up to the lag: a rate is kept by the commands' own
-- clocks, 2.5 % under N per period for periods of 800 ms and more. The
-- daemon may make a start up to a fifth of the lag late (late_us, as far as
-- it can tell from the server's clock); a start later than that moves the
-- rate on first (rate_late). The other four fifths are for its exec and what
-- the command does before it reads the clock, which on a loaded host takes
-- from 3 ms to more than 25 ms (sql/README, "Limits").
CREATE OR REPLACE FUNCTION pgjobd.rate_lag(p interval) RETURNS interval
    LANGUAGE sql IMMUTABLE STRICT
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT greatest(p / 40, interval '20 milliseconds') $$;

REVOKE ALL ON FUNCTION pgjobd.rate_lag(interval) FROM PUBLIC;

-- rate_spacing(n, period): the time between two planned starts of a rate of
-- n per period, (period + rate_lag(period)) / n (claim_batch computes it in
-- place).
CREATE OR REPLACE FUNCTION pgjobd.rate_spacing(n integer, p interval) RETURNS interval
    LANGUAGE sql IMMUTABLE STRICT
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT (p + pgjobd.rate_lag(p)) / n $$;

REVOKE ALL ON FUNCTION pgjobd.rate_spacing(integer, interval) FROM PUBLIC;


-- try_group_head(queue, group, job, concurrency): may job, which headed its
-- group by a plain read, start now? Locks the group row FOR NO KEY UPDATE
-- SKIP LOCKED (creating it if missing): claims take turns on it, while a
-- transaction-mode slot holds it FOR KEY SHARE, which does not keep them
-- out. Under that lock it reads the head again (the first unfinished job;
-- under a concurrency above 1, the first queued one), checks that fewer than
-- `concurrency` jobs of the group are `running`, and locks the job row
-- (SKIP LOCKED). (A group rate is the caller's: it reads the groups' next
-- starts with its scan, and plans them after.) Returns
-- the group row's id (> 0: start it), 0 (the group is busy: skip its other
-- jobs in this claim) or -1 (this job only is not startable now).
CREATE OR REPLACE FUNCTION pgjobd.try_group_head(q text, g text, jid bigint, conc integer) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    gid bigint;
    head record;
BEGIN
    SELECT gr.id INTO gid FROM pgjobd.groups gr
     WHERE gr.queue = q AND gr.group_id = g FOR NO KEY UPDATE SKIP LOCKED;
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
    IF conc > 1 THEN
        SELECT j.id, j.status, j.run_at, j.expires_at, j.held_until INTO head FROM pgjobd.jobs j
         WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status = 'queued'
         ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
    ELSE
        SELECT j.id, j.status, j.run_at, j.expires_at, j.held_until INTO head FROM pgjobd.jobs j
         WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g
           AND j.status IN ('queued', 'running')
         ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
    END IF;
    -- A blocked group (held or paused: its queued jobs marked 'infinity',
    -- sql/functions/groups.sql) starts nothing.
    IF head.held_until = 'infinity' THEN
        RETURN 0;
    END IF;
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
    IF conc > 1 THEN
        IF (SELECT count(*) FROM (SELECT 1 FROM pgjobd.jobs j
                                   WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g
                                     AND j.status = 'running' LIMIT conc) n) >= conc THEN
            RETURN 0;
        END IF;
    ELSIF EXISTS (SELECT 1 FROM pgjobd.jobs j
                   WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g
                     AND j.status = 'running') THEN
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

REVOKE ALL ON FUNCTION pgjobd.try_group_head(text, text, bigint, int) FROM PUBLIC;

-- hold_group(queue, group, head, until, limit): the head of the group waits
-- out a backoff until `until`: mark the group's later queued jobs held_until
-- = until (at most `limit`), so that claims leave them out of their scan
-- (jobs_ready_grouped skips marked rows). Locks the head's row FOR UPDATE SKIP
-- LOCKED first: whoever changes the head locks it too (sql/README, "Held
-- groups"). Returns the number of jobs marked. Through indexes only, as
-- try_group_head: it also runs from an outcome's trigger (jobs_backed_off),
-- on sessions whose plans may have been made for an empty table.
CREATE OR REPLACE FUNCTION pgjobd.hold_group(q text, g text, p_head bigint, p_until timestamp with time zone, p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n int;
    head_key bigint;
BEGIN
    SELECT coalesce(j.commit_seq, j.id) INTO head_key FROM pgjobd.jobs j
     WHERE j.id = p_head AND j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status = 'queued'
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
                     WHERE s.queue = q AND coalesce(s.group_key, s.group_id) = g
                       AND coalesce(s.commit_seq, s.id) >= head_key
                       AND s.status = 'queued' AND s.held_until IS NULL
                       AND (s.id = p_head OR s.run_at <= statement_timestamp())
                     ORDER BY coalesce(s.commit_seq, s.id) LIMIT p_limit
                     FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

