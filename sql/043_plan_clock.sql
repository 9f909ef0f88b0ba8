-- 043_plan_clock.sql - schema version 43: a rate's planned starts on the
-- server's clock.
--
--   claim_batch  returns four more columns: under a rate, each job's planned
--                start and how late it may be made (start_at_us, late_us),
--                and two readings of the server's clock, when the claim's
--                statement started and as its rows were made (stmt_us,
--                clock_us), all in microseconds since the epoch. The daemon
--                bounds how far the server's clock is from its own by the
--                readings of its recent claims, so that how late a start is
--                no longer counts the claim's own round trip (sql/README,
--                "Limits"). start_in_ms and start_by_ms stay, for the
--                daemons of version 42.
--   rate_lag     a fortieth of the period (at least 20 ms), from a
--                fiftieth (at least 10 ms): a rate of N per second plans
--                N / 1.025 starts a second; the daemon may make a start a
--                fifth of it late (from half), the rest is the command's.
--   rate_late    new: moves a rate on for a start a daemon makes later than
--                its plan allows, so that the daemon may still make it.
--
--   queue_rates  new: a rate's state (tat), from queue_limits.tat, which
--                goes. Each claim under a rate writes it, and an UPDATE of
--                the limits row checks the row's ten constraints: 0.06 ms a
--                claim, against 0.02 here.
--   try_group_head  loses its horizon: the claim reads the groups' rates
--                with its scan and plans a batch's group starts with one
--                read and one write of group_rates, not two statements a
--                job.
--   set_limits   a changed rate moves its state with it: a tat planned by
--                the old rate becomes the last start plus the new rate's
--                spacing (it stayed, and a rate raised from 1/1d to 10/1s
--                waited out the day).
--
-- Also in this version, in claim_batch: a group whose ready head comes
-- later in the grouped scan than its next jobs (a head that waited out a
-- retry, or a job given back) costs a claim one read of its head, not one
-- per job; and a job given back keeps its run_at (the daemon's outcome and
-- pgjobd.finish_leases).
--
-- The functions are defined by the function files, applied after this file
-- in the same transaction. Locks taken: queue_limits (ACCESS EXCLUSIVE, for
-- a moment: a claim holds its row for the length of a claim transaction);
-- no lock on pgjobd.jobs or pgjobd.groups.

DROP FUNCTION IF EXISTS pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                           bigint[], bigint);
DROP FUNCTION IF EXISTS pgjobd.try_group_head(text, text, bigint, int, timestamptz);

CREATE TABLE pgjobd.queue_rates (
    queue text PRIMARY KEY,
    tat   timestamptz NOT NULL
);
INSERT INTO pgjobd.queue_rates (queue, tat)
SELECT l.queue, l.tat FROM pgjobd.queue_limits l WHERE l.tat IS NOT NULL AND l.rate_n IS NOT NULL;
ALTER TABLE pgjobd.queue_limits DROP COLUMN tat;
