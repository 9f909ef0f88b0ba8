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
--   rate_lag     a hundredth of the period (at least 10 ms), from a
--                fiftieth: a rate of N per second plans N / 1.01 starts a
--                second.
--
-- Also in this version, in claim_batch: a group whose ready head comes
-- later in the grouped scan than its next jobs (a head that waited out a
-- retry, or a job given back) costs a claim one read of its head, not one
-- per job; and a job given back keeps its run_at (the daemon's outcome and
-- pgjobd.finish_leases).
--
-- The functions are defined by the function files, applied after this file
-- in the same transaction. No lock on pgjobd.jobs or pgjobd.groups.

DROP FUNCTION IF EXISTS pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                           bigint[], bigint);
