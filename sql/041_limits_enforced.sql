-- 041_limits_enforced.sql - schema version 41: the claim obeys the limits
-- of pgjobd.queue_limits (version 40 recorded them).
--
--   queue_limits.tat  the rate's state (GCRA): the earliest instant the
--                     queue's next start is allowed. NULL or past: now.
--   group_rates       the same per group, for group_rate: one row per group
--                     that started under a group rate; a row whose tat has
--                     passed means what no row means, so maintain() may
--                     delete it. Kept out of pgjobd.groups: adding a column
--                     to that table would wait for every grouped job that a
--                     transaction-mode slot holds.
--   claim_batch       returns two more columns, start_in_ms and start_by_ms
--                     (a rate's planned start and the latest start the
--                     daemon may still make, in ms from when it sent the
--                     claim), and a row without a job when a rate holds the
--                     queue back: when to claim again. Its overloads for
--                     earlier daemons (sql/functions/previous.sql) return
--                     the columns they know.
--   try_group_head    takes the group's concurrency (1: the strict order of
--                     every earlier version) and locks the group row FOR NO
--                     KEY UPDATE; a transaction-mode slot holds its group
--                     row FOR KEY SHARE, so that claims may still start the
--                     group's next job under a group concurrency above 1.
--
-- The functions are defined by the function files, applied after this file
-- in the same transaction; the old signatures go here (a fresh database
-- has none of them yet).
--
-- Locks taken: queue_limits (new since version 40, read by no earlier
-- daemon); the new table. No lock on pgjobd.jobs or pgjobd.groups: the
-- upgrade does not wait for running jobs.

ALTER TABLE pgjobd.queue_limits ADD COLUMN tat timestamptz;

CREATE TABLE pgjobd.group_rates (
    queue    text NOT NULL,
    group_id text NOT NULL,
    tat      timestamptz NOT NULL,
    PRIMARY KEY (queue, group_id)
);

DROP FUNCTION IF EXISTS pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean,
                                           bigint[], bigint);
DROP FUNCTION IF EXISTS pgjobd.try_group_head(text, text, bigint);
