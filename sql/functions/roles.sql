-- sql/functions/roles.sql - the roles pgjobd_producer and pgjobd_worker and
-- what they may do. setup_roles (`pgjobd migrate --grant`) creates them;
-- grant_roles grants every right, through one grant_* function per concern,
-- to whichever of them exists; every migration ends by calling it, and so does
-- this file (below).

-- grant_fencing(): the worker role's rights of fencing and the claim.
CREATE OR REPLACE FUNCTION pgjobd.grant_fencing() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobd.workers TO pgjobd_worker;
        GRANT USAGE ON SEQUENCE pgjobd.fence_seq TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION
              pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                 bigint[], bigint[], bigint[]),
              pgjobd.register_worker(text, int), pgjobd.heartbeat(bigint),
              pgjobd.worker_gone(bigint), pgjobd.release_worker(text),
              pgjobd.forget_workers(),
              pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint),
              pgjobd.hold_group(text, text, bigint, timestamptz, int)
              TO pgjobd_worker;
    END IF;
END
$$;

-- grant_groups(): blocked groups (sql/functions/groups.sql). Who may pause
-- a queue may pause, resume and release a group (the worker role, as the
-- CLI runs); producers only read pgjobd.blocked_groups, which shows each
-- its own groups (sees_group).
CREATE OR REPLACE FUNCTION pgjobd.grant_groups() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT SELECT ON pgjobd.blocked_groups TO pgjobd_producer;
        GRANT EXECUTE ON FUNCTION pgjobd.sees_group(text) TO pgjobd_producer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, INSERT, UPDATE, DELETE ON pgjobd.group_blocks TO pgjobd_worker;
        GRANT SELECT ON pgjobd.blocked_groups TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION pgjobd.sees_group(text), pgjobd.group_blocked(text, text),
              pgjobd.group_mark(text, text), pgjobd.group_mark_job(bigint),
              pgjobd.group_unmark(text, text), pgjobd.unblock_group(text, text, text),
              pgjobd.pause_group(text, text), pgjobd.resume_group(text, text),
              pgjobd.release_group(text, text)
              TO pgjobd_worker;
    END IF;
END
$$;

-- grant_history(): the attempts' history.
CREATE OR REPLACE FUNCTION pgjobd.grant_history() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT SELECT (history) ON pgjobd.jobs TO pgjobd_producer;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT EXECUTE ON FUNCTION pgjobd.retry(bigint), pgjobd.lock_dedupe_key(text, text),
              pgjobd.release_claim(bigint, bigint, boolean, jsonb, int, bigint, jsonb)
              TO pgjobd_worker;
    END IF;
END
$$;

-- grant_lease(): lock mode lease, and claim_batch as the daemon calls it.
CREATE OR REPLACE FUNCTION pgjobd.grant_lease() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT EXECUTE ON FUNCTION
              pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                 bigint[], bigint[], bigint[], bigint),
              pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                 bigint[], bigint),
              pgjobd.extend_leases(bigint, bigint[], bigint[]), pgjobd.finish_leases(jsonb)
              TO pgjobd_worker;
    END IF;
END
$$;

-- grant_locks(): the maintenance lock.
CREATE OR REPLACE FUNCTION pgjobd.grant_locks() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT, UPDATE ON pgjobd.maintenance_lock TO pgjobd_worker;
    END IF;
END
$$;

-- grant_ops(): the workers' queues, for `pgjobd status`.
CREATE OR REPLACE FUNCTION pgjobd.grant_ops() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT EXECUTE ON FUNCTION pgjobd.register_worker(text, int, text[]) TO pgjobd_worker;
    END IF;
END
$$;

-- grant_roles(): every grant, to the roles that exist.
CREATE OR REPLACE FUNCTION pgjobd.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
        -- Only when off: ALTER TABLE locks the table, and every upgrade runs this.
        IF NOT (SELECT c.relrowsecurity FROM pg_class c WHERE c.oid = 'pgjobd.jobs'::regclass) THEN
            ALTER TABLE pgjobd.jobs ENABLE ROW LEVEL SECURITY;
        END IF;
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
              pgjobd.maintain(text[], bigint[], int, int),
              pgjobd.try_group_head(text, text, bigint, int) TO pgjobd_worker;
    END IF;
    PERFORM pgjobd.grant_fencing();
    PERFORM pgjobd.grant_security();
    PERFORM pgjobd.grant_locks();
    PERFORM pgjobd.grant_ops();
    PERFORM pgjobd.grant_schedules();
    PERFORM pgjobd.grant_history();
    PERFORM pgjobd.grant_lease();
    PERFORM pgjobd.grant_limits();
    PERFORM pgjobd.grant_groups();
    PERFORM pgjobd.grant_progress();
END
$$;

-- grant_schedules(): the schedules.
CREATE OR REPLACE FUNCTION pgjobd.grant_schedules() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- grant_security(): queue grants, wake-ups and row-level security.
CREATE OR REPLACE FUNCTION pgjobd.grant_security() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        GRANT SELECT ON pgjobd.queue_grants TO pgjobd_producer;
        GRANT SELECT (queue) ON pgjobd.paused_queues TO pgjobd_producer;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'queue_grants'
                          AND policyname = 'producer_select') THEN
            CREATE POLICY producer_select ON pgjobd.queue_grants FOR SELECT
                TO pgjobd_producer
                USING (pg_catalog.pg_has_role(current_user, role, 'MEMBER'));
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'paused_queues'
                          AND policyname = 'producer_select') THEN
            CREATE POLICY producer_select ON pgjobd.paused_queues FOR SELECT
                TO pgjobd_producer
                USING (EXISTS (SELECT 1 FROM pgjobd.queue_grants g
                                WHERE g.queue IN (paused_queues.queue, '*')
                                  AND pg_catalog.pg_has_role(current_user, g.role, 'MEMBER')));
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT ON pgjobd.wake_secret TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION pgjobd.wake_payload(text) TO pgjobd_worker;
        IF NOT EXISTS (SELECT 1 FROM pg_policies
                        WHERE schemaname = 'pgjobd' AND tablename = 'paused_queues'
                          AND policyname = 'worker_all') THEN
            CREATE POLICY worker_all ON pgjobd.paused_queues TO pgjobd_worker
                USING (true) WITH CHECK (true);
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer')
       AND NOT (SELECT c.relrowsecurity FROM pg_class c
                 WHERE c.oid = 'pgjobd.paused_queues'::regclass) THEN
        ALTER TABLE pgjobd.paused_queues ENABLE ROW LEVEL SECURITY;
    END IF;
END
$$;

-- setup_roles(): create the NOLOGIN roles when missing (needs CREATEROLE),
-- then grant_roles().
CREATE OR REPLACE FUNCTION pgjobd.setup_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_producer') THEN
        CREATE ROLE pgjobd_producer NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        CREATE ROLE pgjobd_worker NOLOGIN;
    END IF;
    PERFORM pgjobd.grant_roles();
END
$$;

-- The grants of every function above to the roles that exist (setup_roles
-- creates them: `pgjobd migrate --grant`).
SELECT pgjobd.grant_roles();
