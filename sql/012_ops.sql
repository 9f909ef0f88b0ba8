-- 012_ops.sql - schema version 12: the queues each daemon serves.
--
--   workers.queues  the names of the queues a daemon instance serves (its
--                   [queue.NAME] sections), sent when it registers and again
--                   after each reload; NULL for a daemon of an older version,
--                   which does not say. `pgjobd status` counts the live
--                   daemons serving each queue and warns about a queue with
--                   queued jobs and none; `pgjobd enqueue`, `pause` and
--                   `resume` warn about a queue that neither their own file
--                   nor any live daemon serves. The heartbeat is unchanged
--                   (one UPDATE of alive_until); the list is written only at
--                   registration and reload, so it costs nothing per beat.
--   register_worker(name, fence_ms, queues)
--                   version 6's registration with the list; the two-argument
--                   one stays for daemons of older versions still running
--                   during an upgrade.
--
-- Locks taken by this migration: ACCESS EXCLUSIVE on pgjobd.workers for
-- the ADD COLUMN (a nullable column without a default: no rewrite, held for
-- a moment). Heartbeats and registrations of running daemons wait for the
-- upgrade's commit, well within their fence deadline for an upgrade of
-- normal length; nothing touches pgjobd.jobs.

ALTER TABLE pgjobd.workers ADD COLUMN queues text[];

-- Version 6's registration, with the queues the instance serves.
CREATE FUNCTION pgjobd.register_worker(p_name text, p_fence_ms int, p_queues text[])
RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO pgjobd.workers (name, fence_ms, alive_until, queues)
    VALUES (p_name, p_fence_ms, clock_timestamp() + p_fence_ms * interval '1 millisecond'
                                + pgjobd.fence_margin(p_fence_ms), p_queues)
    RETURNING id
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.register_worker(text, int, text[]) FROM PUBLIC;

-- The grants of this version, for the roles that exist; idempotent, called
-- by grant_roles(). A daemon updates its own row's queues after a reload
-- with the UPDATE right on pgjobd.workers it has had since version 6.
CREATE FUNCTION pgjobd.grant_ops() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT EXECUTE ON FUNCTION pgjobd.register_worker(text, int, text[]) TO pgjobd_worker;
    END IF;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.grant_ops() FROM PUBLIC;

-- Version 9's grant_roles(), everything it granted kept, then this
-- version's grants.
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
END
$$;

SELECT pgjobd.grant_roles();
