-- 005_lazy_groups.sql - schema version 5: a producer's INSERT no longer
-- writes pgjobd.groups; the first claim of a group creates its lock row.
--
-- Measured with `make bench`, creating group rows in the INSERT
-- trigger (INSERT ... ON CONFLICT DO NOTHING once per statement with grouped
-- rows) cost a quarter of the single-row INSERT throughput of 16 producers,
-- against a tenth without groups. The claim already created a missing row
-- (maintain() deletes the rows of groups with nothing left to run), so the
-- trigger's insert is dropped and the claim's becomes the only one.
--
-- Version 4 tried this and went back: over a 1,000,000-job backlog nearly
-- every claim then creates a group row, into a table whose statistics were
-- taken while it was nearly empty; the plans try_group_head_v2 caches for
-- its session keep the sequential scan they chose for a tiny table while
-- the table grows, until autovacuum analyzes it again, and the claim rate
-- fell by a quarter. The function now plans without sequential scans
-- (SET enable_seqscan = off, for its own statements only): each of them is
-- a lookup by a unique key, which an index answers at any size.

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

-- Version 3's function, except that a missing group row is created without
-- ever waiting: the transaction-level try-lock (class 1886020107, a hash of
-- queue and group; a collision only makes one claimer skip a group for one
-- call) keeps a second claimer from inserting the same row concurrently,
-- which would make it wait for the first one's commit. A claimer that does
-- not get the try-lock treats the group as busy for this call.
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
