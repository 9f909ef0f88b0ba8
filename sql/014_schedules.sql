-- 014_schedules.sql - schema version 14: recurring jobs (cron schedules).
--
--   pgjobd.schedules  one row per schedule: a cron expression in a time
--                     zone, and the job each tick enqueues (queue, data,
--                     group_id, priority, max_attempts, timeout, expires_in).
--                     Written by pgjobd.schedule() / unschedule() /
--                     pause_schedule() / resume_schedule(); ticked by the
--                     daemons (src/scheduler.c), which alone compute next_run
--                     (src/cron.c is the one definition of a tick).
--   jobs.schedule     the schedule's name and the tick, on every job a
--   jobs.scheduled_for  schedule enqueued; NULL on every other job. The
--                     command sees them as PGJOBD_SCHEDULE and
--                     PGJOBD_SCHEDULED_FOR (claim_batch returns them).
--   exactly once      a tick is one transaction of one daemon: it locks the
--                     due schedules (FOR UPDATE SKIP LOCKED), inserts their
--                     jobs and moves next_run past the tick, and commits.
--                     Another daemon skips the locked rows, and once the
--                     commit is seen the rows are not due any more; a daemon
--                     killed in between commits nothing. Whatever the timing,
--                     the unique index jobs_schedule_tick on (schedule,
--                     scheduled_for) refuses a second job for one tick (the
--                     insert is ON CONFLICT DO NOTHING).
--   wake-ups          schedule() and resume_schedule() notify channel
--                     pgjobd_schedule with an empty payload. Any role may
--                     notify it: it only makes a daemon look at the table
--                     sooner (one indexed query), never act on anything else.
--
-- Who may schedule: the owner, and the worker role (operators use the
-- daemon's configuration with the CLI), through the functions below, which
-- run as the owner (SECURITY DEFINER) and validate everything. Not
-- producers: a tick's job is inserted by a daemon, whose role may enqueue
-- into every queue, so a producer that could create schedules could
-- enqueue into queues it has no grant for. The owner may grant EXECUTE on
-- the functions to another role, knowing that.
--
-- Locks taken by this migration: ACCESS EXCLUSIVE on pgjobd.jobs to add two
-- columns (no rewrite: both are NULL), SHARE for the two new indexes (a
-- scan of the table: INSERTs and claims wait for it), and ACCESS EXCLUSIVE
-- on claim_batch, which is dropped and created again with two more result
-- columns. Daemons of older versions call claim_batch with a column list
-- that does not include the new columns, and keep working until their
-- listener reconnects and stops them on the version mismatch; they tick no
-- schedule.

-- ---------------------------------------------------------------- jobs

ALTER TABLE pgjobd.jobs ADD COLUMN schedule text, ADD COLUMN scheduled_for timestamptz;

-- One job per tick: what makes "exactly once" hold whatever the timing.
-- Only scheduled jobs are in it.
CREATE UNIQUE INDEX jobs_schedule_tick ON pgjobd.jobs (schedule, scheduled_for)
    WHERE schedule IS NOT NULL;
-- A schedule's unfinished jobs: the overlap check (overlap = 'skip') is one
-- probe, however long the schedule's history.
CREATE INDEX jobs_schedule_live ON pgjobd.jobs (schedule)
    WHERE schedule IS NOT NULL AND status IN ('queued', 'running');

-- ---------------------------------------------------------------- schedules

CREATE TABLE pgjobd.schedules (
    name            text PRIMARY KEY
                    CONSTRAINT "schedule name must be 1 to 63 characters of A-Z a-z 0-9 _ . -"
                    CHECK (name ~ '^[A-Za-z0-9_.-]{1,63}$'),
    cron            text NOT NULL,
    queue           text NOT NULL
                    CONSTRAINT "queue must be 1 to 63 characters of A-Z a-z 0-9 _ . -"
                    CHECK (queue ~ '^[A-Za-z0-9_.-]{1,63}$'),
    data            jsonb NOT NULL DEFAULT '{}',
    time_zone       text NOT NULL DEFAULT 'UTC',
    -- the job's columns
    group_id        text,
    priority        integer NOT NULL DEFAULT 0,
    max_attempts    integer CONSTRAINT "max_attempts must be at least 1" CHECK (max_attempts >= 1),
    timeout         interval CONSTRAINT "timeout must be positive" CHECK (timeout > interval '0'),
    -- expires_at = the time of enqueueing + expires_in
    expires_in      interval
                    CONSTRAINT "expires_in must be positive" CHECK (expires_in > interval '0'),
    -- ticks no daemon enqueued within a minute of their time: skip them,
    -- run the last one once, or run them all (at most the latest 100)
    missed          text NOT NULL DEFAULT 'last'
                    CONSTRAINT "missed must be skip, last or all"
                    CHECK (missed IN ('skip', 'last', 'all')),
    -- a tick while a job of the schedule is queued or running: enqueue it
    -- anyway, or skip it (counted in skipped_overlap, and logged)
    overlap         text NOT NULL DEFAULT 'allow'
                    CONSTRAINT "overlap must be allow or skip"
                    CHECK (overlap IN ('allow', 'skip')),
    paused          boolean NOT NULL DEFAULT false,
    -- written by the daemons
    last_run        timestamptz,  -- the tick of the latest job a tick enqueued
    next_run        timestamptz,  -- the next tick; NULL until a daemon computed it
    skipped_overlap bigint NOT NULL DEFAULT 0,
    skipped_missed  bigint NOT NULL DEFAULT 0,
    error           text,         -- why no daemon can compute next_run
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    created_by      text NOT NULL DEFAULT session_user
);

-- The schedules a daemon must look at: due (next_run <= now) or new
-- (next_run IS NULL), neither paused nor broken. A tick reads only these:
-- O(due schedules), not O(schedules).
CREATE INDEX schedules_due ON pgjobd.schedules (next_run) WHERE NOT paused AND error IS NULL;

-- The scheduler's clock: now(), the start of the transaction. A test may
-- give a shifted, faster clock to the same code (pgjobd(8),
-- PGJOBD_TEST_CLOCK): at real time p_real0 (epoch seconds) the clock reads
-- p_fake0, and it runs p_rate times as fast. NULLs: now().
CREATE FUNCTION pgjobd.schedule_clock(p_real0 float8, p_fake0 float8, p_rate float8)
RETURNS timestamptz
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN p_real0 IS NULL OR p_fake0 IS NULL OR p_rate IS NULL THEN now()
                ELSE to_timestamp(p_fake0 + (extract(epoch FROM now())::float8 - p_real0) * p_rate)
           END
$$;

-- ---------------------------------------------------------------- validation

-- Raises, with a message naming the field, for an expression the daemons'
-- parser (src/cron.c) refuses: wrong number of fields, a value out of its
-- field's range, an unknown name or macro, a bad range or step, or a date
-- that never comes (0 0 30 2 *). The daemons parse the expression again and
-- are the judges; this makes a typo fail at pgjobd.schedule(). Locks
-- nothing.
CREATE FUNCTION pgjobd.check_cron(p_cron text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c text;
    f text[];
    fname text[] := ARRAY['minute', 'hour', 'day-of-month', 'month', 'day-of-week'];
    lo int[] := ARRAY[0, 0, 1, 1, 0];
    hi int[] := ARRAY[59, 23, 31, 12, 7];
    mdays int[] := ARRAY[31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    months text[] := ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct',
                           'nov', 'dec'];
    days text[] := ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'];
    i int;
    k int;
    item text;
    m text[];
    v text;
    val int[];
    a int;
    b int;
    step int;
    dom int[] := '{}';
    mon int[] := '{}';
    prefix text;
BEGIN
    IF p_cron IS NULL THEN
        RAISE EXCEPTION 'no cron expression' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(p_cron) > 512 THEN
        RAISE EXCEPTION 'cron expression longer than 512 bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    c := regexp_replace(p_cron, '^\s+|\s+$', '', 'g');
    IF c = '' THEN
        RAISE EXCEPTION 'empty cron expression'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use 5 fields (minute hour day-of-month month day-of-week) or a macro '
                         'such as @daily.';
    END IF;
    IF left(c, 1) = '@' THEN
        IF lower(c) IN ('@yearly', '@annually', '@monthly', '@weekly', '@daily', '@midnight',
                        '@hourly') THEN
            RETURN;
        END IF;
        IF lower(c) = '@reboot' THEN
            RAISE EXCEPTION '@reboot is not supported: a schedule runs at times of the clock, '
                            'not when a daemon starts'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RAISE EXCEPTION 'unknown macro %', quote_literal(left(c, 40))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use @hourly, @daily, @midnight, @weekly, @monthly, @yearly or '
                         '@annually.';
    END IF;
    f := regexp_split_to_array(c, '\s+');
    IF array_length(f, 1) > 5 THEN
        RAISE EXCEPTION 'expected 5 fields (minute hour day-of-month month day-of-week), found %',
            array_length(f, 1)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A seconds field or a command is not part of a schedule.';
    ELSIF array_length(f, 1) < 5 THEN
        RAISE EXCEPTION 'expected 5 fields (minute hour day-of-month month day-of-week), found %',
            array_length(f, 1)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. 5 LOOP
        prefix := format('%s field "%s": ', fname[i], left(f[i], 60));
        FOREACH item IN ARRAY string_to_array(f[i], ',') LOOP
            IF item = '' THEN
                RAISE EXCEPTION '%empty element in a list', prefix
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            m := regexp_match(lower(item),
                              '^(?:(\*)|([0-9]+|[a-z]+)(?:-([0-9]+|[a-z]+))?)(?:/([0-9]+))?$');
            IF m IS NULL THEN
                RAISE EXCEPTION '%cannot read "%"', prefix, item
                    USING ERRCODE = 'invalid_parameter_value',
                          HINT = 'Use *, N, N-M, N/STEP, N-M/STEP or */STEP, separated by '
                                 'commas.';
            END IF;
            val := ARRAY[NULL, NULL]::int[];
            FOR k IN 1 .. 2 LOOP
                v := m[k + 1];
                CONTINUE WHEN v IS NULL;
                IF v ~ '^[0-9]+$' THEN
                    IF length(v) > 4 THEN
                        RAISE EXCEPTION '%number too large', prefix
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                    val[k] := v::int;
                    IF val[k] < lo[i] OR val[k] > hi[i] THEN
                        RAISE EXCEPTION '%', format('%s%s is out of range %s-%s', prefix, val[k],
                                                    lo[i], hi[i])
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                ELSIF i = 4 THEN
                    val[k] := array_position(months, v);
                    IF val[k] IS NULL THEN
                        RAISE EXCEPTION '%unknown name "%" (use jan to dec)', prefix, v
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                ELSIF i = 5 THEN
                    val[k] := array_position(days, v) - 1;
                    IF val[k] IS NULL THEN
                        RAISE EXCEPTION '%unknown name "%" (use sun to sat)', prefix, v
                            USING ERRCODE = 'invalid_parameter_value';
                    END IF;
                ELSE
                    RAISE EXCEPTION '%"%": names are allowed in the month and day-of-week '
                                    'fields only', prefix, item
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            END LOOP;
            IF m[1] IS NOT NULL THEN
                a := lo[i];
                b := CASE WHEN i = 5 THEN 6 ELSE hi[i] END;
            ELSE
                a := val[1];
                b := coalesce(val[2], CASE WHEN m[4] IS NOT NULL THEN hi[i] ELSE val[1] END);
                IF b < a THEN
                    RAISE EXCEPTION '%range %-% goes backwards (a range cannot wrap around)',
                        prefix, a, b
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            END IF;
            step := 1;
            IF m[4] IS NOT NULL THEN
                IF length(m[4]) > 4 THEN
                    RAISE EXCEPTION '%step too large', prefix
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                step := m[4]::int;
                IF step < 1 OR step > hi[i] - lo[i] + 1 THEN
                    RAISE EXCEPTION '%step % is out of range 1-%', prefix, step, hi[i] - lo[i] + 1
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            END IF;
            IF i = 3 THEN
                dom := dom || ARRAY(SELECT generate_series(a, b, step));
            ELSIF i = 4 THEN
                mon := mon || ARRAY(SELECT generate_series(a, b, step));
            END IF;
        END LOOP;
    END LOOP;
    -- When both day fields must match (one of them starts with *), the
    -- day-of-month field must allow a day of a month the month field allows.
    IF (left(f[3], 1) = '*' OR left(f[5], 1) = '*')
       AND NOT EXISTS (SELECT 1 FROM unnest(mon) mo, unnest(dom) d WHERE d <= mdays[mo]) THEN
        RAISE EXCEPTION 'never runs: the day-of-month field "%" allows no day of the months in '
                        'the month field "%"', left(f[3], 60), left(f[4], 60)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- Raises unless p_zone is a time zone name PostgreSQL knows (IANA names;
-- not abbreviations or POSIX offsets), spelled as its file is named.
CREATE FUNCTION pgjobd.check_time_zone(p_zone text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    guess text;
BEGIN
    IF p_zone IS NOT NULL AND p_zone ~ '^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$'
       AND EXISTS (SELECT 1 FROM pg_timezone_names z WHERE z.name = p_zone) THEN
        RETURN;
    END IF;
    SELECT z.name INTO guess FROM pg_timezone_names z WHERE lower(z.name) = lower(p_zone)
     ORDER BY z.name LIMIT 1;
    RAISE EXCEPTION 'unknown time zone %', coalesce(quote_literal(p_zone), 'NULL')
        USING ERRCODE = 'invalid_parameter_value',
              HINT = CASE WHEN guess IS NOT NULL
                          THEN format('Did you mean %s?', quote_literal(guess))
                          ELSE 'Use an IANA name such as Europe/Berlin or UTC (see '
                               'pg_timezone_names).' END;
END
$$;

-- ---------------------------------------------------------------- functions

-- Creates the schedule, or replaces the one of that name; true when it was
-- created. A replaced schedule keeps last_run and its counters; it keeps
-- next_run too when neither cron nor time_zone changed (so a deployment
-- that calls this again neither skips nor repeats a tick), else a daemon
-- computes the next tick from now. Raises for anything a daemon would
-- refuse. Wakes the daemons. Row-locks the schedule (waits for a tick in
-- progress on it).
CREATE FUNCTION pgjobd.schedule(name text, cron text, queue text, data jsonb DEFAULT '{}',
                                time_zone text DEFAULT 'UTC', group_id text DEFAULT NULL,
                                priority integer DEFAULT 0, max_attempts integer DEFAULT NULL,
                                timeout interval DEFAULT NULL, expires_in interval DEFAULT NULL,
                                missed text DEFAULT 'last', overlap text DEFAULT 'allow',
                                paused boolean DEFAULT false)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    created boolean;
BEGIN
    IF schedule.name IS NULL OR schedule.name !~ '^[A-Za-z0-9_.-]{1,63}$' THEN
        RAISE EXCEPTION 'bad schedule name %: use 1 to 63 characters of A-Z a-z 0-9 _ . -',
            coalesce(quote_literal(schedule.name), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgjobd.check_cron(schedule.cron);
    PERFORM pgjobd.check_queue_name(schedule.queue);
    PERFORM pgjobd.check_time_zone(schedule.time_zone);
    IF schedule.data IS NULL THEN
        RAISE EXCEPTION 'data must not be NULL (use ''{}'')'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF schedule.missed IS NULL OR schedule.missed NOT IN ('skip', 'last', 'all') THEN
        RAISE EXCEPTION 'missed must be skip, last or all, not %',
            coalesce(quote_literal(schedule.missed), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF schedule.overlap IS NULL OR schedule.overlap NOT IN ('allow', 'skip') THEN
        RAISE EXCEPTION 'overlap must be allow or skip, not %',
            coalesce(quote_literal(schedule.overlap), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgjobd.schedules AS s (name, cron, queue, data, time_zone, group_id, priority,
                                       max_attempts, timeout, expires_in, missed, overlap,
                                       paused)
    VALUES (schedule.name, schedule.cron, schedule.queue, schedule.data, schedule.time_zone,
            schedule.group_id, coalesce(schedule.priority, 0), schedule.max_attempts,
            schedule.timeout, schedule.expires_in, schedule.missed, schedule.overlap,
            coalesce(schedule.paused, false))
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
       SET cron = EXCLUDED.cron, queue = EXCLUDED.queue, data = EXCLUDED.data,
           time_zone = EXCLUDED.time_zone, group_id = EXCLUDED.group_id,
           priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
           timeout = EXCLUDED.timeout, expires_in = EXCLUDED.expires_in,
           missed = EXCLUDED.missed, overlap = EXCLUDED.overlap, paused = EXCLUDED.paused,
           next_run = CASE WHEN s.cron IS DISTINCT FROM EXCLUDED.cron
                             OR s.time_zone IS DISTINCT FROM EXCLUDED.time_zone
                             OR s.error IS NOT NULL
                           THEN NULL ELSE s.next_run END,
           error = NULL, updated_at = now()
    RETURNING (s.xmax = 0) INTO created;
    PERFORM pg_notify('pgjobd_schedule', '');
    RETURN created;
END
$$;

-- Removes the schedule; true when there was one. Jobs it enqueued stay.
-- Waits for a tick in progress on it.
CREATE FUNCTION pgjobd.unschedule(name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgjobd.schedules s WHERE s.name = unschedule.name;
    RETURN FOUND;
END
$$;

-- No more ticks until resume_schedule(); true when this call paused it.
-- The ticks that pass meanwhile are missed ticks when it resumes (its
-- `missed` policy applies).
CREATE FUNCTION pgjobd.pause_schedule(name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE pgjobd.schedules s SET paused = true, updated_at = now()
     WHERE s.name = pause_schedule.name AND NOT s.paused;
    RETURN FOUND;
END
$$;

-- true when this call resumed it. Wakes the daemons.
CREATE FUNCTION pgjobd.resume_schedule(name text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE pgjobd.schedules s SET paused = false, updated_at = now()
     WHERE s.name = resume_schedule.name AND s.paused;
    IF FOUND THEN
        PERFORM pg_notify('pgjobd_schedule', '');
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- Enqueues the schedule's job now, apart from its ticks: last_run,
-- next_run and the overlap policy are not involved. scheduled_for is the
-- time of the call. Returns the job's id. Raises for an unknown schedule.
CREATE FUNCTION pgjobd.run_schedule(name text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    jid bigint;
BEGIN
    PERFORM 1 FROM pgjobd.schedules s WHERE s.name = run_schedule.name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no schedule named %', coalesce(quote_literal(run_schedule.name), 'NULL')
            USING ERRCODE = 'no_data_found';
    END IF;
    INSERT INTO pgjobd.jobs (queue, data, group_id, priority, max_attempts, timeout, expires_at,
                             schedule, scheduled_for)
    SELECT s.queue, s.data, s.group_id, s.priority, s.max_attempts, s.timeout,
           now() + s.expires_in, s.name, clock_timestamp()
      FROM pgjobd.schedules s WHERE s.name = run_schedule.name
    RETURNING id INTO jid;
    RETURN jid;
END
$$;

-- ---------------------------------------------------------------- claims

-- Version 9's claim_batch (sql/009_row_locks.sql), restated whole because
-- its result gains two columns, which CREATE OR REPLACE cannot do. What
-- changed, and nothing else (each place is marked "014"):
--   - RETURNS TABLE: two more columns at the end, schedule text and
--     scheduled_for text (the tick in ISO 8601, UTC, to the second);
--   - the final UPDATE's RETURNING: j.schedule, j.scheduled_for;
--   - the final SELECT: u.schedule and the formatted u.scheduled_for.
DROP FUNCTION pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[],
                                 bigint[], bigint[]);
CREATE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[],
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

-- Dropped and created again: PUBLIC's default EXECUTE goes, as in version 6.
REVOKE EXECUTE ON FUNCTION
       pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[],
                          bigint[], bigint[]) FROM PUBLIC;

-- ---------------------------------------------------------------- roles

-- This version's grants, for the worker role: the daemon's tick reads the
-- schedules, locks the due ones and writes what it computed (only those
-- columns), and operators call the functions. grant_fencing() grants
-- claim_batch again. Idempotent; called by grant_roles().
CREATE FUNCTION pgjobd.grant_schedules() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT ON pgjobd.schedules TO pgjobd_worker;
        GRANT UPDATE (next_run, last_run, skipped_overlap, skipped_missed, error, updated_at)
              ON pgjobd.schedules TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION
              pgjobd.schedule(text, text, text, jsonb, text, text, integer, integer, interval,
                              interval, text, text, boolean),
              pgjobd.unschedule(text), pgjobd.pause_schedule(text),
              pgjobd.resume_schedule(text), pgjobd.run_schedule(text),
              pgjobd.schedule_clock(float8, float8, float8)
              TO pgjobd_worker;
    END IF;
END
$$;

-- Version 12's grant_roles() (sql/012_ops.sql), unchanged but for the
-- last call.
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
END
$$;

-- The owner's (and the worker role's, above) alone. check_cron() and
-- check_time_zone() stay executable by PUBLIC: they judge a string.
REVOKE EXECUTE ON FUNCTION
       pgjobd.schedule(text, text, text, jsonb, text, text, integer, integer, interval,
                       interval, text, text, boolean),
       pgjobd.unschedule(text), pgjobd.pause_schedule(text), pgjobd.resume_schedule(text),
       pgjobd.run_schedule(text), pgjobd.schedule_clock(float8, float8, float8),
       pgjobd.grant_schedules() FROM PUBLIC;

SELECT pgjobd.grant_roles();
