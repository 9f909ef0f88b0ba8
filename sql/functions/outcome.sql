-- sql/functions/outcome.sql - the end of an attempt: its history entry and a
-- lost claim's release.
--
-- The outcome itself is the slot's fenced UPDATE in its holding transaction
-- (src/claim.c, sql_finish) or finish_leases (lease.sql); what they and
-- release_claim append to jobs.history is built here.

-- history_add(history, entry): append an attempt's entry to a job's history:
-- at most 20 entries, the oldest dropped; the previous entry's stderr cut to
-- its last 4 KiB. A non-array history counts as empty.
CREATE OR REPLACE FUNCTION pgjobd.history_add(p_history jsonb, p_entry jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    h jsonb := CASE WHEN jsonb_typeof(p_history) = 'array' THEN p_history ELSE '[]' END;
    e jsonb := h -> -1;
BEGIN
    IF p_entry IS NULL THEN
        RETURN h;
    END IF;
    IF length(e ->> 'stderr') > 4096 THEN
        h := jsonb_set(h, '{-1}', e || jsonb_build_object('stderr', right(e ->> 'stderr', 4096),
                                                          'truncated', true));
    END IF;
    h := h || jsonb_build_array(p_entry);
    WHILE jsonb_array_length(h) > 20 LOOP
        h := h - 0;
    END LOOP;
    RETURN h;
END
$$;

-- Trigger jobs_attempt_ended (BEFORE UPDATE of a running job's status or
-- fence): the entry for an attempt that ended without the daemon's own (a
-- takeover, an operator's UPDATE, a caller of the old release_claim). A
-- give-back (queued, attempts - 1) gets none.
CREATE OR REPLACE FUNCTION pgjobd.jobs_attempt_ended() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    e jsonb;
BEGIN
    IF NEW.status = 'queued' AND NEW.attempts < OLD.attempts THEN
        RETURN NEW;
    END IF;
    IF NEW.fence IS DISTINCT FROM OLD.fence THEN
        e := jsonb_build_object('reason', 'lost_lock', 'exit_code', NULL, 'signal', NULL,
                                'stderr', NULL,
                                'message', 'its outcome was never recorded (its daemon died, '
                                           || 'was cut off, or could not write it); taken over');
    ELSIF NEW.status = 'succeeded' THEN
        e := jsonb_build_object('reason', 'none', 'exit_code', 0, 'signal', NULL, 'stderr', NULL);
    ELSE
        e := jsonb_build_object('reason', coalesce(NEW.error ->> 'reason', 'lost_lock'),
                                'exit_code', NEW.error -> 'exit_code',
                                'signal', NEW.error -> 'signal',
                                'stderr', NEW.error -> 'stderr');
    END IF;
    NEW.history := pgjobd.history_add(OLD.history,
        jsonb_build_object('attempt', OLD.attempts, 'worker', OLD.worker,
                           'started_at', OLD.started_at, 'finished_at', clock_timestamp(),
                           'cpu_ms', NULL, 'max_rss_kb', NULL, 'duration_ms', NULL) || e);
    RETURN NEW;
END
$$;

-- release_claim(id, fence, started, error, max_attempts, retry_ms, entry): a
-- slot whose holding session was lost (its command dead, or never started)
-- releases the job from a new session, only while it is still `running`
-- under that fencing token (row lock with SKIP LOCKED): never started, given
-- back (attempts - 1); else a failed attempt: cancelled if requested, failed
-- at the last attempt, queued for a retry after retry_ms otherwise. Returns
-- 'released', 'locked' (the old session still holds it: try again) or 'gone'.
CREATE OR REPLACE FUNCTION pgjobd.release_claim(p_id bigint, p_fence bigint, p_started boolean, p_error jsonb, p_max_attempts integer, p_retry_ms bigint, p_entry jsonb) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    a int;
    t timestamptz := clock_timestamp();
    h jsonb;
BEGIN
    SELECT j.attempts, CASE WHEN p_started
                            THEN pgjobd.history_add(j.history,
                                     jsonb_build_object('attempt', j.attempts,
                                                        'worker', j.worker,
                                                        'started_at', j.started_at,
                                                        'finished_at', t)
                                     || coalesce(p_entry, '{}'))
                            ELSE j.history END
      INTO a, h
      FROM pgjobd.jobs j
     WHERE j.id = p_id AND j.fence = p_fence AND j.status = 'running'
     FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM pgjobd.jobs j
                    WHERE j.id = p_id AND j.fence = p_fence AND j.status = 'running') THEN
            RETURN 'locked';
        END IF;
        RETURN 'gone';
    END IF;
    IF NOT p_started THEN
        UPDATE pgjobd.jobs j SET status = 'queued', attempts = j.attempts - 1,
               worker = NULL, worker_id = NULL, started_at = NULL,
               updated_at = t
         WHERE j.id = p_id;
    ELSIF EXISTS (SELECT 1 FROM pgjobd.cancel_requests c WHERE c.job_id = p_id) THEN
        UPDATE pgjobd.jobs j SET status = 'cancelled', error = p_error, history = h,
               finished_at = t, updated_at = t
         WHERE j.id = p_id;
        DELETE FROM pgjobd.cancel_requests c WHERE c.job_id = p_id;
    ELSIF a >= p_max_attempts THEN
        UPDATE pgjobd.jobs j SET status = 'failed', error = p_error, history = h,
               finished_at = t, updated_at = t
         WHERE j.id = p_id;
    ELSE
        UPDATE pgjobd.jobs j SET status = 'queued', error = p_error, history = h,
               run_at = t + p_retry_ms * interval '1 millisecond',
               updated_at = t
         WHERE j.id = p_id;
    END IF;
    RETURN 'released';
END
$$;

