-- 008_security.sql - schema version 8: what a producer may enqueue, and what
-- a role without pgjobd rights can learn or cause through NOTIFY.
--
--   queue grants   pgjobd.queue_grants (role, queue; '*' is every queue).
--                  A producer's INSERT needs a grant for the job's queue to
--                  the producer or to a role it is a member of. Enforced by
--                  PostgreSQL: the producer_insert row-level security
--                  policy checks it for every row (plain INSERT, multi-row
--                  INSERT, INSERT ... SELECT; COPY FROM is refused outright
--                  to a role under row-level security), and a BEFORE INSERT
--                  trigger that fires ahead of jobs_dedupe refuses a row
--                  with a dedupe_key before that trigger can lock or look
--                  up the key. Managed with pgjobd.grant_queue(role, queue)
--                  and pgjobd.revoke_queue(role, queue), the owner's alone.
--   the default    a new installation grants nothing: each producer gets the
--                  queues it needs. An installation upgraded while
--                  pgjobd_producer has members gets a grant of '*' to
--                  pgjobd_producer, so that its producers go on exactly as
--                  before (a WARNING says how to narrow it); single-team
--                  installations may keep it, or give it on purpose.
--   queue_stats    runs with the rights of whoever reads it (security
--                  invoker): a producer counts its own jobs only, and sees
--                  paused rows only of queues it is granted.
--   wake-ups       the payload of NOTIFY pgjobd was the queue's name, which
--                  any role could read with LISTEN pgjobd. It is now
--                  sha256(secret || queue) in hex, with a random secret per
--                  installation in pgjobd.wake_secret, readable by the
--                  owner and the worker role only; a daemon computes the
--                  payload of each queue it serves and ignores any other.
--   cancel         pgjobd.cancel() notifies pgjobd_cancel with an empty
--                  payload. Daemons of this version act on no payload of
--                  that channel: a notification only makes them read
--                  pgjobd.cancel_requests at once, which only the owner and
--                  the worker role can write.
--
-- Locks taken by this migration, in one transaction with every other
-- statement of the upgrade: ACCESS EXCLUSIVE on pgjobd.jobs to replace the
-- producer_insert policy (as every migration's grant_roles() already takes
-- for ALTER TABLE ... ENABLE ROW LEVEL SECURITY once producers exist): the
-- upgrade waits for running jobs of lock mode `transaction` to finish, and
-- INSERTs and claims wait for the upgrade's commit. The new trigger takes
-- SHARE ROW EXCLUSIVE on pgjobd.jobs, the view and pgjobd.paused_queues
-- ACCESS EXCLUSIVE; those are held for no longer than the first.
--
-- Daemons of older versions keep running against this schema until they
-- are upgraded, or until their listener reconnects and stops them on the
-- version mismatch (this migration changes no function they call), with two
-- differences: they no longer recognise wake-up payloads, so they start
-- jobs at their poll_interval, and they see cancel notifications without
-- an id, so they cancel a running job at their once-a-second read of
-- pgjobd.cancel_requests.

-- ---------------------------------------------------------------- queue grants

-- Who may enqueue into which queue. The primary key leads with the queue:
-- the INSERT check looks up exactly two keys (the queue and '*'). A role is
-- kept as a regrole, its OID, as PostgreSQL keeps the grantees of its own
-- privileges: it reads as the role's name, a grant follows its role through
-- a rename, and the check hands it to pg_has_role() as it is. (Kept by
-- name, the check had to join pg_roles to find the OID without raising for
-- a dropped role; planned anew for every INSERT sent as a simple query,
-- that cost over two thirds of a producer's single-row INSERT rate, and
-- the OID about a sixth.) A grant to a role that is later dropped stays
-- here, reads as its number, and matches nobody (pg_has_role() is false
-- for an OID no role has).
CREATE TABLE pgjobd.queue_grants (
    queue      text NOT NULL
               CONSTRAINT "queue must be * or 1 to 63 characters of A-Z a-z 0-9 _ . -"
               CHECK (queue = '*' OR queue ~ '^[A-Za-z0-9_.-]{1,63}$'),
    role       regrole NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    granted_by name NOT NULL DEFAULT session_user,
    PRIMARY KEY (queue, role)
);

-- A producer reads the grants of the roles it is a member of, and no
-- others: another producer's queue names are not its business (the
-- policies are created by grant_security() below). The owner bypasses
-- row-level security. A new, empty table: the lock this takes waits for
-- nobody.
ALTER TABLE pgjobd.queue_grants ENABLE ROW LEVEL SECURITY;

-- true when the current role may enqueue into p_queue: it is not subject
-- to row-level security on pgjobd.jobs (the owner, a superuser), or it is a
-- member of pgjobd_worker (whose policy lets it write any row), or it or a
-- role it is a member of has a grant for p_queue or '*'. Otherwise it
-- raises insufficient_privilege (42501) naming the queue. Not SECURITY
-- DEFINER: it judges the caller, reading pgjobd.queue_grants with the
-- caller's rights (a producer sees exactly the rows that can match it). The
-- fixed search_path keeps a caller's own functions and operators out of
-- the check. Takes no locks beyond ACCESS SHARE on the tables it reads.
CREATE FUNCTION pgjobd.check_queue_grant(p_queue text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Two statements: PostgreSQL checks the rights on every table of a
    -- statement before it runs any of it, and the roles that pass here
    -- need no right on pgjobd.queue_grants.
    IF NOT row_security_active('pgjobd.jobs')
       OR EXISTS (SELECT 1 FROM pg_roles r
                   WHERE r.rolname = 'pgjobd_worker' AND pg_has_role(current_user, r.oid, 'MEMBER'))
    THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT 1 FROM pgjobd.queue_grants g
                WHERE g.queue IN (p_queue, '*') AND pg_has_role(current_user, g.role, 'MEMBER'))
    THEN
        RETURN true;
    END IF;
    RAISE EXCEPTION 'permission denied to enqueue into queue %', quote_literal(p_queue)
        USING ERRCODE = 'insufficient_privilege',
              DETAIL = format('Role %s has no grant for queue %s or for every queue (*).',
                              quote_ident(current_user), quote_literal(p_queue)),
              HINT = 'The schema''s owner grants one with SELECT pgjobd.grant_queue(role, queue).';
END
$$;

-- Rows with a dedupe_key: the check, before jobs_dedupe runs (PostgreSQL
-- fires the BEFORE triggers of an event in name order, and jobs_check_grant
-- sorts before jobs_dedupe). jobs_dedupe runs as the owner: it takes a
-- transaction-level lock on the key and looks for an unfinished job with it,
-- and a row it drops never reaches the policy check. Without this trigger a
-- producer with no grant for a queue could hold another producer's key
-- locked, or learn whether a key is taken (INSERT 0 0 instead of an error).
-- Every other row is checked by the policy alone (a trigger per row costs
-- every INSERT). Locks nothing.
CREATE FUNCTION pgjobd.jobs_check_grant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pgjobd.check_queue_grant(NEW.queue);
    RETURN NEW;
END
$$;

-- SHARE ROW EXCLUSIVE on pgjobd.jobs: waits for INSERTs and UPDATEs in
-- progress (short), not for running jobs (their slots hold ROW SHARE).
CREATE TRIGGER jobs_check_grant BEFORE INSERT ON pgjobd.jobs
    FOR EACH ROW WHEN (NEW.dedupe_key IS NOT NULL)
    EXECUTE FUNCTION pgjobd.jobs_check_grant();

-- Grants p_queue ('*': every queue) to p_role. true when this call added
-- the grant, false when it was there. Raises for a role that does not
-- exist or a bad queue name. SECURITY DEFINER, with EXECUTE revoked from
-- PUBLIC: the owner may delegate the right to grant queues to an admin role
-- with GRANT EXECUTE, without giving it the table. Locks the grant's key in
-- the primary key index while it inserts (ON CONFLICT DO NOTHING: a second
-- granter of the same key waits for the first one's commit, then does
-- nothing).
CREATE FUNCTION pgjobd.grant_queue(p_role name, p_queue text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    rid oid;
BEGIN
    SELECT r.oid INTO rid FROM pg_roles r WHERE r.rolname = p_role;
    IF rid IS NULL THEN
        RAISE EXCEPTION 'role % does not exist', coalesce(quote_ident(p_role), 'NULL')
            USING ERRCODE = 'undefined_object';
    END IF;
    IF p_queue IS DISTINCT FROM '*' THEN
        PERFORM pgjobd.check_queue_name(p_queue);
    END IF;
    INSERT INTO pgjobd.queue_grants (queue, role, granted_by)
    VALUES (p_queue, rid::regrole, session_user)
    ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Takes the grant back. true when there was one. Row-locks the one row it
-- deletes. A job already inserted stays queued and runs. (The grants of a
-- dropped role have no name left; the owner deletes them from the table,
-- if at all: they match nobody.)
CREATE FUNCTION pgjobd.revoke_queue(p_role name, p_queue text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgjobd.queue_grants g
     WHERE g.queue = p_queue
       AND g.role = (SELECT r.oid FROM pg_roles r WHERE r.rolname = p_role);
    RETURN FOUND;
END
$$;

-- The default (see the top): upgraded installations whose producers could
-- enqueue into every queue keep that until the operator narrows it.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid
                WHERE r.rolname = 'pgjobd_producer') THEN
        INSERT INTO pgjobd.queue_grants (queue, role)
        SELECT '*', r.oid::regrole FROM pg_roles r WHERE r.rolname = 'pgjobd_producer';
        RAISE WARNING 'pgjobd_producer has members: granted every queue (''*'') to '
                      'pgjobd_producer so that they can enqueue as before'
            USING HINT = 'To give each producer its own queues, grant them with '
                         'SELECT pgjobd.grant_queue(role, queue), then '
                         'SELECT pgjobd.revoke_queue(''pgjobd_producer'', ''*'').';
    END IF;
END
$$;

-- The producer_insert policy with the queue check: grant_roles() below
-- creates it again. A policy cannot be altered in place without repeating
-- it here; DROP and CREATE in this one transaction are seen by nobody in
-- between. ACCESS EXCLUSIVE on pgjobd.jobs (see the top).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_policies
                WHERE schemaname = 'pgjobd' AND tablename = 'jobs'
                  AND policyname = 'producer_insert') THEN
        DROP POLICY producer_insert ON pgjobd.jobs;
    END IF;
END
$$;

-- ---------------------------------------------------------------- queue_stats

-- With the rights of whoever reads it: row-level security on pgjobd.jobs
-- and pgjobd.paused_queues applies to producers (their own jobs; paused
-- rows of their granted queues), while the owner and the worker role see
-- everything. A producer needs SELECT on the columns the view reads, which
-- it has on jobs (queue, status, run_at, finished_at) and is given on
-- paused_queues (queue) by grant_security(). ACCESS EXCLUSIVE on the view
-- only (readers of the view hold it for a moment).
ALTER VIEW pgjobd.queue_stats SET (security_invoker = true);

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

-- The grants and policies of this version, for the roles that exist;
-- idempotent, called by grant_roles(). Row-level security on
-- pgjobd.paused_queues is turned on together with the policies that let
-- the worker role see and write every row, once pgjobd_producer exists (as
-- for pgjobd.jobs): from then on a role other than the owner and superusers
-- reaches paused queues only as a member of one of the two roles. Enabling
-- it takes ACCESS EXCLUSIVE on that small table, and only the first time.
CREATE FUNCTION pgjobd.grant_security() RETURNS void
LANGUAGE plpgsql AS $$
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

-- Version 6's grant_roles(), everything it granted kept, with the queue
-- check in the producer_insert policy, then this version's grants. The
-- policy's own EXISTS is the check on the path every granted INSERT takes
-- (an expression stored with the policy: no function call, and parsed once,
-- so no caller's search_path reaches it); only a row it refuses reaches
-- check_queue_grant(), which raises with the queue's name.
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
END
$$;

-- The owner's alone (and superusers'), unless the owner grants EXECUTE.
-- check_queue_grant() stays executable by PUBLIC: a policy and a trigger
-- call it as the inserting role, and it tells a caller nothing it could
-- not learn by inserting.
REVOKE EXECUTE ON FUNCTION pgjobd.grant_queue(name, text), pgjobd.revoke_queue(name, text),
       pgjobd.wake_payload(text), pgjobd.grant_security() FROM PUBLIC;

SELECT pgjobd.grant_roles();
