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
-- Jobs inserted by one role behave as before. Groups are scoped the same
-- way (below).

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

-- ---------------------------------------------------------------- groups scoped to producers
--
-- A group was the jobs of one (queue, group_id), whoever inserted them: a
-- producer that used another's group id ran in that group's order, and its
-- own job that waited or failed held the other's jobs back. Now a grouped
-- job that a producer inserts into a queue that is not shared carries a
-- group_key, the group id scoped to the role (E'\x01' role E'\x01'
-- group_id); every other job (the owner's, the worker's, a superuser's,
-- and any in a shared queue) has none. Wherever the protocol asks which
-- group a job is in it reads coalesce(group_key, group_id): the head and
-- running indexes, the claim (its grouped scan, heads, hold marks, orphan
-- pass), try_group_head, hold_group, the commit-order and head-changed
-- triggers, and maintain's group rows (pgjobd.groups.group_id holds that
-- identity). group_id itself, what the producer reads and what the command
-- gets as PGJOBD_GROUP_ID, is unchanged; so is everything a role's own
-- jobs do among themselves.

ALTER TABLE pgjobd.jobs ADD COLUMN group_key text;

-- The group key of a job that p_role inserts into p_queue with group id
-- p_group_id: NULL unless p_role is a producer (a member of
-- pgjobd_producer that neither is a superuser, exempt from row-level
-- security or the table's owner, nor a member of pgjobd_worker) and the
-- queue is not shared.
CREATE FUNCTION pgjobd.group_key(p_queue text, p_role text, p_group_id text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN p_group_id IS NULL THEN NULL
                WHEN NOT coalesce((SELECT CASE WHEN r.rolsuper OR r.rolbypassrls
                                                    OR r.oid = (SELECT c.relowner FROM pg_class c
                                                                 WHERE c.oid = 'pgjobd.jobs'::regclass)
                                                    OR to_regrole('pgjobd_producer') IS NULL
                                               THEN false
                                               WHEN to_regrole('pgjobd_worker') IS NOT NULL
                                                    AND pg_has_role(r.oid, 'pgjobd_worker', 'MEMBER')
                                               THEN false
                                               ELSE pg_has_role(r.oid, 'pgjobd_producer', 'MEMBER') END
                                     FROM pg_roles r WHERE r.rolname = p_role), false)
                THEN NULL
                WHEN pgjobd.dedupe_scope(p_queue, p_role) = '' THEN NULL
                ELSE E'\x01' || p_role || E'\x01' || p_group_id END
$$;
REVOKE EXECUTE ON FUNCTION pgjobd.group_key(text, text, text) FROM PUBLIC;

-- Sets group_key on INSERT, and again when an UPDATE moves the job to
-- another queue or group (as the owner: the role test and the queue's
-- policy are the owner's to read). A grouped INSERT pays one call.
CREATE FUNCTION pgjobd.jobs_group_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.group_key := pgjobd.group_key(NEW.queue, NEW.created_by, NEW.group_id);
    RETURN NEW;
END
$$;
CREATE TRIGGER jobs_group_key BEFORE INSERT OR UPDATE OF queue, group_id, created_by
    ON pgjobd.jobs FOR EACH ROW
    WHEN (NEW.group_id IS NOT NULL OR NEW.group_key IS NOT NULL)
    EXECUTE FUNCTION pgjobd.jobs_group_key();

-- The producers' grouped jobs already there, finished ones included (a
-- retry puts them back). It waits for the row locks of the running ones
-- (their slots' transactions): their group moves with them, so that a
-- running job and the queued ones of its group never find themselves in
-- two groups.
UPDATE pgjobd.jobs j SET group_key = pgjobd.group_key(j.queue, j.created_by, j.group_id)
 WHERE j.group_id IS NOT NULL
   AND pgjobd.group_key(j.queue, j.created_by, j.group_id) IS NOT NULL;

DROP INDEX pgjobd.jobs_group_head;
CREATE INDEX jobs_group_head ON pgjobd.jobs
    (queue, coalesce(group_key, group_id), coalesce(commit_seq, id))
    WHERE status IN ('queued', 'running') AND coalesce(group_key, group_id) IS NOT NULL;
DROP INDEX pgjobd.jobs_group_running;
CREATE INDEX jobs_group_running ON pgjobd.jobs (queue, coalesce(group_key, group_id))
    WHERE status = 'running' AND coalesce(group_key, group_id) IS NOT NULL;

-- claim_batch (twelve arguments): group identity is coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.claim_batch(p_queue text, p_worker_id bigint, p_workers text[], p_max_attempts integer, p_timeout_ms bigint, p_max_data bigint, p_scan integer, p_orphans boolean, p_release_jobs bigint[], p_release_groups bigint[], p_skip bigint[], p_lease_ms bigint) RETURNS TABLE(slot integer, job_id bigint, group_row bigint, group_id text, attempts integer, max_attempts integer, timeout_ms bigint, fence bigint, data text, arg_keys text[], arg_vals text[], schedule text, scheduled_for text)
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    want int := coalesce(array_length(p_workers, 1), 0);
    ids bigint[] := '{}';   -- picked jobs, in start order
    gids bigint[] := '{}';  -- their group rows (NULL: ungrouped)
    r record;
    gid bigint;
    u_ids bigint[];
    u_pri int[];
    u_run timestamptz[];
    nu int;
    ui int := 1;
    busy text[] := '{}';
    n int := 0;
    scan_cut boolean := false;
    own boolean;
    head record;
    budget int := p_scan;   -- groups this call may still mark held
BEGIN
    IF want = 0 THEN
        RETURN;
    END IF;

    -- A daemon whose heartbeat lapsed may have lost its jobs already: it
    -- starts nothing until it has registered again.
    IF NOT EXISTS (SELECT 1 FROM pgjobd.workers w
                    WHERE w.id = p_worker_id AND w.alive_until > clock_timestamp()) THEN
        RETURN;
    END IF;

    -- Paused: start nothing, not even orphans (running one again is a
    -- start). resume() sends the NOTIFY that brings us back.
    IF EXISTS (SELECT 1 FROM pgjobd.paused_queues p WHERE p.queue = p_queue) THEN
        DELETE FROM pgjobd.waiting w WHERE w.queue = p_queue AND w.pid = pg_backend_pid();
        RETURN;
    END IF;

    -- Marks whose time has come (see version 7).
    IF EXISTS (SELECT 1 FROM pgjobd.jobs h
                WHERE h.queue = p_queue AND h.status = 'queued'
                  AND h.held_until <= statement_timestamp()) THEN
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.id IN (SELECT h.id FROM pgjobd.jobs h
                         WHERE h.queue = p_queue AND h.status = 'queued'
                           AND h.held_until <= statement_timestamp()
                         ORDER BY h.held_until LIMIT p_scan
                         FOR UPDATE SKIP LOCKED);
    END IF;

    -- Orphans first: running jobs that no slot holds and that may be taken,
    -- our own that none of our slots answers for (not in p_skip: claimed
    -- for us, but never started) and other daemons' whose daemon's
    -- alive_until has passed. A slot that holds a job holds its group row
    -- and its job row; both are tried with SKIP LOCKED, group row first, the
    -- order every claim and hold locks them in. A lease-held job holds
    -- neither: its lease decides (see 017_lease.sql).
    IF p_orphans THEN
        DELETE FROM pgjobd.waiting w
         WHERE w.queue = p_queue
           AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = w.pid);
        -- [lease E2] also the claim's fence and lease
        FOR r IN SELECT j.id, coalesce(j.group_key, j.group_id) AS group_id, j.attempts, j.max_attempts, j.worker_id, j.fence,
                        j.lease_until, j.lease_ms
                   FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'running'
                  ORDER BY j.id
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            CONTINUE WHEN r.id = ANY(p_skip);
            own := r.worker_id IS NOT DISTINCT FROM p_worker_id;
            -- Another daemon's job: only once that daemon's claim lapsed.
            -- [lease E3] A lease-held job: once its lease and the margin have
            -- passed, whatever its daemon's alive_until says; a job held by
            -- an open transaction: once its daemon's alive_until passed.
            CONTINUE WHEN NOT own AND r.lease_until IS NOT NULL
                          AND r.lease_until + pgjobd.lease_margin(r.lease_ms) > clock_timestamp();
            CONTINUE WHEN NOT own AND r.lease_until IS NULL AND EXISTS (
                SELECT 1 FROM pgjobd.workers w
                 WHERE w.id = r.worker_id AND w.alive_until > clock_timestamp());
            gid := NULL;
            IF r.group_id IS NOT NULL THEN
                SELECT g.id INTO gid FROM pgjobd.groups g
                 WHERE g.queue = p_queue AND g.group_id = r.group_id;
                IF gid IS NULL THEN
                    -- maintain() deleted it in a race with this job's
                    -- claim; the job row lock (below) still tells whether
                    -- a slot holds it.
                    INSERT INTO pgjobd.groups (queue, group_id) VALUES (p_queue, r.group_id)
                        ON CONFLICT DO NOTHING RETURNING id INTO gid;
                END IF;
                CONTINUE WHEN gid IS NULL;
                PERFORM 1 FROM pgjobd.groups g WHERE g.id = gid FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
            END IF;
            -- [lease E4] still the same claim (nobody took it over since the
            -- loop read it: a lease claim leaves no lock behind), and for a
            -- lease not extended meanwhile: the row as locked is rechecked.
            PERFORM 1 FROM pgjobd.jobs j WHERE j.id = r.id AND j.status = 'running'
               AND j.fence IS NOT DISTINCT FROM r.fence
               AND (own OR j.lease_until IS NULL
                    OR j.lease_until + pgjobd.lease_margin(j.lease_ms) <= clock_timestamp())
             FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
            IF own THEN
                -- Claimed for us, held by none of our slots: it never
                -- started. Queued again, the attempt given back; it is a
                -- candidate again below, in its turn.
                -- [lease E5] its lease goes with it (as below, whenever a
                -- running job ends here)
                UPDATE pgjobd.jobs j SET status = 'queued', attempts = j.attempts - 1,
                       worker = NULL, worker_id = NULL, started_at = NULL,
                       lease_until = NULL, lease_ms = NULL,
                       updated_at = clock_timestamp()
                 WHERE j.id = r.id;
                CONTINUE;
            END IF;
            IF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = r.id) THEN
                -- Cancelled while its daemon died: it stays cancelled.
                UPDATE pgjobd.jobs j SET status = 'cancelled', finished_at = clock_timestamp(),
                       updated_at = clock_timestamp(), lease_until = NULL, lease_ms = NULL,
                       error = jsonb_build_object('reason', 'cancelled', 'exit_code', NULL,
                               'signal', NULL, 'stderr', NULL,
                               'message', 'cancelled; the daemon running it was gone')
                 WHERE j.id = r.id;
                DELETE FROM pgjobd.cancel_requests c WHERE c.job_id = r.id;
                CONTINUE;
            END IF;
            IF r.attempts >= least(coalesce(r.max_attempts, p_max_attempts), p_max_attempts) THEN
                -- Its last attempt died with its daemon: a failed attempt.
                UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(),
                       updated_at = clock_timestamp(), lease_until = NULL, lease_ms = NULL,
                       error = jsonb_build_object('reason', 'lost_lock', 'exit_code', NULL,
                               'signal', NULL, 'stderr', NULL,
                               'message', 'the daemon running this job lost its claim')
                 WHERE j.id = r.id;
                CONTINUE;
            END IF;
            -- An orphan: run it again, counting a new attempt.
            ids := ids || r.id;
            gids := gids || gid;
            IF r.group_id IS NOT NULL THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;

    -- The best ready ungrouped jobs: one probe of jobs_ready_free, locked.
    -- (Expired rows are filtered here until maintain() cancels them.) A
    -- locked queued job is ours to start: any other claim of it would have
    -- to lock it first.
    SELECT array_agg(c.id ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.priority ORDER BY c.priority, c.run_at, c.id),
           array_agg(c.run_at ORDER BY c.priority, c.run_at, c.id)
      INTO u_ids, u_pri, u_run
      FROM (SELECT j.id, j.priority, j.run_at FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NULL
               AND j.run_at <= statement_timestamp()
               AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
             ORDER BY j.priority, j.run_at, j.id
             FOR UPDATE SKIP LOCKED
             LIMIT want - coalesce(array_length(ids, 1), 0)) c;
    nu := coalesce(array_length(u_ids, 1), 0);

    -- Grouped jobs in start order, up to the last ungrouped candidate when
    -- there are enough of those, bounded by p_scan (see version 2). Jobs
    -- marked held are not in jobs_ready_grouped, and not candidates.
    IF coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN SELECT j.id, coalesce(j.group_key, j.group_id) AS group_id, j.priority, j.run_at FROM pgjobd.jobs j
                  WHERE j.queue = p_queue AND j.status = 'queued' AND j.group_id IS NOT NULL
                    AND j.held_until IS NULL AND j.run_at <= statement_timestamp()
                    AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
                    AND (j.priority, j.run_at, j.id) <
                        (CASE WHEN nu > 0 AND nu + coalesce(array_length(ids, 1), 0) >= want
                              THEN u_pri[nu] ELSE 2147483647 END,
                         CASE WHEN nu > 0 AND nu + coalesce(array_length(ids, 1), 0) >= want
                              THEN u_run[nu] ELSE 'infinity' END,
                         CASE WHEN nu > 0 AND nu + coalesce(array_length(ids, 1), 0) >= want
                              THEN u_ids[nu] ELSE 9223372036854775807 END)
                  ORDER BY j.priority, j.run_at, j.id
                  LIMIT p_scan + 1
        LOOP
            WHILE ui <= nu AND coalesce(array_length(ids, 1), 0) < want
                  AND (u_pri[ui], u_run[ui], u_ids[ui]) < (r.priority, r.run_at, r.id) LOOP
                ids := ids || u_ids[ui];
                gids := gids || NULL::bigint;
                ui := ui + 1;
            END LOOP;
            EXIT WHEN array_length(ids, 1) >= want;
            n := n + 1;
            IF n > p_scan THEN
                scan_cut := true;
                EXIT;
            END IF;
            CONTINUE WHEN r.group_id = ANY(busy);
            -- The group's head, by a plain read of jobs_group_head (no lock,
            -- nothing written). Only a candidate that heads its group goes
            -- on to try_group_head, which locks the group row and checks
            -- the head again under that lock.
            SELECT j.id, j.status, j.run_at, j.expires_at INTO head FROM pgjobd.jobs j
             WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) = r.group_id
               AND j.status IN ('queued', 'running')
             ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
            IF head.id IS DISTINCT FROM r.id THEN
                -- A ready head comes later in this scan (or in a later
                -- call); a running head, or one that expired, keeps the
                -- group busy.
                CONTINUE WHEN head.status = 'queued'
                              AND (head.expires_at IS NULL
                                   OR head.expires_at > statement_timestamp())
                              AND head.run_at <= statement_timestamp();
                busy := busy || r.group_id;
                -- A head waiting out a backoff: take the group's later jobs
                -- out of the scan until it is due.
                IF head.status = 'queued' AND head.run_at > statement_timestamp()
                   AND (head.expires_at IS NULL OR head.expires_at > statement_timestamp())
                   AND budget > 0 THEN
                    PERFORM pgjobd.hold_group(p_queue, r.group_id, head.id, head.run_at,
                                              p_scan);
                    budget := budget - 1;
                END IF;
                CONTINUE;
            END IF;
            gid := pgjobd.try_group_head(p_queue, r.group_id, r.id);
            IF gid > 0 THEN
                ids := ids || r.id;
                gids := gids || gid;
                busy := busy || r.group_id;
            ELSIF gid = 0 THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;
    WHILE ui <= nu AND coalesce(array_length(ids, 1), 0) < want LOOP
        ids := ids || u_ids[ui];
        gids := gids || NULL::bigint;
        ui := ui + 1;
    END LOOP;

    -- The bounded scan met only busy groups: visit each group's head once
    -- (a loose index scan over jobs_group_head), O(groups). Only ready heads
    -- are tried, so only groups that may start have their row locked.
    IF scan_cut AND coalesce(array_length(ids, 1), 0) < want THEN
        FOR r IN WITH RECURSIVE heads AS (
                     (SELECT coalesce(j.group_key, j.group_id) AS group_id, j.id, j.status, j.run_at, j.expires_at, j.held_until
                        FROM pgjobd.jobs j
                       WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) IS NOT NULL
                         AND j.status IN ('queued', 'running')
                       ORDER BY coalesce(j.group_key, j.group_id), coalesce(j.commit_seq, j.id) LIMIT 1)
                     UNION ALL
                     SELECT nx.group_id, nx.id, nx.status, nx.run_at, nx.expires_at,
                            nx.held_until FROM heads h,
                       LATERAL (SELECT coalesce(j.group_key, j.group_id) AS group_id, j.id, j.status, j.run_at, j.expires_at,
                                       j.held_until
                                  FROM pgjobd.jobs j
                                 WHERE j.queue = p_queue AND coalesce(j.group_key, j.group_id) > h.group_id
                                   AND j.status IN ('queued', 'running')
                                 ORDER BY coalesce(j.group_key, j.group_id), coalesce(j.commit_seq, j.id) LIMIT 1) nx)
                 SELECT h.group_id, h.id, h.run_at, h.held_until FROM heads h
                  WHERE h.status = 'queued'
                    AND (h.expires_at IS NULL OR h.expires_at > statement_timestamp())
        LOOP
            EXIT WHEN array_length(ids, 1) >= want;
            IF r.run_at > statement_timestamp() THEN
                -- A head waiting out a backoff that is not marked yet (see
                -- version 7): mark its group while this walk meets it.
                IF r.held_until IS NULL AND budget > 0 THEN
                    PERFORM pgjobd.hold_group(p_queue, r.group_id, r.id, r.run_at, p_scan);
                    budget := budget - 1;
                END IF;
                CONTINUE;
            END IF;
            CONTINUE WHEN r.group_id = ANY(busy);
            gid := pgjobd.try_group_head(p_queue, r.group_id, r.id);
            IF gid > 0 THEN
                ids := ids || r.id;
                gids := gids || gid;
                busy := busy || r.group_id;
            ELSIF gid = 0 THEN
                busy := busy || r.group_id;
            END IF;
        END LOOP;
    END IF;

    -- Slots left idle: wake me (see pgjobd.waiting).
    IF coalesce(array_length(ids, 1), 0) < want THEN
        INSERT INTO pgjobd.waiting (queue, pid) VALUES (p_queue, pg_backend_pid())
            ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM pgjobd.waiting w WHERE w.queue = p_queue AND w.pid = pg_backend_pid();
    END IF;
    IF coalesce(array_length(ids, 1), 0) = 0 THEN
        RETURN;
    END IF;

    -- Data larger than max_data is never loaded: the job fails and its slot
    -- stays idle for this call; a group's next job may start after it. The
    -- size is the data's as stored (pg_column_size reads it without loading
    -- a TOASTed value). A value that compresses very well (20 MB of one
    -- repeated character is stored in about 230 kB) would still bring far
    -- more than that into the daemon, so a compressed value whose text is
    -- longer than 16 times max_data fails too: a daemon never loads more
    -- than that per job. Only compressed values are decompressed for this.
    UPDATE pgjobd.jobs j SET status = 'failed', finished_at = clock_timestamp(),
           updated_at = clock_timestamp(), worker = NULL, worker_id = NULL,
           lease_until = NULL, lease_ms = NULL,
           error = jsonb_build_object('reason', 'data_too_large', 'exit_code', NULL,
                   'signal', NULL, 'stderr', NULL,
                   'message', 'data is larger than the queue''s max_data',
                   'data_bytes', pg_column_size(j.data),
                   'text_bytes', CASE WHEN pg_column_compression(j.data) IS NOT NULL
                                      THEN octet_length(j.data::text) END,
                   'max_data', p_max_data)
     WHERE j.id = ANY(ids)
       AND (pg_column_size(j.data) > p_max_data
            OR (pg_column_compression(j.data) IS NOT NULL
                AND octet_length(j.data::text) > 16 * p_max_data));

    RETURN QUERY
        WITH t AS (SELECT p.id, p.gid, p.n::int AS slot
                     FROM unnest(ids, gids) WITH ORDINALITY AS p(id, gid, n)),
             u AS (
                -- [lease E6] a lease claim commits its lease; a transaction
                -- claim has none (also when it takes over a lease-held job)
                UPDATE pgjobd.jobs j SET status = 'running', attempts = j.attempts + 1,
                       worker = p_workers[t.slot], worker_id = p_worker_id,
                       fence = nextval('pgjobd.fence_seq'),
                       lease_until = clock_timestamp() + p_lease_ms * interval '1 millisecond',
                       lease_ms = p_lease_ms,
                       started_at = clock_timestamp(),
                       updated_at = clock_timestamp(), finished_at = NULL
                  FROM t
                 WHERE j.id = t.id AND j.status IN ('queued', 'running')
                RETURNING t.slot, j.id, t.gid, j.group_id, j.attempts, j.max_attempts,
                          j.timeout, j.fence, j.data,
                          j.schedule, j.scheduled_for)  -- 014
        SELECT u.slot, u.id, u.gid, u.group_id, u.attempts,
               least(coalesce(u.max_attempts, p_max_attempts), p_max_attempts),
               -- NULL: the queue's timeout applies. A job's own timeout
               -- is at least 1 ms and never above a queue's non-zero one.
               CASE WHEN u.timeout IS NULL THEN NULL
                    WHEN p_timeout_ms > 0
                    THEN least(p_timeout_ms,
                               greatest(1, ceil(extract(epoch FROM u.timeout) * 1000)))::bigint
                    ELSE greatest(1, ceil(extract(epoch FROM u.timeout) * 1000))::bigint END
               AS job_timeout_ms,
               u.fence, u.data::text, a.keys, a.vals,
               -- 014: the schedule and its tick
               u.schedule,
               to_char(u.scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
          FROM u, LATERAL (
              SELECT coalesce(array_agg(e.key ORDER BY e.key), '{}') AS keys,
                     coalesce(array_agg(e.value #>> '{}' ORDER BY e.key), '{}') AS vals
                FROM jsonb_each(CASE WHEN jsonb_typeof(u.data) = 'object'
                                     THEN u.data ELSE '{}' END) e
               WHERE jsonb_typeof(e.value) IN ('string', 'number', 'boolean')) a
         ORDER BY u.slot;
END
$$;

-- try_group_head: group identity is coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.try_group_head(q text, g text, jid bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
        INSERT INTO pgjobd.groups (queue, group_id) VALUES (q, g)
            ON CONFLICT DO NOTHING RETURNING id INTO gid;
        IF gid IS NULL THEN
            RETURN 0; -- another claim created it since our first look
        END IF;
    END IF;
    SELECT j.id, j.status, j.run_at, j.expires_at INTO head FROM pgjobd.jobs j
     WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status IN ('queued', 'running')
     ORDER BY coalesce(j.commit_seq, j.id) LIMIT 1;
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
    -- jid heads the group, but a job later in its order may run: one that a
    -- claim started before jid became visible (or queued again), whose slot
    -- does not hold the group row yet, or whose daemon died.
    IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status = 'running') THEN
        RETURN 0;
    END IF;
    PERFORM 1 FROM pgjobd.jobs j
     WHERE j.id = jid AND j.status = 'queued' AND j.run_at <= statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    RETURN gid;
END
$$;

-- hold_group: group identity is coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.hold_group(q text, g text, p_head bigint, p_until timestamp with time zone, p_limit integer) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n int;
    head_key bigint;
BEGIN
    SELECT coalesce(j.commit_seq, j.id) INTO head_key FROM pgjobd.jobs j
     WHERE j.id = p_head AND j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status = 'queued'
       AND j.run_at = p_until AND j.run_at > statement_timestamp()
       AND (j.expires_at IS NULL OR j.expires_at > statement_timestamp())
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    -- Of the later jobs only ready ones: one with a later run_at of its own
    -- is not in the scan's range; when it is, a claim marks it if need be.
    UPDATE pgjobd.jobs j SET held_until = p_until
     WHERE j.id IN (SELECT s.id FROM pgjobd.jobs s
                     WHERE s.queue = q AND coalesce(s.group_key, s.group_id) = g
                       AND coalesce(s.commit_seq, s.id) >= head_key
                       AND s.status = 'queued' AND s.held_until IS NULL
                       AND (s.id = p_head OR s.run_at <= statement_timestamp())
                     ORDER BY coalesce(s.commit_seq, s.id) LIMIT p_limit
                     FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- jobs_commit_order: group identity is coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.jobs_commit_order() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    k bigint := coalesce(NEW.commit_seq, NEW.id);
    me xid8;
    r record;
    own_above boolean;
BEGIN
    -- Under REPEATABLE READ or SERIALIZABLE the statements here would see
    -- the transaction's snapshot, not what was committed since: renumber.
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT o.commit_seq, o.enqueued_xact INTO r FROM pgjobd.jobs o
         WHERE o.queue = NEW.queue AND coalesce(o.group_key, o.group_id) = coalesce(NEW.group_key, NEW.group_id)
           AND o.status IN ('queued', 'running') AND o.id <> NEW.id
           AND coalesce(o.commit_seq, o.id) > k
         ORDER BY coalesce(o.commit_seq, o.id) LIMIT 1;
        IF NOT FOUND THEN
            RETURN NULL; -- last of its group already
        END IF;
        me := pg_current_xact_id();
        own_above := TG_OP = 'INSERT' AND r.commit_seq IS NULL AND r.enqueued_xact = me;
        IF own_above AND current_setting('pgjobd.renumbered', true) = 'on' THEN
            -- A renumbered job of this group would be its last.
            SELECT o.commit_seq, o.enqueued_xact INTO r FROM pgjobd.jobs o
             WHERE o.queue = NEW.queue AND coalesce(o.group_key, o.group_id) = coalesce(NEW.group_key, NEW.group_id)
               AND o.status IN ('queued', 'running')
             ORDER BY coalesce(o.commit_seq, o.id) DESC LIMIT 1;
            own_above := r.commit_seq IS NULL AND r.enqueued_xact = me;
        END IF;
        IF own_above THEN
            SELECT o.commit_seq, o.enqueued_xact INTO r FROM pgjobd.jobs o
             WHERE o.queue = NEW.queue AND coalesce(o.group_key, o.group_id) = coalesce(NEW.group_key, NEW.group_id)
               AND o.status IN ('queued', 'running')
               AND coalesce(o.commit_seq, o.id) < k
             ORDER BY coalesce(o.commit_seq, o.id) DESC LIMIT 1;
            IF FOUND AND r.commit_seq IS NULL AND r.enqueued_xact = me THEN
                RETURN NULL; -- placed with the transaction's job just below
            END IF;
            IF NOT EXISTS (SELECT 1 FROM pgjobd.jobs o
                            WHERE o.queue = NEW.queue AND coalesce(o.group_key, o.group_id) = coalesce(NEW.group_key, NEW.group_id)
                              AND o.status IN ('queued', 'running') AND o.id <> NEW.id
                              AND coalesce(o.commit_seq, o.id) > k
                              AND (o.commit_seq IS NOT NULL
                                   OR o.enqueued_xact IS DISTINCT FROM me)) THEN
                RETURN NULL; -- only its own transaction's later jobs above
            END IF;
        END IF;
    END IF;
    UPDATE pgjobd.jobs j SET commit_seq = nextval('pgjobd.jobs_id_seq')
     WHERE j.id = NEW.id AND j.status = 'queued' AND j.group_id IS NOT NULL;
    PERFORM set_config('pgjobd.renumbered', 'on', true);
    RETURN NULL;
END
$$;

-- jobs_head_changed: group identity is coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.jobs_head_changed() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.queue = OLD.queue AND coalesce(j.group_key, j.group_id) = coalesce(OLD.group_key, OLD.group_id)
           AND coalesce(j.commit_seq, j.id) > coalesce(OLD.commit_seq, OLD.id)
           AND j.status = 'queued'
           AND j.held_until IS NOT NULL;
    ELSE
        UPDATE pgjobd.jobs j SET held_until = NULL
         WHERE j.queue = OLD.queue AND coalesce(j.group_key, j.group_id) = coalesce(OLD.group_key, OLD.group_id)
           AND coalesce(j.commit_seq, j.id) > coalesce(OLD.commit_seq, OLD.id)
           AND j.status = 'queued';
    END IF;
    RETURN NULL;
END
$$;

-- maintain: group identity is coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.maintain(p_queues text[], p_retention_ms bigint[], p_limit integer, OUT locked boolean, OUT expired integer, OUT deleted integer, OUT more boolean) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    i int;
    n int;
BEGIN
    expired := 0;
    deleted := 0;
    more := false;
    PERFORM 1 FROM pgjobd.maintenance_lock FOR UPDATE SKIP LOCKED;
    locked := FOUND;
    IF NOT locked THEN
        RETURN;
    END IF;

    UPDATE pgjobd.jobs j SET status = 'cancelled', finished_at = clock_timestamp(),
           updated_at = clock_timestamp(),
           error = jsonb_build_object('reason', 'expired', 'exit_code', NULL, 'signal', NULL,
                   'stderr', NULL, 'message', 'expired before it started',
                   'expires_at', j.expires_at)
     WHERE j.id IN (SELECT e.id FROM pgjobd.jobs e
                     WHERE e.status = 'queued' AND e.expires_at <= statement_timestamp()
                     ORDER BY e.expires_at LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS expired = ROW_COUNT;
    more := expired >= p_limit;

    -- jobs_cancelled fills finished_at, updated_at and the error.
    UPDATE pgjobd.jobs j SET status = 'cancelled'
     WHERE j.id IN (SELECT q.id FROM pgjobd.jobs q
                      JOIN pgjobd.cancel_requests c ON c.job_id = q.id
                     WHERE q.status = 'queued' FOR UPDATE OF q SKIP LOCKED);
    DELETE FROM pgjobd.cancel_requests c
     WHERE NOT EXISTS (SELECT 1 FROM pgjobd.jobs j
                        WHERE j.id = c.job_id AND j.status IN ('queued', 'running'));

    FOR i IN 1 .. coalesce(array_length(p_queues, 1), 0) LOOP
        CONTINUE WHEN coalesce(p_retention_ms[i], 0) <= 0;
        WITH d AS (
            DELETE FROM pgjobd.jobs j
             WHERE j.id IN (SELECT f.id FROM pgjobd.jobs f
                             WHERE f.queue = p_queues[i]
                               AND f.status IN ('succeeded', 'failed', 'cancelled')
                               AND f.finished_at < statement_timestamp()
                                   - p_retention_ms[i] * interval '1 millisecond'
                             ORDER BY f.finished_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
            RETURNING j.queue, coalesce(j.group_key, j.group_id) AS group_id),
        gone AS (
            -- A group with nothing left to run needs no lock row; a job
            -- enqueued into it later gets a new one (its first claim).
            DELETE FROM pgjobd.groups g
             WHERE g.id IN (SELECT gr.id FROM pgjobd.groups gr
                             WHERE (gr.queue, gr.group_id) IN
                                   (SELECT DISTINCT d.queue, d.group_id FROM d
                                     WHERE d.group_id IS NOT NULL)
                               AND NOT EXISTS (
                                   SELECT 1 FROM pgjobd.jobs u
                                    WHERE u.queue = gr.queue AND coalesce(u.group_key, u.group_id) = gr.group_id
                                      AND u.status IN ('queued', 'running'))
                             FOR UPDATE SKIP LOCKED)
            RETURNING 1)
        SELECT (SELECT count(*) FROM d) INTO n;
        deleted := deleted + n;
        more := more OR n >= p_limit;
    END LOOP;
END
$$;


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
