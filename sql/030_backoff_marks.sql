-- 030_backoff_marks.sql - schema version 30: a group whose head backs off is
-- marked held by the outcome that backs it off (trigger jobs_backed_off,
-- sql/functions/groups.sql), not only later by the claims that meet it.
--
-- Also in this version, in the function files: claim_batch's orphan pass
-- reads only the running jobs it may take (ours not in the skip list, and
-- other daemons' whose claim has lapsed) instead of every running job of the
-- queue, and finds the waiting rows of ended sessions by pid
-- (pg_stat_get_activity) rather than through pg_stat_activity.
--
-- Marks only keep a group's later jobs out of the claim's scan (sql/README,
-- "Held groups"); which job may start is still decided under the group row's
-- lock, so what changes is where the marking costs: on the failed attempt's
-- outcome rather than on the claims of every daemon.

-- The trigger's function is defined by sql/functions/groups.sql, which
-- `pgjobd migrate` applies after this file in the same transaction; the
-- trigger needs a function to exist first, so this one stands in until then.
CREATE FUNCTION pgjobd.jobs_backed_off() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$ BEGIN RETURN NULL; END $$;

CREATE TRIGGER jobs_backed_off AFTER UPDATE OF status ON pgjobd.jobs
    FOR EACH ROW WHEN (OLD.status = 'running' AND NEW.status = 'queued'
                       AND NEW.group_id IS NOT NULL)
    EXECUTE FUNCTION pgjobd.jobs_backed_off();
