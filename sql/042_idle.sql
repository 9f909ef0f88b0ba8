-- 042_idle.sql - schema version 42: an idle daemon costs the server its polls
-- and little else.
--
-- The maintenance pass (pgjobd.maintain, sql/functions/control.sql) was sent
-- by every daemon every second, although the row lock of
-- pgjobd.maintenance_lock let only one of them work at a time. The row now
-- also names the daemon that keeps the pace (its maintenance session's
-- backend, `keeper`) and until when (`keeper_until`): that daemon passes every
-- second, the others every few seconds only (for their own queues'
-- retention, and to take the pace over once the keeper's time ran out). The
-- four-argument maintain() does this; the three-argument one, kept for the
-- daemons of earlier versions (sql/functions/previous.sql), never takes the pace.
--
-- Also in this version, in the daemon: the cancel requests are read only
-- while the daemon has jobs, and the scheduler looks at pgjobd.schedules when
-- a schedule is due, on NOTIFY pgjobd_schedule and once a minute rather than
-- every poll_interval (src/README, "Idle daemons").

ALTER TABLE pgjobd.maintenance_lock
    ADD COLUMN keeper integer,
    ADD COLUMN keeper_until timestamptz;
