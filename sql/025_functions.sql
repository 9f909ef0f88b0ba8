-- 025_functions.sql - schema version 25: the functions' current definitions
-- move to sql/functions/; claim_batch loses its two unused parameters.
--
-- From this version on, `pgjobd migrate` applies the files of sql/functions/
-- after the pending migrations, in the same transaction (src/migrate.c): each
-- function of the schema has its one current definition there, and a
-- migration holds what a function file cannot (tables, indexes, triggers,
-- data, a function's removal). A change to a function file comes with a new
-- migration, which may hold only a comment saying what changed (sql/README,
-- "Where the code is").
--
-- pgjobd.schema_functions (below) keeps the SHA-256 of each function file a
-- database has had, and `pgjobd migrate` applies a file only when its text
-- is new to the database: a version whose migration locks a table (until its
-- commit) holds it no longer for the function files it did not change.

CREATE TABLE pgjobd.schema_functions (
    file       text PRIMARY KEY,        -- functions/claim.sql
    sha256     text NOT NULL,           -- of the file's text as applied, in hex
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- What changes with this version, all in the function files:
--   claim_batch (ten arguments, sql/functions/claim.sql): 024's claim_batch
--     (twelve arguments) without p_release_jobs and p_release_groups, ignored
--     since version 9. The daemon's claim statement (sql/claim.sql, in the
--     binary) calls it when its own quick path does not do.
--   claim_batch (eleven and twelve arguments, sql/functions/previous.sql):
--     each runs the ten-argument one, for the daemons of versions 6 to 24.
--   grant_lease: EXECUTE on the ten-argument claim_batch for the worker role.
--   grant_roles: enables row-level security on pgjobd.jobs only while it is
--     off. roles.sql runs it whenever it is applied, and ALTER TABLE would wait
--     for every transaction-mode job that runs (their rows' locks).
--
-- Locks taken: the functions' catalog rows and the new table; no other table
-- (tests/integration/t_02_functions.sh upgrades from 24 while a job runs). A
-- daemon of version 24 keeps claiming meanwhile: its statement's quick path reads and
-- writes tables only, its full path calls claim_batch with twelve arguments.
