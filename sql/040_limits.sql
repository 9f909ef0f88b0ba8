-- 040_limits.sql - schema version 40: flow control's limits, where they
-- live and how they are shown.
--
--   queue_limits   one row per queue with a limit: concurrency (running
--                  jobs of the queue across every daemon), group_concurrency
--                  (running jobs per group; NULL is the default, 1), rate
--                  (rate_n starts per rate_period) and group_rate (the same
--                  per group). NULL: no such limit. A queue without any has
--                  no row. Written by set_limits() (sql/functions/limits.sql)
--                  with the rights of its caller: the owner and the worker
--                  role, who may also pause and resume a queue. Producers
--                  read the rows of the queues they are granted (row-level
--                  security, as pgjobd.paused_queues), so that queue_stats
--                  works for them.
--   queue_stats    gains, at the end, each limit and what is in use of it,
--                  and `throttled`: which limit holds back ready jobs now
--                  (NULL: none), from limit_stats() (below). Every earlier
--                  column keeps its name and meaning, and a role that may
--                  read only what the view read before (queue, status,
--                  run_at, finished_at of jobs; queue of paused_queues) can
--                  still read it, with the new columns NULL; a queue with
--                  limits and no job gets a row, as a paused one does.
--
-- This version records the limits; no claim reads them yet.
--
-- Locks taken: the new table; ACCESS EXCLUSIVE on the view queue_stats
-- (its readers hold it for a moment). No lock on pgjobd.jobs: the upgrade
-- does not wait for running jobs.

CREATE TABLE pgjobd.queue_limits (
    queue             text PRIMARY KEY,
    concurrency       integer,
    group_concurrency integer,
    rate_n            integer,
    rate_period       interval,
    group_rate_n      integer,
    group_rate_period interval,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    updated_by        text NOT NULL DEFAULT session_user,
    CONSTRAINT "queue must be 1 to 63 characters of A-Z a-z 0-9 _ . -"
        CHECK (queue ~ '^[A-Za-z0-9_.-]{1,63}$'),
    CONSTRAINT "concurrency must be at least 1" CHECK (concurrency >= 1),
    CONSTRAINT "group_concurrency must be at least 1" CHECK (group_concurrency >= 1),
    CONSTRAINT "rate must be at least 1 per period" CHECK (rate_n >= 1),
    CONSTRAINT "group_rate must be at least 1 per period" CHECK (group_rate_n >= 1),
    CONSTRAINT "rate period must be 1 ms to 100 years"
        CHECK (rate_period BETWEEN interval '1 millisecond' AND interval '876000 hours'),
    CONSTRAINT "group_rate period must be 1 ms to 100 years"
        CHECK (group_rate_period BETWEEN interval '1 millisecond' AND interval '876000 hours'),
    CONSTRAINT "rate needs both a count and a period"
        CHECK ((rate_n IS NULL) = (rate_period IS NULL)),
    CONSTRAINT "group_rate needs both a count and a period"
        CHECK ((group_rate_n IS NULL) = (group_rate_period IS NULL)),
    -- A queue without limits has no row (set_limits deletes it).
    CONSTRAINT "a row holds at least one limit"
        CHECK (num_nonnulls(concurrency, group_concurrency, rate_n, group_rate_n) > 0)
);

-- limit_stats(): each queue's limits and what is in use of them, for the
-- view below, with the rights of its caller. Its body is in
-- sql/functions/limits.sql, applied right after the migrations; the view
-- needs the function to exist, so this version creates it with an empty
-- body first (same signature, same result).
CREATE FUNCTION pgjobd.limit_stats() RETURNS TABLE (queue text, concurrency integer,
        concurrency_used bigint, group_concurrency integer, group_concurrency_used bigint,
        rate text, rate_used bigint, group_rate text, group_rate_used bigint, throttled text)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT NULL::text, NULL::integer, NULL::bigint, NULL::integer, NULL::bigint,
                 NULL::text, NULL::bigint, NULL::text, NULL::bigint, NULL::text WHERE false $$;

-- The view, with the limits' columns at the end (CREATE OR REPLACE may add
-- columns after the existing ones only). The limits come through
-- limit_stats(), which reads pgjobd.queue_limits and the jobs' other columns
-- only when its caller may: a reference here would make the view refuse a
-- reader that may not.
CREATE OR REPLACE VIEW pgjobd.queue_stats WITH (security_invoker = true) AS
 WITH s AS (
         SELECT jobs.queue,
            count(*) FILTER (WHERE (jobs.status = 'queued'::text)) AS queued,
            count(*) FILTER (WHERE (jobs.status = 'running'::text)) AS running,
            count(*) FILTER (WHERE (jobs.status = 'succeeded'::text)) AS succeeded,
            count(*) FILTER (WHERE (jobs.status = 'failed'::text)) AS failed,
            count(*) FILTER (WHERE (jobs.status = 'cancelled'::text)) AS cancelled,
            max((now() - jobs.run_at)) FILTER (WHERE ((jobs.status = 'queued'::text) AND (jobs.run_at <= now()))) AS oldest_queued_age,
            count(*) FILTER (WHERE ((jobs.status = 'failed'::text) AND (jobs.finished_at > (now() - '01:00:00'::interval)))) AS failed_last_hour
           FROM pgjobd.jobs
          GROUP BY jobs.queue
        )
 SELECT COALESCE(s.queue, p.queue, l.queue) AS queue,
    COALESCE(s.queued, (0)::bigint) AS queued,
    COALESCE(s.running, (0)::bigint) AS running,
    COALESCE(s.succeeded, (0)::bigint) AS succeeded,
    COALESCE(s.failed, (0)::bigint) AS failed,
    COALESCE(s.cancelled, (0)::bigint) AS cancelled,
    s.oldest_queued_age,
    (p.queue IS NOT NULL) AS paused,
    COALESCE(s.failed_last_hour, (0)::bigint) AS failed_last_hour,
    l.concurrency,
    l.concurrency_used,
    l.group_concurrency,
    l.group_concurrency_used,
    l.rate,
    l.rate_used,
    l.group_rate,
    l.group_rate_used,
    l.throttled
   FROM ((s
     FULL JOIN pgjobd.paused_queues p ON ((p.queue = s.queue)))
     FULL JOIN pgjobd.limit_stats() l(queue, concurrency, concurrency_used, group_concurrency, group_concurrency_used, rate, rate_used, group_rate, group_rate_used, throttled) ON ((l.queue = COALESCE(s.queue, p.queue))));
