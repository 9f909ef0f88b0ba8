-- 020_isolation.sql - schema version 20: roles that share a database cannot
-- reach each other through pgjobd.
--
-- Every function of schema pgjobd pins its search_path. Most did not: they
-- ran with the caller's, so a function or operator that another role had
-- created in a schema on that path (public, which a database owner may
-- write to) could be picked for one that a body names without a schema
-- (an `integer * interval` has no exact match in pg_catalog, and one in
-- public would win over the implicit cast), and run with the rights of the
-- daemon or of an operator's superuser session. The daemon and the command
-- line pin the same path in each of their sessions (src/db.h); this pins it
-- for every other caller as well. Bodies name pgjobd's objects with their
-- schema, so pg_catalog and pg_temp are all they need (pg_temp is never
-- searched for functions or operators). A function a later migration
-- creates must say SET search_path = pg_catalog, pg_temp itself.


-- Bounded keys. group_id and dedupe_key had no size: a 200 KB group_id
-- reached the command's environment and failed its spawn (E2BIG), and
-- either key is held in indexes. 1 KiB, in bytes, refused at INSERT (and
-- UPDATE) with SQLSTATE 23514 naming the constraint. NOT VALID, then
-- VALIDATE: the check of the rows already there takes no lock that stops
-- producers or daemons; a database that holds a longer key keeps it (and
-- the constraint stays NOT VALID, with a warning) rather than failing the
-- upgrade: new rows are checked either way.
ALTER TABLE pgjobd.jobs
      ADD CONSTRAINT jobs_group_id_max_1kib CHECK (octet_length(group_id) <= 1024) NOT VALID,
      ADD CONSTRAINT jobs_dedupe_key_max_1kib CHECK (octet_length(dedupe_key) <= 1024) NOT VALID;
ALTER TABLE pgjobd.schedules
      ADD CONSTRAINT schedules_group_id_max_1kib CHECK (octet_length(group_id) <= 1024) NOT VALID;
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM (VALUES ('pgjobd.jobs', 'jobs_group_id_max_1kib'),
                                   ('pgjobd.jobs', 'jobs_dedupe_key_max_1kib'),
                                   ('pgjobd.schedules', 'schedules_group_id_max_1kib')) v(t, n)
    LOOP
        BEGIN
            EXECUTE pg_catalog.format('ALTER TABLE %s VALIDATE CONSTRAINT %I', c.t, c.n);
        EXCEPTION WHEN check_violation THEN
            RAISE WARNING '% holds a key over 1 KiB: constraint % left NOT VALID (new rows are checked)',
                c.t, c.n;
        END;
    END LOOP;
END
$$;

-- ---------------------------------------------------------------- producers sharing a queue
--
-- Two producers granted the same queue could reach each other's jobs
-- through the columns they set: one's dedupe_key made the other's INSERT
-- of that key insert nothing (and told it the key existed), one's job
-- with run_at = 'infinity' held back everything else, and one could fill
-- the queue without bound. Now, unless the queue is declared shared:
--   - a dedupe key is scoped to the role that inserted the job
--     (created_by): another role's unfinished job with the same key is
--     not looked at, and the unique index is on (queue, dedupe_key,
--     created_by);
--   - a producer's run_at is at most 1 year ahead ('infinity' included:
--     refused with 23514);
--   - pgjobd.set_quota(role, queue, max_queued) bounds the jobs a role
--     may have queued in a queue ('*': in each queue), checked at INSERT.
-- Jobs inserted by one role behave as before. Groups are not scoped by
-- this version: a group_id names the same group for every role of a
-- queue (pgjobd(8), SECURITY MODEL).

-- One row per queue with a policy of its own. shared: producers of the
-- queue share dedupe keys, as before this version.
CREATE TABLE pgjobd.queue_policies (
    queue      text PRIMARY KEY
               CONSTRAINT "queue must be * or 1 to 63 characters of A-Z a-z 0-9 _ . -"
               CHECK (queue ~ '^[A-Za-z0-9_.-]{1,63}$'),
    shared     boolean NOT NULL DEFAULT false,
    changed_at timestamptz NOT NULL DEFAULT now(),
    changed_by name NOT NULL DEFAULT session_user
);

-- Declares a queue shared (true) or isolated (false, the default).
-- Returns whether that changed anything. The owner's (and a superuser's):
-- execution is revoked from everyone else.
CREATE FUNCTION pgjobd.share_queue(p_queue text, p_shared boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    was boolean;
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    SELECT p.shared INTO was FROM pgjobd.queue_policies p WHERE p.queue = p_queue FOR UPDATE;
    IF coalesce(was, false) = coalesce(p_shared, false) THEN
        RETURN false;
    END IF;
    INSERT INTO pgjobd.queue_policies AS p (queue, shared) VALUES (p_queue, coalesce(p_shared, false))
    ON CONFLICT (queue) DO UPDATE SET shared = EXCLUDED.shared, changed_at = now(),
                                      changed_by = session_user;
    RETURN true;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.share_queue(text, boolean) FROM PUBLIC;

-- The scope of a dedupe key of a job that role p_role inserts into
-- p_queue: '' (every role's) in a shared queue, else the role.
CREATE FUNCTION pgjobd.dedupe_scope(p_queue text, p_role text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM pgjobd.queue_policies p
                              WHERE p.queue = p_queue AND p.shared)
                THEN '' ELSE coalesce(p_role, '') END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.dedupe_scope(text, text) FROM PUBLIC;

-- The lock on a key becomes a lock on (queue, key, scope).
ALTER TABLE pgjobd.dedupe_locks ADD COLUMN scope text NOT NULL DEFAULT '';
ALTER TABLE pgjobd.dedupe_locks DROP CONSTRAINT dedupe_locks_pkey,
      ADD PRIMARY KEY (queue, dedupe_key, scope);

-- 009_row_locks.sql's dedupe_lock_done, for the scope.
CREATE OR REPLACE FUNCTION pgjobd.dedupe_lock_done() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM pgjobd.dedupe_locks d
     WHERE d.queue = NEW.queue AND d.dedupe_key = NEW.dedupe_key AND d.scope = NEW.scope;
    RETURN NULL;
END
$$;

-- 016_history.sql's lock_dedupe_key, with the scope; the two-argument one
-- locks the shared scope ('').
CREATE FUNCTION pgjobd.lock_dedupe_key(p_queue text, p_key text, p_scope text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    LOOP
        INSERT INTO pgjobd.dedupe_locks (queue, dedupe_key, scope)
        VALUES (p_queue, p_key, p_scope)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        PERFORM 1 FROM pgjobd.dedupe_locks d
         WHERE d.queue = p_queue AND d.dedupe_key = p_key AND d.scope = p_scope
         FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.lock_dedupe_key(text, text, text) FROM PUBLIC;

-- 009_row_locks.sql's jobs_dedupe: the lock and the look-up in the key's
-- scope. created_by is the inserting role (a producer cannot set it: the
-- insert policy checks it is current_user).
CREATE OR REPLACE FUNCTION pgjobd.jobs_dedupe() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s text := pgjobd.dedupe_scope(NEW.queue, NEW.created_by);
BEGIN
    PERFORM pgjobd.lock_dedupe_key(NEW.queue, NEW.dedupe_key, s);
    IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                WHERE j.queue = NEW.queue AND j.dedupe_key = NEW.dedupe_key
                  AND (s = '' OR j.created_by = NEW.created_by)
                  AND j.status IN ('queued', 'running')) THEN
        RETURN NULL; -- an unfinished job has this key: insert nothing
    END IF;
    RETURN NEW;
END
$$;

-- One unfinished job per (queue, key) and role; in a shared queue the
-- trigger's lock keeps it one per (queue, key).
DROP INDEX pgjobd.jobs_dedupe;
CREATE UNIQUE INDEX jobs_dedupe ON pgjobd.jobs (queue, dedupe_key, created_by)
    WHERE dedupe_key IS NOT NULL AND status IN ('queued', 'running');

-- 016_history.sql's retry: the key's lock and look-up in its scope. As
-- the owner now (only the owner and the worker role may call it, as
-- before), since the scope and the lock are the owner's to read and take.
CREATE OR REPLACE FUNCTION pgjobd.retry(p_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j record;
    s text;
BEGIN
    SELECT r.queue, r.dedupe_key, r.created_by INTO j FROM pgjobd.jobs r
     WHERE r.id = p_id AND r.status IN ('succeeded', 'failed', 'cancelled')
     FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF j.dedupe_key IS NOT NULL THEN
        s := pgjobd.dedupe_scope(j.queue, j.created_by);
        PERFORM pgjobd.lock_dedupe_key(j.queue, j.dedupe_key, s);
        IF EXISTS (SELECT 1 FROM pgjobd.jobs o
                    WHERE o.queue = j.queue AND o.dedupe_key = j.dedupe_key
                      AND (s = '' OR o.created_by = j.created_by)
                      AND o.status IN ('queued', 'running') AND o.id <> p_id) THEN
            RETURN false;
        END IF;
    END IF;
    UPDATE pgjobd.jobs r SET status = 'queued', attempts = 0, run_at = now(),
           error = NULL, result = NULL, finished_at = NULL, started_at = NULL,
           worker = NULL, worker_id = NULL, held_until = NULL,
           expires_at = CASE WHEN r.expires_at <= now() THEN NULL ELSE r.expires_at END,
           updated_at = clock_timestamp()
     WHERE r.id = p_id;
    IF EXISTS (SELECT 1 FROM pgjobd.waiting w WHERE w.queue = j.queue) THEN
        PERFORM pg_notify('pgjobd', pgjobd.wake_payload(j.queue));
    END IF;
    RETURN true;
END
$$;

-- run_at: a producer may delay a job by at most a year. The trigger runs
-- only for rows beyond that (its WHEN is evaluated without calling it),
-- so it costs other INSERTs nothing. A producer is a role as
-- check_queue_grant (008_security.sql) tells one: row-level security
-- applies to it and it is not a member of pgjobd_worker. A queue it has no
-- grant for is refused as such first (42501), as any INSERT into it is.
CREATE FUNCTION pgjobd.jobs_run_at_bound() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF row_security_active('pgjobd.jobs')
       AND NOT EXISTS (SELECT 1 FROM pg_roles r
                        WHERE r.rolname = 'pgjobd_worker'
                          AND pg_has_role(current_user, r.oid, 'MEMBER')) THEN
        PERFORM pgjobd.check_queue_grant(NEW.queue);
        RAISE EXCEPTION 'run_at % is more than 1 year ahead', NEW.run_at
            USING ERRCODE = 'check_violation', CONSTRAINT = 'jobs_run_at_max_1_year',
                  HINT = 'A producer role may delay a job by at most 1 year (pgjobd(8), SECURITY MODEL).';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_run_at_bound BEFORE INSERT ON pgjobd.jobs
    FOR EACH ROW WHEN (NEW.run_at > now() + interval '1 year')
    EXECUTE FUNCTION pgjobd.jobs_run_at_bound();

-- Quotas: at most max_queued jobs `queued` per role in a queue ('*': in
-- each queue; a row for the queue itself wins). Checked after each INSERT
-- statement that put jobs of a role with a quota into a queue, under a
-- row lock on the quota, so that concurrent INSERTs by that role into that
-- queue count each other; an INSERT that would go over fails whole. The
-- count reads the queue's queued jobs (jobs_ready_* by queue): a quota
-- costs that role's INSERTs a look at its queue. With no quota at all, an
-- INSERT pays one look at an empty table.
CREATE TABLE pgjobd.quotas (
    role       regrole NOT NULL,
    queue      text NOT NULL
               CONSTRAINT "queue must be * or 1 to 63 characters of A-Z a-z 0-9 _ . -"
               CHECK (queue = '*' OR queue ~ '^[A-Za-z0-9_.-]{1,63}$'),
    max_queued integer NOT NULL CHECK (max_queued >= 0),
    PRIMARY KEY (role, queue)
);

-- Sets (NULL: removes) role's quota in queue ('*': each queue). Returns
-- whether that changed anything. The owner's alone.
CREATE FUNCTION pgjobd.set_quota(p_role name, p_queue text, p_max_queued integer)
RETURNS boolean
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
    IF p_max_queued IS NULL THEN
        DELETE FROM pgjobd.quotas q WHERE q.role = rid::regrole AND q.queue = p_queue;
        RETURN FOUND;
    END IF;
    INSERT INTO pgjobd.quotas AS q (role, queue, max_queued)
    VALUES (rid::regrole, p_queue, p_max_queued)
    ON CONFLICT (role, queue) DO UPDATE SET max_queued = EXCLUDED.max_queued
    WHERE q.max_queued IS DISTINCT FROM EXCLUDED.max_queued;
    RETURN FOUND;
END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.set_quota(name, text, integer) FROM PUBLIC;

CREATE FUNCTION pgjobd.jobs_quota() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    n bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgjobd.quotas) THEN
        RETURN NULL;
    END IF;
    FOR r IN
        SELECT d.created_by, d.queue, q.role, q.queue AS qq, q.max_queued
          FROM (SELECT DISTINCT n.created_by, n.queue FROM new_jobs n
                 WHERE n.status = 'queued') d
          JOIN LATERAL (SELECT * FROM pgjobd.quotas q
                         WHERE q.queue IN (d.queue, '*')
                           AND q.role = to_regrole(d.created_by)
                         ORDER BY q.queue = '*' LIMIT 1) q ON true
         ORDER BY d.created_by, d.queue
    LOOP
        PERFORM 1 FROM pgjobd.quotas q WHERE q.role = r.role AND q.queue = r.qq FOR UPDATE;
        SELECT count(*) INTO n FROM pgjobd.jobs j
         WHERE j.queue = r.queue AND j.status = 'queued' AND j.created_by = r.created_by;
        IF n > r.max_queued THEN
            RAISE EXCEPTION 'role % may have at most % jobs queued in queue %, this INSERT makes %',
                quote_ident(r.created_by), r.max_queued, r.queue, n
                USING ERRCODE = 'program_limit_exceeded',
                      HINT = 'Wait for jobs to start, or ask the owner to raise the quota (pgjobd.set_quota).';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_quota AFTER INSERT ON pgjobd.jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION pgjobd.jobs_quota();

-- Last: every function of the schema, including any created above.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'pgjobd'::pg_catalog.regnamespace
           AND p.prokind IN ('f', 'p')
           AND NOT EXISTS (SELECT FROM pg_catalog.unnest(p.proconfig) c
                            WHERE c LIKE 'search_path=%')
    LOOP
        EXECUTE pg_catalog.format('ALTER ROUTINE %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END
$$;
