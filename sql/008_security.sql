-- 008_security.sql - schema version 8: what a role without pgjobd rights
-- can learn or cause through NOTIFY.
--
--   wake-ups       the payload of NOTIFY pgjobd was the queue's name, which
--                  any role could read with LISTEN pgjobd. It is now
--                  sha256(secret || queue) in hex, with a random secret per
--                  installation in pgjobd.wake_secret, readable by the
--                  owner and the worker role only; a daemon computes the
--                  payload of each queue it serves and ignores any other.
--   cancel         pgjobd.cancel() notifies pgjobd_cancel with an empty
--                  payload. A daemon never acts on a payload of that
--                  channel: a notification only makes it read
--                  pgjobd.cancel_requests at once, which only the owner and
--                  the worker role can write.
--
-- Daemons of version 6 keep running against this schema (claim_batch is
-- unchanged), but they no longer recognise wake-up payloads: they start
-- jobs at their poll_interval until they are upgraded.

-- ---------------------------------------------------------------- wake-ups

-- One row: the installation's secret for wake-up payloads. 64 hex digits
-- from two random UUIDs (gen_random_uuid() draws from the server's strong
-- random source): 244 random bits. Readable by the owner and the worker
-- role (grant_security()); a producer or any other role cannot read it, so
-- it cannot tell which queue a payload stands for. Replacing it takes effect
-- in each daemon at its next connection to the database (restart them).
CREATE TABLE pgjobd.wake_secret (
    secret text NOT NULL CONSTRAINT "secret must be 64 hex digits"
           CHECK (secret ~ '^[0-9a-f]{64}$')
);
CREATE UNIQUE INDEX wake_secret_one_row ON pgjobd.wake_secret ((true));
INSERT INTO pgjobd.wake_secret (secret)
VALUES (replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

-- The payload of NOTIFY pgjobd for p_queue: sha256 of the secret followed by
-- the queue name, in lowercase hex (64 characters). The daemon computes the
-- same (src/sha256.c). Queue names are ASCII, so their bytes are the same in
-- every server encoding. Reads one row, locks nothing.
CREATE FUNCTION pgjobd.wake_payload(p_queue text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT encode(sha256(convert_to(s.secret || p_queue, 'UTF8')), 'hex')
      FROM pgjobd.wake_secret s
$$;

-- Version 5's trigger function, the payload hashed: one sha256 per distinct
-- queue with a waiting daemon, per statement. It runs as the owner
-- (SECURITY DEFINER), which may read the secret.
CREATE OR REPLACE FUNCTION pgjobd.jobs_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgjobd.waiting) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify('pgjobd', pgjobd.wake_payload(d.queue))
       FROM (SELECT DISTINCT n.queue FROM new_jobs n) d
      WHERE EXISTS (SELECT 1 FROM pgjobd.waiting w WHERE w.queue = d.queue);
    RETURN NULL;
END
$$;

-- Version 3's function, the payload hashed. Called by the worker role or the
-- owner, both of which may read the secret.
CREATE OR REPLACE FUNCTION pgjobd.resume(p_queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    DELETE FROM pgjobd.paused_queues p WHERE p.queue = p_queue;
    IF FOUND THEN
        PERFORM pg_notify('pgjobd', pgjobd.wake_payload(p_queue));
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- Version 3's function, with an empty payload: the daemon reads the job ids
-- from pgjobd.cancel_requests, and a role listening on the channel learns
-- only that some job was cancelled.
CREATE OR REPLACE FUNCTION pgjobd.cancel(p_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    s text;
BEGIN
    -- A job can move between the two statements (a claim makes it running;
    -- a failed attempt makes it queued again), and each statement sees the
    -- latest committed state: a few rounds settle it.
    FOR round IN 1 .. 5 LOOP
        -- jobs_cancelled fills finished_at, updated_at and the error.
        UPDATE pgjobd.jobs j SET status = 'cancelled'
         WHERE j.id = p_id AND j.status = 'queued';
        IF FOUND THEN
            RETURN true;
        END IF;
        SELECT j.status INTO s FROM pgjobd.jobs j WHERE j.id = p_id;
        IF s = 'running' THEN
            INSERT INTO pgjobd.cancel_requests (job_id) VALUES (p_id) ON CONFLICT DO NOTHING;
            PERFORM pg_notify('pgjobd_cancel', '');
            RETURN true;
        END IF;
        EXIT WHEN s IS DISTINCT FROM 'queued';
    END LOOP;
    RETURN false;
END
$$;

-- ---------------------------------------------------------------- roles

-- The grants of this version, for the roles that exist; idempotent, called
-- by grant_roles().
CREATE FUNCTION pgjobd.grant_security() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pgjobd_worker') THEN
        GRANT SELECT ON pgjobd.wake_secret TO pgjobd_worker;
        GRANT EXECUTE ON FUNCTION pgjobd.wake_payload(text) TO pgjobd_worker;
    END IF;
END
$$;

-- Version 6's grant_roles(), everything it granted kept, then this
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
                WITH CHECK (created_by = current_user);
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
END
$$;

-- The owner's alone (and superusers'), and the worker role's.
REVOKE EXECUTE ON FUNCTION pgjobd.wake_payload(text), pgjobd.grant_security() FROM PUBLIC;

SELECT pgjobd.grant_roles();
