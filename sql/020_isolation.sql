-- 020_isolation.sql - schema version 20: roles that share a database cannot
-- reach each other through pgjobd.
--
-- Every function of schema pgjobd pins its search_path. Most did not: they
-- ran with the caller's, so a function or operator that another role had
-- created in a schema on that path (public, which a database owner may
-- write to) could be picked for one that a body names without a schema
-- (an `integer * interval` has no exact match in pg_catalog, and one in
-- public would win over the implicit cast), and run with the rights of the
-- daemon or of an operator's superuser session. The daemon and the command
-- line pin the same path in each of their sessions (src/db.h); this pins it
-- for every other caller as well. Bodies name pgjobd's objects with their
-- schema, so pg_catalog and pg_temp are all they need (pg_temp is never
-- searched for functions or operators). A function a later migration
-- creates must say SET search_path = pg_catalog, pg_temp itself.


-- Bounded keys. group_id and dedupe_key had no size: a 200 KB group_id
-- reached the command's environment and failed its spawn (E2BIG), and
-- either key is held in indexes. 1 KiB, in bytes, refused at INSERT (and
-- UPDATE) with SQLSTATE 23514 naming the constraint. NOT VALID, then
-- VALIDATE: the check of the rows already there takes no lock that stops
-- producers or daemons; a database that holds a longer key keeps it (and
-- the constraint stays NOT VALID, with a warning) rather than failing the
-- upgrade: new rows are checked either way.
ALTER TABLE pgjobd.jobs
      ADD CONSTRAINT jobs_group_id_max_1kib CHECK (octet_length(group_id) <= 1024) NOT VALID,
      ADD CONSTRAINT jobs_dedupe_key_max_1kib CHECK (octet_length(dedupe_key) <= 1024) NOT VALID;
ALTER TABLE pgjobd.schedules
      ADD CONSTRAINT schedules_group_id_max_1kib CHECK (octet_length(group_id) <= 1024) NOT VALID;
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT * FROM (VALUES ('pgjobd.jobs', 'jobs_group_id_max_1kib'),
                                   ('pgjobd.jobs', 'jobs_dedupe_key_max_1kib'),
                                   ('pgjobd.schedules', 'schedules_group_id_max_1kib')) v(t, n)
    LOOP
        BEGIN
            EXECUTE pg_catalog.format('ALTER TABLE %s VALIDATE CONSTRAINT %I', c.t, c.n);
        EXCEPTION WHEN check_violation THEN
            RAISE WARNING '% holds a key over 1 KiB: constraint % left NOT VALID (new rows are checked)',
                c.t, c.n;
        END;
    END LOOP;
END
$$;

-- Last: every function of the schema, including any created above.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure
          FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'pgjobd'::pg_catalog.regnamespace
           AND p.prokind IN ('f', 'p')
           AND NOT EXISTS (SELECT FROM pg_catalog.unnest(p.proconfig) c
                            WHERE c LIKE 'search_path=%')
    LOOP
        EXECUTE pg_catalog.format('ALTER ROUTINE %s SET search_path = pg_catalog, pg_temp', f);
    END LOOP;
END
$$;
