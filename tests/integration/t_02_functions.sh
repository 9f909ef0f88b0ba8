#!/usr/bin/env bash
# The function files (sql/functions/, applied by `pgjobd migrate` after the pending
# migrations; sql/README, "Where the code is") on an upgrade from schema version 24 to
# the newest, while a job of lock mode `transaction` holds its row. A version that
# changes functions only takes no lock that running jobs hold, but version 33 adds a
# column to pgjobd.jobs: the migrate waits for the held job and goes through once it
# ends; claim_batch has its ten-argument form for the worker role (and not for
# PUBLIC), the overloads earlier daemons call still claim, and pgjobd.schema_functions
# records each file applied; the next version's migrate applies none of them again. The database at version
# 24 is made from sql/001..024 the way `pgjobd migrate` applies them.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # setup_roles creates the roles (cluster-wide)
empty_database
pg_start

plan 8

{
	echo "SET client_min_messages = warning;"
	echo "CREATE SCHEMA pgjobd;"
	echo "CREATE TABLE pgjobd.schema_version (version integer PRIMARY KEY, name text NOT NULL,"
	echo "    applied_at timestamptz NOT NULL DEFAULT now());"
	for f in "$REPO_ROOT"/sql/[0-9][0-9][0-9]_*.sql; do
		n=$(basename "$f" .sql)
		v=$((10#${n%%_*}))
		[ "$v" -le 24 ] || continue
		cat "$f"
		echo "INSERT INTO pgjobd.schema_version (version, name) VALUES ($v, '$n');"
	done
	echo "SELECT pgjobd.setup_roles();"
} | psql -X -q -1 -v ON_ERROR_STOP=1 >"$T/v24.log" 2>&1
ok $? "sql/001..024 applied in one transaction, and the roles set up" || diag "$(tail -n 5 "$T/v24.log")"

W=$(psql_q "SELECT pgjobd.register_worker('t:1', 600000, '{q}')")
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'q' FROM generate_series(1, 4)" >/dev/null
# A slot's hold: a claimed job's row locked in an open transaction, for 20 s at most.
psql -X -qAt -v ON_ERROR_STOP=1 >"$T/hold.out" 2>&1 <<SQL &
SELECT job_id FROM pgjobd.claim_batch('q', $W, '{t:1:q.0}', 5, 0, 1048576, 1000, false,
                                      '{}', '{}', '{}', NULL::bigint);
BEGIN;
SELECT id FROM pgjobd.jobs WHERE status = 'running' FOR UPDATE;
SELECT 'held';
SELECT pg_sleep(20);
COMMIT;
SQL
echo $! >"$T/hold.pid"
wait_until 10 "grep -q held '$T/hold.out'" || bail_out "the job was not held: $(cat "$T/hold.out")"

printf '[pgjobd]\ndatabase = %s\n' "$DB_CONNINFO" >"$T/m.ini"
# Version 33 adds a column to pgjobd.jobs (sql/033_progress.sql), which needs the
# table's ACCESS EXCLUSIVE lock: the migrate waits for the held job, saying after 5 s
# which session holds the table (t_29_migrate_locks.sh), and goes through once it ends.
timeout 60 "$PGJOBD" migrate -c "$T/m.ini" >"$T/migrate.out" 2>&1 &
mig=$!
wait_until 20 "grep -q 'held by pid' '$T/migrate.out'"
ok $? "... while the job is held it waits, naming the session that holds the table" ||
	diag "$(cat "$T/migrate.out")"
kill "$(cat "$T/hold.pid")" 2>/dev/null
wait "$mig"
rc=$?
last=$(basename "$(ls "$REPO_ROOT"/sql/[0-9][0-9][0-9]_*.sql | tail -n 1)" .sql)
is "$rc:$(tail -n 1 "$T/migrate.out")" "0:schema pgjobd is at version $((10#${last%%_*}))" \
	"pgjobd migrate from 24 to the newest exits 0 once the held job ends" ||
	diag "$(cat "$T/migrate.out")"
is "$(psql_q "SELECT to_regprocedure('pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[], bigint)')
                     IS NOT NULL
                || ' worker ' || has_function_privilege('pgjobd_worker',
                     'pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[], bigint)', 'EXECUTE')
                || ' public ' || has_function_privilege('public',
                     'pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[], bigint)', 'EXECUTE')")" \
	"true worker true public false" "claim_batch with ten arguments, for the worker role only"
# The claims of each generation of daemons, as the worker role: the ten-argument one
# (this version), the twelve-argument one (versions 17 to 24), the eleven-argument one
# (6 to 16).
got=$(psql -X -qAt -v ON_ERROR_STOP=1 2>&1 <<SQL
SET ROLE pgjobd_worker;
SELECT count(*) FROM pgjobd.claim_batch('q', $W, '{t:1:q.1}', 5, 0, 1048576, 1000, false, '{}', NULL::bigint);
SELECT count(*) FROM pgjobd.claim_batch('q', $W, '{t:1:q.2}', 5, 0, 1048576, 1000, false, '{}', '{}', '{}', NULL::bigint);
SELECT count(*) FROM pgjobd.claim_batch('q', $W, '{t:1:q.3}', 5, 0, 1048576, 1000, false, '{}', '{}', '{}');
SQL
)
is "$(echo $got)" "1 1 1" "each form claims a job: ten, twelve, eleven arguments"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE status = 'running'")" 4 "four jobs running"
is "$(psql_q "SELECT count(*) FROM pgjobd.schema_functions WHERE sha256 ~ '^[0-9a-f]{64}\$'")" \
	"$(ls "$REPO_ROOT"/sql/functions/*.sql | wc -l)" "each function file applied is recorded with its SHA-256"
kill "$(cat "$T/hold.pid")" 2>/dev/null
wait "$(cat "$T/hold.pid")" 2>/dev/null

# The next version (tests/integration/next/: one migration more, the same function
# files): its migrate applies none of them again.
NEXT=${PGJOBD_NEXT:-$(dirname "$PGJOBD")/tests/pgjobd-next}
before=$(psql_q "SELECT string_agg(file || ' ' || applied_at, ', ' ORDER BY file) FROM pgjobd.schema_functions")
xmin=$(psql_q "SELECT xmin FROM pg_proc WHERE oid = 'pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[], bigint)'::regprocedure")
timeout 30 "$NEXT" migrate -c "$T/m.ini" >"$T/next.out" 2>&1
is "$?:$(psql_q "SELECT string_agg(file || ' ' || applied_at, ', ' ORDER BY file) FROM pgjobd.schema_functions"):$(psql_q "SELECT xmin FROM pg_proc WHERE oid = 'pgjobd.claim_batch(text, bigint, text[], int, bigint, bigint, int, boolean, bigint[], bigint)'::regprocedure")" \
	"0:$before:$xmin" "the next version's migrate applies no function file it did not change" ||
	diag "$(cat "$T/next.out")"
