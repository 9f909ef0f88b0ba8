-- 004_cheap_enqueue.sql - schema version 4: the INSERT trigger skips its
-- NOTIFY lookup when no daemon waits.
--
-- Measured with `make bench`, the statement trigger of version 3
-- cost 10-20 % of the single-row INSERT throughput of 16 producers without
-- groups. Most of it was the lookup of the statement's queues (a query over
-- the transition table) in pgjobd.waiting. One look at that small table now
-- comes first: when no daemon is waiting for any queue (they are all busy,
-- or none runs), which is when producers outrun the daemons, the lookup is
-- skipped. Group rows are still created here, as in version 2.
--
-- (Creating group rows at a group's first claim instead was tried: it made
-- grouped INSERTs as cheap as ungrouped ones, but a claim over a large
-- backlog then inserts a group row per job into a table whose statistics
-- say it is empty, and cached plans scan it sequentially: the claim rate of
-- the 1,000,000-job backlog fell by a quarter.)

CREATE OR REPLACE FUNCTION pgjobd.jobs_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_jobs n WHERE n.group_id IS NOT NULL) THEN
        INSERT INTO pgjobd.groups (queue, group_id)
            SELECT DISTINCT n.queue, n.group_id FROM new_jobs n WHERE n.group_id IS NOT NULL
            ON CONFLICT DO NOTHING;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgjobd.waiting) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('pgjobd', d.queue)
       FROM (SELECT DISTINCT n.queue FROM new_jobs n) d
      WHERE EXISTS (SELECT 1 FROM pgjobd.waiting w WHERE w.queue = d.queue);
    RETURN NULL;
END
$$;

SELECT pgjobd.grant_roles();
