#!/usr/bin/env bash
# sql/schema.sql is what the migrations and the function files produce: a fresh
# database migrated with `pgjobd migrate --grant` and printed by tests/schema-dump.sh
# (exactly what `make schema` writes) must equal it byte for byte. When a migration or
# a function file changed the schema without the file being regenerated, this prints
# the difference and says to run `make schema` (which refuses a change to the schema
# that comes without a new version). Also: the dump is stable (a second one prints the same bytes),
# keeps the grants and policies, and drops what would differ from run to run; and the
# function list: no version-suffixed name is left (018_names.sql renamed the last one).
. "$(dirname "$0")/lib.sh"
require_pgjobd

plan 11

snapshot=$REPO_ROOT/sql/schema.sql
dump() { PG_BINDIR=$PG_BINDIR bash "$REPO_ROOT/tests/schema-dump.sh"; }
# pg_major FILE: the major version of pg_dump named in a dump's header.
pg_major() { sed -n 's/^-- Schema version .*, dumped by pg_dump \([0-9][0-9]*\)\.$/\1/p' "$1"; }

pg_start
write_conf "$T/schema.ini" <<EOF
$(conf_header)
EOF
ok_cmd "pgjobd migrate --grant" "$PGJOBD" migrate --grant -c "$T/schema.ini"

# pg_dump refuses a server of a newer major version than its own, and the builds of
# PostgreSQL 16 to 18 that tests/pg-versions.sh runs the suite on have no pg_dump: there
# the dump checks are skipped, visibly (they run on Debian's 15, the suite's default).
server_major=$(($(psql_q "SHOW server_version_num") / 10000))
PG_BINDIR=${PG_BINDIR:-$(find_pg_bindir)}
if [ ! -x "$PG_BINDIR/pg_dump" ]; then
	# the five checks below: prints, prints the same bytes, no noise, holds, is sql/schema.sql
	skip "PostgreSQL $server_major ($PG_BINDIR) has no pg_dump; the dump is checked on 15" 5
else
	dump >"$T/schema.sql" 2>"$T/dump.log"
	ok $? "tests/schema-dump.sh prints the schema" || diag "$(cat "$T/dump.log")"

	dump >"$T/again.sql" 2>>"$T/dump.log"
	cmp -s "$T/schema.sql" "$T/again.sql"
	ok $? "a second dump prints the same bytes" ||
		diag "$(diff -u "$T/schema.sql" "$T/again.sql" | head -n 40)"

	noise=$(grep -nE '^\\(un)?restrict |^SET |^SELECT pg_catalog\.set_config|^-- (Dumped|Name: )|OWNER TO' \
		"$T/schema.sql")
	runs=$(awk 'p == "" && $0 == "" { print "line " NR ": a second blank line" } { p = $0 }' "$T/schema.sql")
	ok "$([ -z "$noise$runs" ]; echo $?)" "no preamble, owners, pg_dump comments or blank-line runs" ||
		diag "$noise" "$runs"

	missing=
	for want in 'CREATE TABLE pgjobd.jobs (' 'CREATE FUNCTION pgjobd.claim_batch(' \
		'CREATE POLICY producer_insert ON pgjobd.jobs' 'GRANT USAGE ON SCHEMA pgjobd TO pgjobd_producer;' \
		'ALTER TABLE pgjobd.jobs ENABLE ROW LEVEL SECURITY;' '-- Schema version '; do
		grep -qF -- "$want" "$T/schema.sql" || missing+="  $want"$'\n'
	done
	ok "$([ -z "$missing" ]; echo $?)" "the dump holds tables, functions, policies, grants and the version" ||
		diag "missing:" "$missing"

	if [ ! -f "$snapshot" ]; then
		fail "sql/schema.sql is what the migrations produce"
		diag "sql/schema.sql is missing: run make schema"
	elif [ -n "$(pg_major "$snapshot")" ] && [ "$(pg_major "$snapshot")" != "$(pg_major "$T/schema.sql")" ]; then
		# Another major version of pg_dump may print the same schema differently.
		skip "sql/schema.sql was dumped by pg_dump $(pg_major "$snapshot"), this is pg_dump $(pg_major "$T/schema.sql") (set PG_BINDIR)"
	else
		diff -u --label sql/schema.sql --label "what the migrations produce" "$snapshot" "$T/schema.sql" \
			>"$T/schema.diff"
		ok $? "sql/schema.sql is what the migrations produce" || {
			why=("sql/schema.sql is stale: run make schema (and commit sql/schema.sql)")
			# the same version, another schema: `make schema` refuses it
			[ "$(grep '^-- Schema version ' "$snapshot" | cut -d, -f1)" = \
				"$(grep '^-- Schema version ' "$T/schema.sql" | cut -d, -f1)" ] &&
				why+=("... at the same schema version: a changed function file (sql/functions/) needs a new migration first (sql/README, \"Where the code is\")")
			diag "${why[@]}" \
				"$(head -n 300 "$T/schema.diff")"
			[ "$(wc -l <"$T/schema.diff")" -gt 300 ] && diag "(diff cut at 300 of $(wc -l <"$T/schema.diff") lines)"
		}
	fi
fi

# The function list. try_group_head_v2 became try_group_head (018_names.sql): the old
# name is gone, the new one keeps its grants (EXECUTE for the worker role only), and no
# function of the schema still calls or names the old one (PL/pgSQL looks a called
# function up by name: a claim_batch naming it would fail at its first grouped job).
# Version 41 gave it two more arguments (the group's concurrency and a rate's horizon),
# version 43 took the horizon back: the three- and five-argument ones are gone too, and
# the current one has the same grants.
is "$(psql_q "SELECT to_regprocedure('pgjobd.try_group_head_v2(text, text, bigint)') IS NULL")" t \
	"pgjobd.try_group_head_v2 does not exist"
is "$(psql_q "SELECT to_regprocedure('pgjobd.try_group_head(text, text, bigint)') IS NULL")" t \
	"pgjobd.try_group_head(text, text, bigint) does not exist"
is "$(psql_q "SELECT to_regprocedure('pgjobd.try_group_head(text, text, bigint, int, timestamptz)') IS NULL")" t \
	"pgjobd.try_group_head(text, text, bigint, int, timestamptz) does not exist"
is "$(psql_q "SELECT to_regprocedure('pgjobd.try_group_head(text, text, bigint, int)') IS NOT NULL
                || ' worker ' || has_function_privilege('pgjobd_worker',
                                     'pgjobd.try_group_head(text, text, bigint, int)', 'EXECUTE')
                || ' producer ' || has_function_privilege('pgjobd_producer',
                                     'pgjobd.try_group_head(text, text, bigint, int)', 'EXECUTE')
                || ' public ' || has_function_privilege('public',
                                     'pgjobd.try_group_head(text, text, bigint, int)', 'EXECUTE')")" \
	"true worker true producer false public false" \
	"pgjobd.try_group_head(text, text, bigint, int) exists, executable by pgjobd_worker, not by PUBLIC"
is "$(psql_q "SELECT coalesce(string_agg(p.oid::regprocedure::text, ' '), 'none') FROM pg_proc p
               WHERE p.pronamespace = 'pgjobd'::regnamespace
                 AND p.prosrc LIKE '%try\\_group\\_head\\_v2%'")" none \
	"no function of schema pgjobd names try_group_head_v2"
