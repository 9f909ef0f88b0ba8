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
