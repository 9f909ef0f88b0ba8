-- sql/functions/schedules.sql - recurring jobs: the functions operators call
-- to manage pgjobd.schedules, and the checks behind them. The ticks
-- themselves are the daemons' (src/scheduler.c; sql/README, "Schedules").

-- check_cron(cron): refuse an expression the daemons' parser (src/cron.c)
-- would not take.
CREATE OR REPLACE FUNCTION pgjobd.check_cron(p_cron text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

-- check_time_zone(zone): refuse a zone PostgreSQL does not know.
CREATE OR REPLACE FUNCTION pgjobd.check_time_zone(p_zone text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

-- pause_schedule(name): its ticks enqueue nothing until resumed.
CREATE OR REPLACE FUNCTION pgjobd.pause_schedule(name text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE pgjobd.schedules s SET paused = true, updated_at = now()
     WHERE s.name = pause_schedule.name AND NOT s.paused;
    RETURN FOUND;
END
$$;

-- resume_schedule(name): undo pause_schedule.
CREATE OR REPLACE FUNCTION pgjobd.resume_schedule(name text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- run_schedule(name): enqueue the schedule's job now, outside its ticks.
-- Returns the job's id.
CREATE OR REPLACE FUNCTION pgjobd.run_schedule(name text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- schedule(name, cron, queue, ...): create or change a schedule.
CREATE OR REPLACE FUNCTION pgjobd.schedule(name text, cron text, queue text, data jsonb DEFAULT '{}'::jsonb, time_zone text DEFAULT 'UTC'::text, group_id text DEFAULT NULL::text, priority integer DEFAULT 0, max_attempts integer DEFAULT NULL::integer, timeout interval DEFAULT NULL::interval, expires_in interval DEFAULT NULL::interval, missed text DEFAULT 'last'::text, overlap text DEFAULT 'allow'::text, paused boolean DEFAULT false) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
$_$;

-- schedule_clock(real0, fake0, rate): the schedules' clock: now(), or for
-- the tests a shifted and faster one (src/scheduler.c).
CREATE OR REPLACE FUNCTION pgjobd.schedule_clock(p_real0 double precision, p_fake0 double precision, p_rate double precision) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN p_real0 IS NULL OR p_fake0 IS NULL OR p_rate IS NULL THEN now()
                ELSE to_timestamp(p_fake0 + (extract(epoch FROM now())::float8 - p_real0) * p_rate)
           END
$$;

-- unschedule(name): delete a schedule.
CREATE OR REPLACE FUNCTION pgjobd.unschedule(name text) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM pgjobd.schedules s WHERE s.name = unschedule.name;
    RETURN FOUND;
END
$$;

