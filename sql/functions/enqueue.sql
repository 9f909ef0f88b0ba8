-- sql/functions/enqueue.sql - what runs when a producer inserts a job: the
-- grant check, dedupe, group scoping, the run_at bound, quotas and the
-- wake-up (sql/README, "The tables": the triggers in the order they matter).

-- check_queue_grant(queue): may the current role enqueue into `queue`? True
-- for roles row-level security does not restrict and for the worker role;
-- else a grant (queue_grants) or an error that says which is missing. Used by
-- the policy producer_insert and the trigger jobs_check_grant.
CREATE OR REPLACE FUNCTION pgjobd.check_queue_grant(p_queue text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- check_queue_name(queue): refuse a queue name other than 1 to 63 of A-Z a-z
-- 0-9 _ . - (the functions that take a queue name check it with this).
CREATE OR REPLACE FUNCTION pgjobd.check_queue_name(p_queue text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    IF p_queue IS NULL OR p_queue !~ '^[A-Za-z0-9_.-]{1,63}$' THEN
        RAISE EXCEPTION 'bad queue name %: use 1 to 63 characters of A-Z a-z 0-9 _ . -',
            coalesce(quote_literal(p_queue), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$_$;

-- Trigger dedupe_lock_done (deferred to COMMIT): the inserting transaction's
-- dedupe_locks row of the key goes.
CREATE OR REPLACE FUNCTION pgjobd.dedupe_lock_done() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM pgjobd.dedupe_locks d
     WHERE d.queue = NEW.queue AND d.dedupe_key = NEW.dedupe_key AND d.scope = NEW.scope;
    RETURN NULL;
END
$$;

-- dedupe_scope(queue, role): the scope of a dedupe key: '' in a shared
-- queue (queue_policies), else the inserting role.
CREATE OR REPLACE FUNCTION pgjobd.dedupe_scope(p_queue text, p_role text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN EXISTS (SELECT 1 FROM pgjobd.queue_policies p
                              WHERE p.queue = p_queue AND p.shared)
                THEN '' ELSE coalesce(p_role, '') END
$$;

-- group_key(queue, role, group_id): the group identity of a producer's job:
-- E'\x01' role E'\x01' group_id in a queue that is not shared, NULL (the
-- group is group_id) for the owner, superusers, the worker role and shared
-- queues. Every place that asks which group a job is in reads
-- coalesce(group_key, group_id).
CREATE OR REPLACE FUNCTION pgjobd.group_key(p_queue text, p_role text, p_group_id text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- Trigger jobs_check_grant (BEFORE INSERT, rows with a dedupe key): the grant
-- check before jobs_dedupe looks at other roles' keys.
CREATE OR REPLACE FUNCTION pgjobd.jobs_check_grant() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM pgjobd.check_queue_grant(NEW.queue);
    RETURN NEW;
END
$$;

-- Trigger jobs_dedupe (BEFORE INSERT, rows with a dedupe key): lock the key
-- in its scope (lock_dedupe_key: a second inserter of it waits for the
-- first's transaction), then insert nothing if a queued or running job has
-- it (sql/README, "Dedupe").
CREATE OR REPLACE FUNCTION pgjobd.jobs_dedupe() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- Trigger jobs_group_key (BEFORE INSERT or UPDATE of queue, group_id,
-- created_by): sets group_key (group_key()).
CREATE OR REPLACE FUNCTION pgjobd.jobs_group_key() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    NEW.group_key := pgjobd.group_key(NEW.queue, NEW.created_by, NEW.group_id);
    RETURN NEW;
END
$$;

-- Trigger jobs_inserted (AFTER INSERT, per statement): NOTIFY pgjobd once per
-- queue of the statement, only for queues a claimer waits on
-- (pgjobd.waiting), its payload wake_payload(queue) (sql/README, "Wake-ups").
CREATE OR REPLACE FUNCTION pgjobd.jobs_inserted() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- Trigger jobs_quota (AFTER INSERT, per statement, when any quota exists):
-- refuse the statement when it leaves a role more queued jobs in a queue than
-- its quota (the queue's row, else '*'), counted under the quota row's lock.
CREATE OR REPLACE FUNCTION pgjobd.jobs_quota() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- Trigger jobs_run_at_bound (BEFORE INSERT of a run_at more than a year
-- ahead): refused to producers.
CREATE OR REPLACE FUNCTION pgjobd.jobs_run_at_bound() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- lock_dedupe_key(queue, key): the unscoped form, called by retry() of
-- schema versions 16 to 19 only.
CREATE OR REPLACE FUNCTION pgjobd.lock_dedupe_key(p_queue text, p_key text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    LOOP
        INSERT INTO pgjobd.dedupe_locks (queue, dedupe_key)
        VALUES (p_queue, p_key)
        ON CONFLICT DO NOTHING;
        EXIT WHEN FOUND;
        PERFORM 1 FROM pgjobd.dedupe_locks d
         WHERE d.queue = p_queue AND d.dedupe_key = p_key
         FOR UPDATE;
        EXIT WHEN FOUND;
    END LOOP;
END
$$;

-- lock_dedupe_key(queue, key, scope): take the key's row of dedupe_locks
-- (insert it, or wait for its holder and lock it), held to the end of the
-- transaction.
CREATE OR REPLACE FUNCTION pgjobd.lock_dedupe_key(p_queue text, p_key text, p_scope text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

-- wake_payload(queue): the payload of a wake-up for `queue`,
-- sha256(secret || queue) in hex: only holders of the secret can map it to a
-- queue.
CREATE OR REPLACE FUNCTION pgjobd.wake_payload(p_queue text) RETURNS text
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT encode(sha256(convert_to(s.secret || p_queue, 'UTF8')), 'hex')
      FROM pgjobd.wake_secret s
$$;

