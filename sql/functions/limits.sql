-- sql/functions/limits.sql - flow control: set_limits, which writes a
-- queue's row of pgjobd.queue_limits, its checks, limit_stats (the limits'
-- columns of queue_stats) and grant_limits.

-- parse_rate(name, value): 'N/PERIOD' as a count (1 to 2147483647) and a
-- period, PERIOD in the daemon's duration syntax (src/parse.c): one or more
-- of <digits><unit>, units d h m s ms from the largest to the smallest, each
-- at most once ("1s", "1m", "1h30m", "500ms"), from 1 ms to 100 years. name
-- ('rate', 'group_rate') is for the message. A bad value: SQLSTATE 22023.
CREATE OR REPLACE FUNCTION pgjobd.parse_rate(p_name text, p_value text, OUT n integer, OUT period interval) RETURNS record
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    m text[];
    ms numeric;
BEGIN
    -- m[1] the count; m[2..6] d h m s ms (an "m" followed by "s" is ms).
    m := regexp_match(p_value,
        '^([0-9]{1,10})/(?:([0-9]{1,12})d)?(?:([0-9]{1,12})h)?(?:([0-9]{1,12})m(?!s))?(?:([0-9]{1,12})s)?(?:([0-9]{1,12})ms)?$');
    IF m IS NULL OR num_nonnulls(m[2], m[3], m[4], m[5], m[6]) = 0 THEN
        RAISE EXCEPTION 'bad %: %', p_name, coalesce(quote_literal(p_value), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'write N/PERIOD: N starts per PERIOD, a duration such as 1s, 1m, 1h30m or 500ms';
    END IF;
    IF m[1]::bigint NOT BETWEEN 1 AND 2147483647 THEN
        RAISE EXCEPTION 'bad %: %: the count must be from 1 to 2147483647', p_name,
            quote_literal(p_value) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    ms := coalesce(m[2]::numeric, 0) * 86400000 + coalesce(m[3]::numeric, 0) * 3600000
        + coalesce(m[4]::numeric, 0) * 60000 + coalesce(m[5]::numeric, 0) * 1000
        + coalesce(m[6]::numeric, 0);
    IF ms < 1 OR ms > 100 * 365 * 86400000::numeric THEN
        RAISE EXCEPTION 'bad %: %: the period must be from 1ms to 100 years', p_name,
            quote_literal(p_value) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    n := m[1]::integer;
    period := ms * interval '1 millisecond';
END
$$;

-- check_limit(name, value): a count limit must be at least 1 (-1 is
-- set_limits' "keep", never stored). SQLSTATE 22023 otherwise.
CREATE OR REPLACE FUNCTION pgjobd.check_limit(p_name text, p_value integer) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF p_value < 1 THEN
        RAISE EXCEPTION 'bad %: %: must be at least 1 (NULL removes the limit)', p_name, p_value
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$$;

-- set_limits(queue, concurrency, group_concurrency, rate, group_rate): the
-- queue's limits, for every daemon (pgjobd(8), "Flow control"). Called with
-- named arguments. An argument left out keeps that limit as it is (its
-- default, -1 or 'keep', means exactly that); NULL removes it; a value sets
-- it: a count at least 1, a rate 'N/PERIOD' (parse_rate). A queue left with
-- no limit loses its row. Returns whether anything changed; a change wakes
-- the queue's daemons (NOTIFY pgjobd, as resume() does), so that a raised
-- or removed limit is used at once. With the caller's rights: the owner and
-- the worker role may, as they may pause a queue; producers may not.
CREATE OR REPLACE FUNCTION pgjobd.set_limits(queue text, concurrency integer DEFAULT -1, group_concurrency integer DEFAULT -1, rate text DEFAULT 'keep', group_rate text DEFAULT 'keep') RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p_queue text := set_limits.queue;
    c integer := set_limits.concurrency;
    gc integer := set_limits.group_concurrency;
    r text := set_limits.rate;
    gr text := set_limits.group_rate;
    had pgjobd.queue_limits;
    want pgjobd.queue_limits;
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    IF c IS DISTINCT FROM -1 THEN
        PERFORM pgjobd.check_limit('concurrency', c);
    END IF;
    IF gc IS DISTINCT FROM -1 THEN
        PERFORM pgjobd.check_limit('group_concurrency', gc);
    END IF;
    -- One writer of a queue's row at a time: the row's lock, or for a
    -- queue without one, the primary key's (ON CONFLICT below).
    SELECT * INTO had FROM pgjobd.queue_limits l WHERE l.queue = p_queue FOR UPDATE;
    want := had;
    want.queue := p_queue;
    IF c IS DISTINCT FROM -1 THEN
        want.concurrency := c;
    END IF;
    IF gc IS DISTINCT FROM -1 THEN
        want.group_concurrency := gc;
    END IF;
    IF r IS NULL THEN
        want.rate_n := NULL;
        want.rate_period := NULL;
    ELSIF r <> 'keep' THEN
        SELECT p.n, p.period INTO want.rate_n, want.rate_period
          FROM pgjobd.parse_rate('rate', r) p;
    END IF;
    IF gr IS NULL THEN
        want.group_rate_n := NULL;
        want.group_rate_period := NULL;
    ELSIF gr <> 'keep' THEN
        SELECT p.n, p.period INTO want.group_rate_n, want.group_rate_period
          FROM pgjobd.parse_rate('group_rate', gr) p;
    END IF;
    IF (want.concurrency, want.group_concurrency, want.rate_n, want.rate_period,
        want.group_rate_n, want.group_rate_period)
       IS NOT DISTINCT FROM
       (had.concurrency, had.group_concurrency, had.rate_n, had.rate_period,
        had.group_rate_n, had.group_rate_period) THEN
        RETURN false;
    END IF;
    IF num_nonnulls(want.concurrency, want.group_concurrency, want.rate_n, want.group_rate_n) = 0 THEN
        DELETE FROM pgjobd.queue_limits l WHERE l.queue = p_queue;
    ELSE
        INSERT INTO pgjobd.queue_limits AS l (queue, concurrency, group_concurrency, rate_n,
                                              rate_period, group_rate_n, group_rate_period)
        VALUES (p_queue, want.concurrency, want.group_concurrency, want.rate_n, want.rate_period,
                want.group_rate_n, want.group_rate_period)
        -- The row is there after all (another set_limits created it since
        -- our look): only what was given changes, as if we had waited.
        ON CONFLICT ON CONSTRAINT queue_limits_pkey DO UPDATE
           SET concurrency = CASE WHEN c IS DISTINCT FROM -1 THEN EXCLUDED.concurrency
                                  ELSE l.concurrency END,
               group_concurrency = CASE WHEN gc IS DISTINCT FROM -1
                                        THEN EXCLUDED.group_concurrency
                                        ELSE l.group_concurrency END,
               rate_n = CASE WHEN r IS DISTINCT FROM 'keep' THEN EXCLUDED.rate_n
                             ELSE l.rate_n END,
               rate_period = CASE WHEN r IS DISTINCT FROM 'keep' THEN EXCLUDED.rate_period
                                  ELSE l.rate_period END,
               group_rate_n = CASE WHEN gr IS DISTINCT FROM 'keep' THEN EXCLUDED.group_rate_n
                                   ELSE l.group_rate_n END,
               group_rate_period = CASE WHEN gr IS DISTINCT FROM 'keep'
                                        THEN EXCLUDED.group_rate_period
                                        ELSE l.group_rate_period END,
               updated_at = now(), updated_by = session_user;
    END IF;
    -- A rate's state (tat: the last start planned plus the rate's spacing)
    -- follows a change of the rate: the last start plus the new spacing.
    -- Left as it was, a rate raised from 1/1d to 10/1s would wait out the
    -- day. A removed or new rate has none. Group rows are locked in the
    -- order of group, as claims and rate_late lock them.
    IF (want.rate_n, want.rate_period) IS DISTINCT FROM (had.rate_n, had.rate_period) THEN
        IF want.rate_n IS NULL OR had.rate_n IS NULL THEN
            DELETE FROM pgjobd.queue_rates qr WHERE qr.queue = p_queue;
        ELSE
            UPDATE pgjobd.queue_rates qr
               SET tat = qr.tat - pgjobd.rate_spacing(had.rate_n, had.rate_period)
                         + pgjobd.rate_spacing(want.rate_n, want.rate_period)
             WHERE qr.queue = p_queue;
        END IF;
    END IF;
    IF (want.group_rate_n, want.group_rate_period)
       IS DISTINCT FROM (had.group_rate_n, had.group_rate_period) THEN
        IF want.group_rate_n IS NULL OR had.group_rate_n IS NULL THEN
            DELETE FROM pgjobd.group_rates t
             WHERE t.ctid = ANY (ARRAY(SELECT o.ctid FROM pgjobd.group_rates o
                                        WHERE o.queue = p_queue
                                        ORDER BY o.group_id FOR UPDATE));
        ELSE
            UPDATE pgjobd.group_rates t
               SET tat = t.tat - pgjobd.rate_spacing(had.group_rate_n, had.group_rate_period)
                         + pgjobd.rate_spacing(want.group_rate_n, want.group_rate_period)
             WHERE t.ctid = ANY (ARRAY(SELECT o.ctid FROM pgjobd.group_rates o
                                        WHERE o.queue = p_queue
                                        ORDER BY o.group_id FOR UPDATE));
        END IF;
    END IF;
    PERFORM pg_notify('pgjobd', pgjobd.wake_payload(p_queue));
    RETURN true;
END
$$;

-- format_rate(n, period): 'N/PERIOD', the period in the daemon's duration
-- syntax, every unit from the largest that is not zero ('10/1s', '5/1h30m');
-- NULL when n is.
CREATE OR REPLACE FUNCTION pgjobd.format_rate(p_n integer, p_period interval) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
SELECT p_n::text || '/' || string_agg(((x.ms / u.mult) % u.modulo)::text || u.unit, ''
                                      ORDER BY u.mult DESC)
  FROM (SELECT (extract(epoch FROM p_period) * 1000)::bigint AS ms) x,
       (VALUES ('d', 86400000::bigint, 1000000000::bigint), ('h', 3600000, 24),
               ('m', 60000, 60), ('s', 1000, 60), ('ms', 1, 1000)) u(unit, mult, modulo)
 WHERE (x.ms / u.mult) % u.modulo > 0
$$;

-- limit_stats(): one row per queue with limits (pgjobd.queue_limits): each
-- limit, what is in use of it, and `throttled`, for the view queue_stats.
-- With the rights of its caller, so that row-level security applies (a
-- producer sees the limits of its granted queues, counts its own jobs):
-- nothing for a caller that may not read queue_limits, and the limits
-- without what is in use (NULL) for one that may not read the jobs'
-- columns it counts by. In use:
--   concurrency_used        running jobs of the queue;
--   group_concurrency_used  running jobs of its busiest group;
--   rate_used               jobs started within the last period (running or
--                           finished: each job's latest start);
--   group_rate_used         the same for its busiest group.
-- throttled: the first limit, in that order, that is reached while a ready
-- job (queued, due) waits; for a group limit, a ready job of a group that
-- reached it. NULL: none.
CREATE OR REPLACE FUNCTION pgjobd.limit_stats() RETURNS TABLE (queue text, concurrency integer,
        concurrency_used bigint, group_concurrency integer, group_concurrency_used bigint,
        rate text, rate_used bigint, group_rate text, group_rate_used bigint, throttled text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
#variable_conflict use_column
BEGIN
    IF NOT has_table_privilege('pgjobd.queue_limits', 'SELECT') THEN
        RETURN;
    END IF;
    IF NOT has_column_privilege('pgjobd.jobs', 'queue', 'SELECT')
       OR NOT has_column_privilege('pgjobd.jobs', 'status', 'SELECT')
       OR NOT has_column_privilege('pgjobd.jobs', 'run_at', 'SELECT')
       OR NOT has_column_privilege('pgjobd.jobs', 'started_at', 'SELECT')
       OR NOT has_column_privilege('pgjobd.jobs', 'finished_at', 'SELECT')
       OR NOT has_column_privilege('pgjobd.jobs', 'group_id', 'SELECT')
       OR NOT has_column_privilege('pgjobd.jobs', 'group_key', 'SELECT') THEN
        RETURN QUERY
        SELECT l.queue, l.concurrency, NULL::bigint, l.group_concurrency, NULL::bigint,
               pgjobd.format_rate(l.rate_n, l.rate_period), NULL::bigint,
               pgjobd.format_rate(l.group_rate_n, l.group_rate_period), NULL::bigint, NULL::text
          FROM pgjobd.queue_limits l;
        RETURN;
    END IF;
    RETURN QUERY
    WITH u AS (
        SELECT l.*,
               -- jobs_running
               (SELECT count(*) FROM pgjobd.jobs r
                 WHERE r.queue = l.queue AND r.status = 'running') AS running,
               -- jobs_group_running
               CASE WHEN l.group_concurrency IS NOT NULL THEN
                   coalesce((SELECT max(g.n) FROM (
                       SELECT count(*) AS n FROM pgjobd.jobs r
                        WHERE r.queue = l.queue AND r.status = 'running'
                          AND coalesce(r.group_key, r.group_id) IS NOT NULL
                        GROUP BY coalesce(r.group_key, r.group_id)) g), 0)
               END AS gc_used,
               -- jobs_running and jobs_finished: a job started within the
               -- period runs, or finished within it.
               CASE WHEN l.rate_n IS NOT NULL THEN
                   (SELECT count(*) FROM pgjobd.jobs r
                     WHERE r.queue = l.queue AND r.status = 'running'
                       AND r.started_at > now() - l.rate_period)
                 + (SELECT count(*) FROM pgjobd.jobs r
                     WHERE r.queue = l.queue
                       AND r.status IN ('succeeded', 'failed', 'cancelled')
                       AND r.finished_at > now() - l.rate_period
                       AND r.started_at > now() - l.rate_period)
               END AS r_used,
               CASE WHEN l.group_rate_n IS NOT NULL THEN
                   coalesce((SELECT max(g.n) FROM (
                       SELECT count(*) AS n FROM pgjobd.jobs r
                        WHERE r.queue = l.queue
                          AND (r.status = 'running'
                               OR (r.status IN ('succeeded', 'failed', 'cancelled')
                                   AND r.finished_at > now() - l.group_rate_period))
                          AND r.started_at > now() - l.group_rate_period
                          AND coalesce(r.group_key, r.group_id) IS NOT NULL
                        GROUP BY coalesce(r.group_key, r.group_id)) g), 0)
               END AS gr_used,
               -- jobs_ready_free, jobs_ready_grouped
               EXISTS (SELECT 1 FROM pgjobd.jobs w
                        WHERE w.queue = l.queue AND w.status = 'queued'
                          AND w.run_at <= now()) AS ready
          FROM pgjobd.queue_limits l)
    SELECT u.queue, u.concurrency,
           CASE WHEN u.concurrency IS NOT NULL THEN u.running END,
           u.group_concurrency, u.gc_used,
           pgjobd.format_rate(u.rate_n, u.rate_period), u.r_used,
           pgjobd.format_rate(u.group_rate_n, u.group_rate_period), u.gr_used,
           CASE
               WHEN NOT u.ready THEN NULL
               WHEN u.running >= u.concurrency THEN 'concurrency'
               WHEN u.r_used >= u.rate_n THEN 'rate'
               WHEN u.gc_used >= u.group_concurrency AND EXISTS (
                   SELECT 1 FROM pgjobd.jobs w
                    WHERE w.queue = u.queue AND w.status = 'queued' AND w.run_at <= now()
                      AND coalesce(w.group_key, w.group_id) IS NOT NULL
                      AND (SELECT count(*) FROM pgjobd.jobs r
                            WHERE r.queue = w.queue AND r.status = 'running'
                              AND coalesce(r.group_key, r.group_id)
                                  = coalesce(w.group_key, w.group_id))
                          >= u.group_concurrency) THEN 'group_concurrency'
               WHEN u.gr_used >= u.group_rate_n AND EXISTS (
                   SELECT 1 FROM pgjobd.jobs w
                    WHERE w.queue = u.queue AND w.status = 'queued' AND w.run_at <= now()
                      AND coalesce(w.group_key, w.group_id) IS NOT NULL
                      AND (SELECT count(*) FROM pgjobd.jobs r
                            WHERE r.queue = w.queue
                              AND (r.status = 'running'
                                   OR (r.status IN ('succeeded', 'failed', 'cancelled')
                                       AND r.finished_at > now() - u.group_rate_period))
                              AND r.started_at > now() - u.group_rate_period
                              AND coalesce(r.group_key, r.group_id)
                                  = coalesce(w.group_key, w.group_id))
                          >= u.group_rate_n) THEN 'group_rate'
           END
      FROM u;
END
$$;

-- rate_late(starts): moves a rate on for starts a daemon makes later than
-- their plan allows (src/rate_db.h). starts: a JSON array of {id, fence,
-- at_us, shift_us}: a job running under its claim's fencing token, the
-- start claim_batch planned for it (start_at_us, microseconds since the
-- epoch) and how much later than its allowance (late_us) the daemon will
-- make it at most. For each, the queue's next allowed start (tat) moves on
-- by shift_us, from at least the start after `at` and now; under a group
-- rate the group's too. Every start planned after this commits comes that
-- much later, so the start a period on is still a period and the lag after
-- this one however late this one comes, up to the shift (sql/README,
-- "Limits"). Refused (ok false), and nothing moved for that rate, once a
-- claim may have planned the start a period on already: the clock, read
-- with the row locked that claims plan under (the queue's limits row for a
-- rate, the group's group_rates row for a group rate), has passed that
-- start's earliest plan less the lead and the horizon, less a margin. Also
-- refused for a job no longer running under that token. Returns one row
-- per entry: its position (1-based) and ok. Rows are locked in the order
-- of queue and group, the queue's limits row first, as claims lock them.
CREATE OR REPLACE FUNCTION pgjobd.rate_late(p_starts jsonb) RETURNS TABLE(n integer, ok boolean)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    e record;
    lim pgjobd.queue_limits;
    cur_q text;             -- the queue whose limits row is locked
    cur_g text;             -- the group whose group_rates row is locked
    hlen interval;
    at timestamptz;
    -- the moves allowed, for the queues' rates and the groups' rates
    mq text[] := '{}';
    m_at timestamptz[] := '{}';
    m_shift interval[] := '{}';
    gq text[] := '{}';
    gg text[] := '{}';
    g_at timestamptz[] := '{}';
    g_shift interval[] := '{}';
    -- claim_batch's lead, and a margin for the clock read before commit
    lead constant interval := interval '20 milliseconds';
    margin constant interval := interval '20 milliseconds';
BEGIN
    -- In the order of queue and group, so that two calls lock alike; each
    -- row locked once, and kept to the end: the clock read from then on is
    -- later than any claim that planned under it before this call.
    FOR e IN SELECT s.n::int AS n, s.at_us, s.shift_us, j.queue,
                    coalesce(j.group_key, j.group_id) AS g
               FROM ROWS FROM (jsonb_to_recordset(p_starts)
                               AS (id bigint, fence bigint, at_us bigint, shift_us bigint))
                    WITH ORDINALITY AS s(id, fence, at_us, shift_us, n)
               LEFT JOIN pgjobd.jobs j
                      ON j.id = s.id AND j.fence = s.fence AND j.status = 'running'
              ORDER BY j.queue, coalesce(j.group_key, j.group_id), s.n
    LOOP
        n := e.n;
        IF e.queue IS NULL OR e.at_us IS NULL OR e.shift_us IS NULL OR e.shift_us < 0 THEN
            ok := false; -- no longer running under that token
            RETURN NEXT;
            CONTINUE;
        END IF;
        at := to_timestamp(e.at_us / 1000000.0);
        IF e.queue IS DISTINCT FROM cur_q THEN
            cur_q := e.queue;
            cur_g := NULL;
            SELECT * INTO lim FROM pgjobd.queue_limits l WHERE l.queue = e.queue FOR UPDATE;
            hlen := least(interval '100 milliseconds', lim.rate_period, lim.group_rate_period);
        END IF;
        ok := lim.rate_n IS NULL
              OR clock_timestamp() <= at + lim.rate_period + pgjobd.rate_lag(lim.rate_period)
                                      - lead - hlen - margin;
        IF ok AND lim.group_rate_n IS NOT NULL AND e.g IS NOT NULL THEN
            IF e.g IS DISTINCT FROM cur_g THEN
                cur_g := e.g;
                -- The group's row, made if missing (maintain() deletes one
                -- whose time has passed, which means what no row means).
                INSERT INTO pgjobd.group_rates AS t (queue, group_id, tat)
                VALUES (e.queue, e.g, '-infinity') ON CONFLICT DO NOTHING;
                PERFORM 1 FROM pgjobd.group_rates t
                 WHERE t.queue = e.queue AND t.group_id = e.g FOR UPDATE;
            END IF;
            ok := clock_timestamp() <= at + lim.group_rate_period
                                       + pgjobd.rate_lag(lim.group_rate_period)
                                       - lead - hlen - margin;
            IF ok THEN
                gq := gq || e.queue;
                gg := gg || e.g;
                g_at := g_at || at;
                g_shift := g_shift || e.shift_us * interval '1 microsecond';
            END IF;
        END IF;
        IF ok AND lim.rate_n IS NOT NULL THEN
            mq := mq || e.queue;
            m_at := m_at || at;
            m_shift := m_shift || e.shift_us * interval '1 microsecond';
        END IF;
        RETURN NEXT;
    END LOOP;
    -- Each rate moves once, by the largest shift asked of it, from the
    -- latest start after one of those asking: the largest shift is enough
    -- for each.
    -- (a rate whose state set_limits deleted since the start was planned,
    -- the rate removed and set again, moves on from nothing; no claim
    -- inserts the state meanwhile: the limits row is locked)
    INSERT INTO pgjobd.queue_rates (queue, tat)
    SELECT DISTINCT u.q, '-infinity'::timestamptz FROM unnest(mq) u(q)
        ON CONFLICT DO NOTHING;
    UPDATE pgjobd.queue_rates t
       SET tat = greatest(t.tat, m.at + pgjobd.rate_spacing(l.rate_n, l.rate_period),
                          clock_timestamp()) + m.shift
      FROM (SELECT u.q, max(u.at) AS at, max(u.shift) AS shift
              FROM unnest(mq, m_at, m_shift) u(q, at, shift) GROUP BY u.q) m
      JOIN pgjobd.queue_limits l ON l.queue = m.q
     WHERE t.queue = m.q;
    UPDATE pgjobd.group_rates t
       SET tat = greatest(t.tat, m.at + pgjobd.rate_spacing(l.group_rate_n, l.group_rate_period),
                          clock_timestamp()) + m.shift
      FROM (SELECT u.q, u.g, max(u.at) AS at, max(u.shift) AS shift
              FROM unnest(gq, gg, g_at, g_shift) u(q, g, at, shift) GROUP BY u.q, u.g) m
      JOIN pgjobd.queue_limits l ON l.queue = m.q
     WHERE t.queue = m.q AND t.group_id = m.g;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.rate_late(jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION pgjobd.parse_rate(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgjobd.check_limit(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pgjobd.set_limits(text, integer, integer, text, text) FROM PUBLIC;

-- grant_limits(): the worker role sets limits (set_limits with its own
-- rights, on queue_limits) as it pauses queues; producers read the limits
-- of the queues they are granted, which queue_stats shows them.
CREATE OR REPLACE FUNCTION pgjobd.grant_limits() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT SELECT ON pgjobd.queue_limits TO pgjobd_producer;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'queue_limits'
                          AND policyname = 'producer_select') THEN
            CREATE POLICY producer_select ON pgjobd.queue_limits FOR SELECT
                TO pgjobd_producer
                USING (EXISTS (SELECT 1 FROM pgjobd.queue_grants g
                                WHERE g.queue IN (queue_limits.queue, '*')
                                  AND pg_catalog.pg_has_role(current_user, g.role, 'MEMBER')));
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobd.queue_limits, pgjobd.group_rates,
              pgjobd.queue_rates TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION pgjobd.set_limits(text, integer, integer, text, text),
              pgjobd.parse_rate(text, text), pgjobd.check_limit(text, integer),
              pgjobd.rate_lag(interval), pgjobd.rate_spacing(integer, interval),
              pgjobd.rate_late(jsonb) TO pgjobd_worker;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'queue_limits'
                          AND policyname = 'worker_all') THEN
            CREATE POLICY worker_all ON pgjobd.queue_limits TO pgjobd_worker
                USING (true) WITH CHECK (true);
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer')
       AND NOT (SELECT c.relrowsecurity FROM pg_class c
                 WHERE c.oid = 'pgjobd.queue_limits'::regclass) THEN
        ALTER TABLE pgjobd.queue_limits ENABLE ROW LEVEL SECURITY;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.grant_limits() FROM PUBLIC;
