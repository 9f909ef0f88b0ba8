-- 004_cheap_enqueue.sql - schema version 4: an INSERT pays for nobody.
--
-- Measured with `make bench` (issue 5), the statement trigger of version 3
-- cost 20 % of the single-row INSERT throughput of 16 producers without
-- groups and 35-45 % with them. Two things made it cost:
--
--   1. The group lock row was created by the producer's INSERT
--      (INSERT ... ON CONFLICT DO NOTHING into pgjobd.groups, once per
--      statement with grouped rows). Now the claim that first takes a group
--      creates its row (try_group_head_v2 below); a producer never writes
--      pgjobd.groups.
--   2. Every statement looked up its queues in pgjobd.waiting. Now one look
--      at the table comes first: when no daemon is waiting for any queue
--      (they are all busy, or none runs), which is when producers outrun
--      the daemons, the trigger returns at once.

CREATE OR REPLACE FUNCTION pgjobd.jobs_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgjobd.waiting) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('pgjobd', d.queue)
       FROM (SELECT DISTINCT n.queue FROM new_jobs n) d
      WHERE EXISTS (SELECT 1 FROM pgjobd.waiting w WHERE w.queue = d.queue);
    RETURN NULL;
END
$$;

-- Version 3's function, except that a group without a lock row gets one
-- here, by the first claim that takes the group, without ever waiting: the
-- transaction-level try-lock (class 1886020107, a hash of queue and group)
-- keeps a second claimer from inserting the same row concurrently, which
-- would make it wait for the first one's commit. A claimer that does not
-- get the try-lock treats the group as busy for this call.
CREATE OR REPLACE FUNCTION pgjobd.try_group_head_v2(q text, g text, jid bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
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
        IF NOT pg_try_advisory_xact_lock(1886020107, hashtext(q || E'\n' || g)) THEN
            RETURN 0; -- another claimer is creating it
        END IF;
        INSERT INTO pgjobd.groups (queue, group_id) VALUES (q, g)
            ON CONFLICT DO NOTHING RETURNING id INTO gid;
        IF gid IS NULL THEN
            RETURN 0; -- created and committed since our first look
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
    IF NOT pg_try_advisory_lock(1886020103, (gid & 2147483647)::int) THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = jid AND j.status = 'queued' AND j.run_at <= statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        PERFORM pg_advisory_unlock(1886020103, (gid & 2147483647)::int);
        RETURN -1;
    END IF;
    RETURN gid;
END
$$;

SELECT pgjobd.grant_roles();
