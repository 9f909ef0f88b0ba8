-- sql/functions/workers.sql - daemon instances and their liveness (fencing).
--
-- One row of pgjobd.workers per daemon instance; the fence session of each
-- daemon registers it and beats its heart (src/fence.c), the supervisor or an
-- operator declares it gone. Another daemon takes a running job over only
-- once the instance's alive_until has passed (sql/README, "Fencing").

-- fence_margin(fence_ms): how long after a daemon's deadline its claims
-- lapse: a fifth of fence_timeout, at least 1 s.
CREATE OR REPLACE FUNCTION pgjobd.fence_margin(p_fence_ms integer) RETURNS interval
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    SELECT greatest(1000, p_fence_ms / 5) * interval '1 millisecond'
$$;

-- forget_workers(): delete instances lapsed for a day that no running job
-- names (the maintenance session). Returns how many.
CREATE OR REPLACE FUNCTION pgjobd.forget_workers() RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    DELETE FROM pgjobd.workers w
     WHERE w.alive_until < clock_timestamp() - interval '1 day'
       AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs j
                        WHERE j.status = 'running' AND j.worker_id = w.id);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- heartbeat(id): move the instance's alive_until to now + fence_ms +
-- margin, unless it has lapsed already (then false: the daemon was declared
-- dead and registers a new instance).
CREATE OR REPLACE FUNCTION pgjobd.heartbeat(p_id bigint) RETURNS boolean
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE pgjobd.workers w
       SET alive_until = clock_timestamp() + w.fence_ms * interval '1 millisecond'
                         + pgjobd.fence_margin(w.fence_ms)
     WHERE w.id = p_id AND w.alive_until > clock_timestamp();
    RETURN FOUND;
END
$$;

-- register_worker(name, fence_ms, queues): a new instance (host:pid), alive
-- for fence_ms + margin, serving `queues` (for `pgjobd status`). Returns its id.
CREATE OR REPLACE FUNCTION pgjobd.register_worker(p_name text, p_fence_ms integer, p_queues text[]) RETURNS bigint
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    INSERT INTO pgjobd.workers (name, fence_ms, alive_until, queues)
    VALUES (p_name, p_fence_ms, clock_timestamp() + p_fence_ms * interval '1 millisecond'
                                + pgjobd.fence_margin(p_fence_ms), p_queues)
    RETURNING id
$$;

-- release_worker('host:pid[:...]'): an operator's declaration that a daemon
-- is dead (its commands killed): its instances lapse and their leases are
-- voided, so that their jobs are taken over at the next orphan pass.
CREATE OR REPLACE FUNCTION pgjobd.release_worker(p_worker text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
    v_name text := split_part(p_worker, ':', 1) || ':' || split_part(p_worker, ':', 2);
BEGIN
    UPDATE pgjobd.workers w SET alive_until = '-infinity'
     WHERE w.name = v_name AND w.alive_until > '-infinity';
    GET DIAGNOSTICS n = ROW_COUNT;
    UPDATE pgjobd.jobs j SET lease_until = '-infinity'
     WHERE j.status = 'running' AND j.lease_until > '-infinity'
       AND j.worker_id IN (SELECT w.id FROM pgjobd.workers w WHERE w.name = v_name);
    RETURN n;
END
$$;

-- worker_gone(id): the supervisor's, once every command of the instance is
-- dead (also at a clean exit): the instance and every instance of the same
-- daemon lapse, their leases are voided.
CREATE OR REPLACE FUNCTION pgjobd.worker_gone(p_id bigint) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
    UPDATE pgjobd.workers SET alive_until = '-infinity' WHERE id = p_id;
    UPDATE pgjobd.jobs j SET lease_until = '-infinity'
     WHERE j.status = 'running' AND j.lease_until > '-infinity'
       AND j.worker_id IN (SELECT w.id FROM pgjobd.workers w
                            WHERE w.name = (SELECT g.name FROM pgjobd.workers g
                                             WHERE g.id = p_id));
$$;

