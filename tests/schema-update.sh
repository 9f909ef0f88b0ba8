#!/usr/bin/env bash
# tests/schema-update.sh - regenerate sql/schema.sql; `make schema` runs it.
#
# Starts a throwaway PostgreSQL cluster the way the integration tests do
# (tests/integration/lib.sh: as root the server runs as user postgres, else as the
# caller), migrates its fresh database with `$PGJOBD migrate --grant` (default
# build/pgjobd), prints the schema with tests/schema-dump.sh and writes it to
# sql/schema.sql when it differs. The cluster is removed on exit.
#
# It refuses when the schema changed but its version did not: a database at a
# version is never migrated again, so a change to a function file
# (sql/functions/) that came without a new migration would reach no installed
# database, and running daemons would not know it (sql/README, "Where the code
# is"). ALLOW_SAME_VERSION=1 overrides it, for a version not released yet.
PGJOBD_LIB_MODE=quiet
. "$(dirname "$0")/integration/lib.sh"
require_pgjobd

out=$REPO_ROOT/sql/schema.sql
pg_start
write_conf "$T/schema.ini" <<EOF
$(conf_header)
EOF
if ! "$PGJOBD" migrate --grant -c "$T/schema.ini" >"$T/migrate.log" 2>&1; then
	echo "make schema: $PGJOBD migrate failed; sql/schema.sql is left as it was" >&2
	exit 1
fi
if ! PG_BINDIR=$PG_BINDIR bash "$REPO_ROOT/tests/schema-dump.sh" >"$T/schema.sql"; then
	echo "make schema: dumping the schema failed; sql/schema.sql is left as it was" >&2
	exit 1
fi
version() { sed -n 's/^-- Schema version \([^,]*\),.*/schema version \1/p' "${1:-/dev/stdin}"; }
if cmp -s "$T/schema.sql" "$out"; then
	echo "sql/schema.sql is up to date ($(version "$out"))"
	exit 0
fi
# the schema as printed, without the header (up to the first blank line)
body() { awk 'p; /^$/ { p = 1 }' "$1"; }
if [ -f "$out" ] && [ "$(version <"$out")" = "$(version <"$T/schema.sql")" ] &&
	[ "${ALLOW_SAME_VERSION:-}" != 1 ] && ! cmp -s <(body "$out") <(body "$T/schema.sql"); then
	echo "make schema: the schema changed, but its version did not ($(version <"$out"))." >&2
	echo "  A changed function file (sql/functions/) needs a new migration sql/NNN_*.sql" >&2
	echo "  (a comment saying what changed is enough): installed databases apply the" >&2
	echo "  function files only on an upgrade. sql/schema.sql is left as it was;" >&2
	echo "  ALLOW_SAME_VERSION=1 writes it anyway (a version not released yet)." >&2
	exit 1
fi
cp "$T/schema.sql" "$out.tmp" && mv "$out.tmp" "$out" || exit 1
echo "wrote sql/schema.sql ($(wc -l <"$out") lines, $(version "$out"))"
