#!/usr/bin/env bash
# `pgjobd migrate` runs every migration it applies in one transaction, and says "applied
# NNN_name" only once that transaction has committed: when a migration fails, nothing was
# applied and no "applied" line is printed (it used to print one for each migration
# before the failing one, then "nothing was changed"). The failure is provoked by a table
# that a later migration creates (014_schedules: pgjobd.schedules), made beforehand.
. "$(dirname "$0")/lib.sh"
require_pgjobd

plan 8

empty_database
pg_start
write_conf "$T/a.ini" <<EOF
$(conf_header)
EOF

psql_q "CREATE SCHEMA pgjobd; CREATE TABLE pgjobd.schedules (x int)"
"$PGJOBD" migrate -c "$T/a.ini" >"$T/m1.out" 2>"$T/m1.err"
is "$?" 1 "a failing migration: exit 1"
grep -q "migration 014_schedules failed; nothing was changed" "$T/m1.err"
ok $? "it names the migration that failed" || diag "$(cat "$T/m1.err")"
is "$(cat "$T/m1.out")" "" "no 'applied' line: nothing was committed"
is "$(psql_q "SELECT to_regclass('pgjobd.schema_version') IS NULL AND to_regclass('pgjobd.jobs') IS NULL")" t \
	"and nothing was: no pgjobd.schema_version, no pgjobd.jobs"

psql_q "DROP TABLE pgjobd.schedules"
"$PGJOBD" migrate -c "$T/a.ini" >"$T/m2.out" 2>"$T/m2.err"
is "$?" 0 "the same migrate succeeds once the table is gone" || diag "$(cat "$T/m2.err")"
applied=$(grep -c '^applied ' "$T/m2.out")
is "$applied" "$(psql_q "SELECT count(*) FROM pgjobd.schema_version")" \
	"one 'applied' line per migration recorded in pgjobd.schema_version"
is "$(grep '^applied ' "$T/m2.out" | sed 's/^applied //' | tr '\n' ' ')" \
	"$(psql_q "SELECT string_agg(name, ' ' ORDER BY version) || ' ' FROM pgjobd.schema_version")" \
	"in order, with their names"
is "$(tail -n 1 "$T/m2.out")" "schema pgjobd is at version $(psql_q "SELECT max(version) FROM pgjobd.schema_version")" \
	"then the version reached"
