-- sql/functions/groups.sql - a group's order and its held marks: the
-- triggers that keep them (sql/README, "Commit order" and "Held groups").
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
CREATE OR REPLACE FUNCTION pgjobd.jobs_backed_off() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
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
-- group's later jobs, in the same transaction.
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

-- Trigger jobs_unheld (a marked job leaves `queued`, its queue or group, or
-- its run_at changes): its own mark goes.
CREATE OR REPLACE FUNCTION pgjobd.jobs_unheld() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    NEW.held_until := NULL;
    RETURN NEW;
END
$$;

