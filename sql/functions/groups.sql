-- sql/functions/groups.sql - a group's order and its held marks: the
-- triggers that keep them (sql/README, "Commit order" and "Held groups"),
-- and the groups that may start nothing (group_blocks: held after a job
-- failed for good, paused by an operator; sql/README, "Blocked groups").
-- What a claim does with them is in claim.sql (try_group_head, hold_group).

-- Trigger jobs_commit_order (deferred to COMMIT, grouped rows; also when a
-- job is put back to `queued` or moved): place the job after every
-- unfinished job of its group visible now. A job whose id already puts it
-- there keeps it (one index probe, no write); any other gets commit_seq =
-- nextval of the id sequence. A transaction's own jobs keep their id order.
-- Under REPEATABLE READ or SERIALIZABLE every grouped job is renumbered.
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
    -- A job that enters a blocked group (held or paused: group_blocks) is
    -- marked as the group's other queued jobs are, so that claims leave it
    -- out of their scans. The probe costs every grouped INSERT a few
    -- microseconds (an index probe of an empty or tiny table).
    IF EXISTS (SELECT 1 FROM pgjobd.group_blocks b
                WHERE b.queue = NEW.queue AND b.group_id = coalesce(NEW.group_key, NEW.group_id)) THEN
        PERFORM pgjobd.group_mark_job(NEW.id);
    END IF;
    -- The failed job that held its group, queued again (pgjobd.retry): it
    -- keeps its place at the head of its group, whose later jobs waited
    -- for it (jobs_failed_undone names it).
    IF TG_OP = 'UPDATE' THEN
        IF position(',' || NEW.id || ',' IN coalesce(current_setting('pgjobd.resumed', true), '')) > 0 THEN
            RETURN NULL;
        END IF;
    END IF;
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

-- Trigger jobs_backed_off (a running grouped job goes back to `queued` to
-- wait out a backoff: its attempt failed with attempts left): mark the group
-- held at once (hold_group, sql/functions/claim.sql), in the outcome's own
-- transaction. The claims would otherwise mark it when their scan first met
-- the group's later jobs, on the claim path: with many groups backing off at
-- once, a claim spent its time marking (up to a thousand groups a call, and a
-- walk over every group's head when its scan met only held ones) while the
-- other groups' jobs waited (tests/bench/README, 7b). A short backoff (under a
-- second) is left to the claims: its marks would be cleared again at once.
-- In a blocked group (held or paused) the job gets the group's mark instead,
-- 'infinity', whatever its run_at: it must not start when its backoff ends.
CREATE OR REPLACE FUNCTION pgjobd.jobs_backed_off() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF pgjobd.group_blocked(NEW.queue, coalesce(NEW.group_key, NEW.group_id)) THEN
        PERFORM pgjobd.group_mark_job(NEW.id);
        RETURN NULL;
    END IF;
    IF NEW.run_at > clock_timestamp() + interval '1 second'
       AND (NEW.expires_at IS NULL OR NEW.expires_at > NEW.run_at) THEN
        PERFORM pgjobd.hold_group(NEW.queue, coalesce(NEW.group_key, NEW.group_id), NEW.id,
                                  NEW.run_at, 1000);
    END IF;
    RETURN NULL;
END
$$;

-- Trigger jobs_head_changed (a queued job leaves `queued`, its queue or
-- group, its run_at changes, or it is deleted): clear the marks of the
-- group's later jobs, in the same transaction; the marks of a blocked group
-- ('infinity') stay: they go with the group's last block (group_unmark).
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
           AND j.held_until IS NOT NULL AND j.held_until <> 'infinity';
    ELSE
        UPDATE pgjobd.jobs j
           SET held_until = CASE WHEN j.held_until = 'infinity' THEN j.held_until END
         WHERE j.queue = OLD.queue AND coalesce(j.group_key, j.group_id) = coalesce(OLD.group_key, OLD.group_id)
           AND coalesce(j.commit_seq, j.id) > coalesce(OLD.commit_seq, OLD.id)
           AND j.status = 'queued';
    END IF;
    RETURN NULL;
END
$$;

-- Trigger jobs_unheld (a marked job leaves `queued`, its queue or group, or
-- its run_at changes): its own mark goes; a blocked group's mark
-- ('infinity') stays while the job stays queued in its queue and group.
CREATE OR REPLACE FUNCTION pgjobd.jobs_unheld() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF OLD.held_until = 'infinity' AND NEW.status = 'queued' AND NEW.queue = OLD.queue
       AND NEW.group_id IS NOT DISTINCT FROM OLD.group_id THEN
        RETURN NEW;
    END IF;
    NEW.held_until := NULL;
    RETURN NEW;
END
$$;


-- ---------------------------------------------------------------- blocked groups
-- A group is blocked while it has a row in pgjobd.group_blocks: `held` (a
-- job of a queue with group_on_failure = hold ended `failed`: the trigger
-- jobs_failed_hold) or `paused` (pause_group). Every queued job of a blocked
-- group carries the mark held_until = 'infinity': claims leave marked jobs
-- out of their scans, and try_group_head starts no marked head, so a
-- blocked group costs a claim nothing and starts nothing; its running job
-- finishes (sql/README, "Blocked groups").

-- group_blocked(queue, group): has the group (its identity,
-- coalesce(group_key, group_id)) a block?
CREATE OR REPLACE FUNCTION pgjobd.group_blocked(q text, g text) RETURNS boolean
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT 1 FROM pgjobd.group_blocks b WHERE b.queue = q AND b.group_id = g)
$$;

REVOKE ALL ON FUNCTION pgjobd.group_blocked(text, text) FROM PUBLIC;

-- group_mark(queue, group): mark every queued job of the group 'infinity'.
-- Returns the number of jobs marked.
CREATE OR REPLACE FUNCTION pgjobd.group_mark(q text, g text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n int;
BEGIN
    UPDATE pgjobd.jobs j SET held_until = 'infinity'
     WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status = 'queued'
       AND j.held_until IS DISTINCT FROM 'infinity';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.group_mark(text, text) FROM PUBLIC;

-- group_mark_job(id): mark one queued job of a blocked group 'infinity'
-- (a job that enters the group: jobs_commit_order, jobs_backed_off).
CREATE OR REPLACE FUNCTION pgjobd.group_mark_job(p_id bigint) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    UPDATE pgjobd.jobs j SET held_until = 'infinity'
     WHERE j.id = p_id AND j.status = 'queued' AND j.held_until IS DISTINCT FROM 'infinity'
$$;

REVOKE ALL ON FUNCTION pgjobd.group_mark_job(bigint) FROM PUBLIC;

-- group_unmark(queue, group): the group's last block went: its marks go
-- and the queue's daemons are woken. Nothing while a block remains.
-- Returns the number of jobs unmarked.
CREATE OR REPLACE FUNCTION pgjobd.group_unmark(q text, g text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n int;
BEGIN
    IF pgjobd.group_blocked(q, g) THEN
        RETURN 0;
    END IF;
    UPDATE pgjobd.jobs j SET held_until = NULL
     WHERE j.queue = q AND coalesce(j.group_key, j.group_id) = g AND j.status = 'queued'
       AND j.held_until = 'infinity';
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM pg_notify('pgjobd', pgjobd.wake_payload(q));
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.group_unmark(text, text) FROM PUBLIC;

-- Trigger jobs_failed_hold (a grouped job ends `failed` from `running` with
-- "group_on_failure": "hold" in its error, which the daemon writes for a
-- queue with that policy): the group is held by that job.
CREATE OR REPLACE FUNCTION pgjobd.jobs_failed_hold() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    g text := coalesce(NEW.group_key, NEW.group_id);
BEGIN
    INSERT INTO pgjobd.group_blocks AS b (queue, group_id, reason, job)
    VALUES (NEW.queue, g, 'held', NEW.id)
    ON CONFLICT (queue, group_id, reason)
    DO UPDATE SET job = EXCLUDED.job, since = EXCLUDED.since, blocked_by = EXCLUDED.blocked_by;
    PERFORM pgjobd.group_mark(NEW.queue, g);
    RETURN NULL;
END
$$;

-- Trigger jobs_failed_undone (a failed grouped job leaves `failed`:
-- pgjobd.retry, an operator's UPDATE): the hold it made goes, and with the
-- group's last block its marks. The job itself, queued again, heads its
-- group: it keeps its place (jobs_commit_order), where a finished job put
-- back to `queued` otherwise goes after the group's unfinished jobs.
CREATE OR REPLACE FUNCTION pgjobd.jobs_failed_undone() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    g text := coalesce(OLD.group_key, OLD.group_id);
BEGIN
    DELETE FROM pgjobd.group_blocks b
     WHERE b.queue = OLD.queue AND b.group_id = g AND b.reason = 'held' AND b.job = OLD.id;
    IF FOUND THEN
        PERFORM pgjobd.group_unmark(OLD.queue, g);
        -- Nothing of the group ran since it failed: if it is queued again,
        -- it runs first (jobs_commit_order leaves its place alone).
        PERFORM set_config('pgjobd.resumed',
                           coalesce(nullif(current_setting('pgjobd.resumed', true), ''), ',')
                           || OLD.id || ',', true);
    END IF;
    RETURN NULL;
END
$$;

-- group_name(group): the group id as its producer wrote it (a producer's
-- group identity is E'\x01' role E'\x01' group_id: group_key()).
CREATE OR REPLACE FUNCTION pgjobd.group_name(p_group text) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN left(p_group, 1) = E'\x01'
                THEN substr(p_group, length(split_part(substr(p_group, 2), E'\x01', 1)) + 3)
                ELSE p_group END
$$;

-- group_producer(group): the role whose group it is (NULL: a group of the
-- owner, the worker role or a shared queue).
CREATE OR REPLACE FUNCTION pgjobd.group_producer(p_group text) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT CASE WHEN left(p_group, 1) = E'\x01'
                THEN split_part(substr(p_group, 2), E'\x01', 1) END
$$;

-- sees_group(group): may the current role see this group in
-- pgjobd.blocked_groups? A producer (a member of pgjobd_producer that is not
-- the owner, a superuser, a role that bypasses row-level security or a
-- member of pgjobd_worker: the roles whose groups group_key() scopes) sees
-- its own groups only; every other role that may read the view sees all.
CREATE OR REPLACE FUNCTION pgjobd.sees_group(p_group text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    r record;
BEGIN
    SELECT a.rolsuper OR a.rolbypassrls
               OR a.oid = (SELECT c.relowner FROM pg_class c WHERE c.oid = 'pgjobd.jobs'::regclass)
               OR to_regrole('pgjobd_producer') IS NULL
               OR (to_regrole('pgjobd_worker') IS NOT NULL
                   AND pg_has_role(a.oid, 'pgjobd_worker', 'MEMBER'))
               OR NOT pg_has_role(a.oid, 'pgjobd_producer', 'MEMBER') AS all_groups
      INTO r FROM pg_roles a WHERE a.rolname = current_user;
    IF coalesce(r.all_groups, false) THEN
        RETURN true;
    END IF;
    RETURN left(p_group, length(current_user) + 2) = E'\x01' || current_user || E'\x01';
END
$$;

REVOKE ALL ON FUNCTION pgjobd.sees_group(text) FROM PUBLIC;

-- pause_group(queue, group_id): the group starts nothing until
-- resume_group (its running job, if any, finishes; group order is kept).
-- The group named group_id: each producer's group of that name with
-- unfinished jobs (in a queue that is not shared, each producer has its
-- own), or, when there is none, the group group_id itself. True when a group
-- was paused that was not.
CREATE OR REPLACE FUNCTION pgjobd.pause_group(p_queue text, p_group text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    g text;
    gs text[];
    paused boolean := false;
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'pause_group: group_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT array_agg(DISTINCT coalesce(j.group_key, j.group_id)) INTO gs FROM pgjobd.jobs j
     WHERE j.queue = p_queue AND j.group_id = p_group AND j.group_key IS NOT NULL
       AND j.status IN ('queued', 'running');
    FOREACH g IN ARRAY coalesce(gs, ARRAY[p_group]) LOOP
        INSERT INTO pgjobd.group_blocks (queue, group_id, reason) VALUES (p_queue, g, 'paused')
            ON CONFLICT DO NOTHING;
        paused := paused OR FOUND;
        PERFORM pgjobd.group_mark(p_queue, g);
    END LOOP;
    RETURN paused;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.pause_group(text, text) FROM PUBLIC;

-- unblock_group(queue, group_id, reason): remove the block of that reason
-- (paused, held) from every group of that name and unmark those groups
-- (a group blocked for the other reason stays blocked). True when one was.
CREATE OR REPLACE FUNCTION pgjobd.unblock_group(p_queue text, p_group text, p_reason text) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    g text;
    found_one boolean := false;
BEGIN
    PERFORM pgjobd.check_queue_name(p_queue);
    FOR g IN DELETE FROM pgjobd.group_blocks b
              WHERE b.queue = p_queue AND b.reason = p_reason
                AND pgjobd.group_name(b.group_id) = p_group
             RETURNING b.group_id
    LOOP
        found_one := true;
        PERFORM pgjobd.group_unmark(p_queue, g);
    END LOOP;
    RETURN found_one;
END
$$;

REVOKE ALL ON FUNCTION pgjobd.unblock_group(text, text, text) FROM PUBLIC;

-- resume_group(queue, group_id): undo pause_group (every group of that
-- name); a group that is also held stays held. True when one was paused.
CREATE OR REPLACE FUNCTION pgjobd.resume_group(p_queue text, p_group text) RETURNS boolean
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT pgjobd.unblock_group(p_queue, p_group, 'paused') $$;

REVOKE ALL ON FUNCTION pgjobd.resume_group(text, text) FROM PUBLIC;

-- release_group(queue, group_id): a group held by a failed job runs its
-- later jobs again (every group of that name); the failed job stays failed.
-- A group that is also paused stays paused. True when one was held.
CREATE OR REPLACE FUNCTION pgjobd.release_group(p_queue text, p_group text) RETURNS boolean
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ SELECT pgjobd.unblock_group(p_queue, p_group, 'held') $$;

REVOKE ALL ON FUNCTION pgjobd.release_group(text, text) FROM PUBLIC;
