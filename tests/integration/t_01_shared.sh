#!/usr/bin/env bash
# The harness's shared server (tests/integration/run.sh, lib.sh's own_cluster): a file
# gets a database of its own, made from the migrated template, reached through $T/sock
# as on a server of its own; empty_database gives one without the schema; a file that
# creates roles (or restarts the server, or looks at every session) gets a server of its
# own, one that says shared_cluster does not; test_role names a role no other file has;
# a file's database and roles are gone once it has ended; the shared server cannot be
# restarted. Skipped when the file runs alone (no shared server).
. "$(dirname "$0")/lib.sh"
require_pgjobd

if [ -z "${PGJOBD_TEST_CLUSTER:-}" ]; then
	skip_all "no shared server (run it with tests/integration/run.sh)"
fi

shared_cluster
pg_start
is "$(psql_q 'SELECT current_database()')" "pgjobd_t_01_shared_$$" "a database of its own: pgjobd_<file>_<pid>"
is "$(psql -X -qAt -d "$DB_CONNINFO" -c 'SELECT current_database()')" "$PGDATABASE" \
	"DB_CONNINFO names it"
[ -L "$T/sock" ] && [ "$(readlink -f "$T/sock")" = "$(readlink -f "$PGJOBD_TEST_CLUSTER/sock")" ]
ok $? "\$T/sock leads to the shared server's socket directory"
latest=$(cd "$REPO_ROOT/sql" && ls [0-9][0-9][0-9]_*.sql | tail -n 1)
is "$(psql_q "SELECT max(version) FROM pgjobd.schema_version")" "$((10#${latest%%_*}))" \
	"the database has schema pgjobd at the newest version (the template was migrated)"
printf '[pgjobd]\ndatabase = %s\n' "$DB_CONNINFO" >"$T/m.ini"
like "$(pgjobd_migrate "$T/m.ini" 2>&1)" "up to date" "pgjobd migrate finds nothing to do"
is "$(psql_q "SELECT datallowconn FROM pg_database WHERE datname = '$PG_TEMPLATE'")" f \
	"nobody may connect to the template (CREATE DATABASE needs it unused)"

# inner NAME <<EOF: a test file $T/NAME.sh of the given body (after sourcing lib.sh),
# run as a file of its own; its TAP output in $T/NAME.out.
inner() {
	{
		echo ". '$LIB_DIR/lib.sh'"
		cat
	} >"$T/$1.sh"
	PGJOBD_KEEP_TMP=0 bash "$T/$1.sh" >"$T/$1.out" 2>&1
}

# A file on the shared server: its database and role exist while it runs, not after.
inner plain <<'EOF'
shared_cluster # its role is test_role's
pg_start
r=$(test_role app)
psql_q "CREATE ROLE $r LOGIN" >/dev/null
echo "db $PGDATABASE role $r dir $(psql_q 'SHOW data_directory')"
pass "ran"
done_testing
EOF
is "$?" 0 "a plain file passes on the shared server"
read -r _ db _ role _ dir < <(grep '^db ' "$T/plain.out")
like "$db" "^pgjobd_plain_[0-9]+\$" "... in a database of its own ($db)"
like "$role" "^app_plain_[0-9]+\$" "... test_role gives a name of its own ($role)"
is "$dir" "$(psql_q 'SHOW data_directory')" "... on the shared server"
is "$(psql_q "SELECT count(*) FROM pg_database WHERE datname = '$db'")" 0 "its database is dropped at its end"
is "$(psql_q "SELECT count(*) FROM pg_roles WHERE rolname = '$role'")" 0 "... and its role too"

inner empty <<'EOF'
empty_database
pg_start
echo "schema $(psql_q "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgjobd'")"
pass "ran"
done_testing
EOF
is "$?:$(grep '^schema ' "$T/empty.out")" "0:schema 0" "empty_database: a database without schema pgjobd"

# A file that creates a role gets a server of its own; one that looks at sessions and
# says shared_cluster (they are its database's) does not.
for kind in role declared; do
	case $kind in
	role) body='psql_q "CREATE ROLE someone"' ;;
	declared) body='psql_q "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()" >/dev/null' ;;
	esac
	inner "$kind" <<EOF
$([ $kind = declared ] && echo shared_cluster)
pg_start
$body
echo "dir \$(psql_q 'SHOW data_directory') db \$(psql_q 'SELECT current_database()')"
pass "ran"
done_testing
EOF
	ok $? "a file that does '$kind' passes" || diag "$(cat "$T/$kind.out")"
done
like "$(grep '^dir ' "$T/role.out")" "^dir /.*/pg db pgjobd_test\$" \
	"CREATE ROLE: a server of its own, database pgjobd_test"
like "$(cat "$T/role.out")" "a server of its own: role.sh mentions 'CREATE ROLE'" "... and a note says why"
is "$(grep '^dir ' "$T/declared.out" | cut -d' ' -f2)" "$(psql_q 'SHOW data_directory')" \
	"pg_stat_activity after shared_cluster: the shared server"

inner restart <<'EOF'
shared_cluster
pg_start
pg_restart
pass "restarted"
done_testing
EOF
isnt "$?" 0 "pg_restart on the shared server fails the file"
like "$(cat "$T/restart.out")" "Bail out! pg_restart on the shared server: call own_cluster" \
	"... saying what to do"
unlike "$(cat "$T/restart.out")" "ok 1 - restarted" "... before restarting anything"

done_testing
