#!/usr/bin/env bash
# PostgreSQL 14 is below the oldest version pgjobd supports (15): `pgjobd migrate`,
# `pgjobd check`, the other commands and the daemon each say "pgjobd needs PostgreSQL 15
# or later; this server is 14.N" before doing anything else, and exit 2 (a configuration
# error: the file names the wrong server; systemd does not restart the daemon on it). The
# database is left as it was: no schema pgjobd, no roles, and no "applied" line from
# migrate (on 14, migrate used to print "applied 001_init" ... "applied 007_held_groups",
# then fail at 008_security and roll all of them back).
#
# The server is the official PostgreSQL 14 build that tests/pg-versions.sh installs
# (`make check-pg-versions`) into build/pg/14, or $PG14_BINDIR; without one the file is
# skipped, saying so.
. "$(dirname "$0")/lib.sh"
require_pgjobd

PG14_BINDIR=${PG14_BINDIR:-$REPO_ROOT/build/pg/14/bin}
[ -x "$PG14_BINDIR/postgres" ] ||
	skip_all "no PostgreSQL 14 build in $PG14_BINDIR (make check-pg-versions installs one)"

plan 17

own_cluster
empty_database
PG_BINDIR=$PG14_BINDIR
pg_opts() {
	echo "-c listen_addresses='' -c unix_socket_directories=$T/sock -c fsync=off -c port=$PG_PORT" \
		"-c log_statement=all -c log_line_prefix='app=%a '"
}
pg_start

version=$(psql_q "SHOW server_version")
like "$version" '^14\.[0-9]+$' "the server is PostgreSQL 14 ($version)"
want="pgjobd needs PostgreSQL 15 or later; this server is $version"

write_conf "$T/a.ini" <<EOF
$(conf_header)

[queue.a]
command = true
EOF

# untouched: what pgjobd would have made is not there (prints the count of each).
untouched() {
	psql_q "SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'pgjobd') || ' '
	            || (SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pgjobd%') || ' '
	            || (SELECT count(*) FROM pg_class WHERE relname = 'schema_version')"
}

"$PGJOBD" migrate --grant -c "$T/a.ini" >"$T/migrate.out" 2>"$T/migrate.err"
is "$?" 2 "migrate --grant exits 2 on PostgreSQL 14"
is "$(cat "$T/migrate.err")" "pgjobd: migrate: $want" "migrate says why, and nothing else"
is "$(cat "$T/migrate.out")" "" "migrate prints no 'applied' line"
is "$(untouched)" "0 0 0" "migrate changed nothing: no schema pgjobd, no roles, no schema_version"

"$PGJOBD" check -c "$T/a.ini" >"$T/check.out" 2>"$T/check.err"
is "$?" 2 "check exits 2 on PostgreSQL 14"
is "$(cat "$T/check.err")" "pgjobd: check: $want" "check says why, not 'run pgjobd migrate'"
is "$(cat "$T/check.out")" "" "check prints nothing on stdout"

"$PGJOBD" status -c "$T/a.ini" >"$T/status.out" 2>"$T/status.err"
is "$?" 2 "status exits 2 on PostgreSQL 14"
is "$(cat "$T/status.err")" "pgjobd: status: $want" "status says why"

# The daemon: refuses at its first connection, exits 2, and sent nothing.
start_daemon d "$T/a.ini"
wait_daemon_exit "$DAEMON_PID" 20
is "$DAEMON_STATUS" 2 "the daemon exits 2 on PostgreSQL 14"
grep -F "msg=\"$want\"" "$T/d.log" | grep -q 'app="pgjobd listener"'
ok $? "the daemon logs why" || diag "$(cat "$T/d.log")"
grep -F "msg=\"$want\"" "$T/d.log" | head -n 1 | grep -q 'level=error'
ok $? "at level error" || diag "$(cat "$T/d.log")"
unlike "$(cat "$T/d.log")" 'schema version|run pgjobd migrate|does not exist' \
	"the daemon says nothing about the schema (it sent no statement)"
# Nothing pgjobd sent reached the server (every statement is logged, with its
# application: psql's are there, none of pgjobd's sessions').
grep -q "app=psql .*statement: SHOW server_version" "$T/pg.log"
ok $? "the server's log names each statement's application" || diag "$(tail -n 20 "$T/pg.log")"
unlike "$(grep -E 'app=pgjobd.*(statement|execute)' "$T/pg.log")" '.' \
	"no pgjobd session (migrate, check, status, the daemon's) ran any statement"
is "$(untouched)" "0 0 0" "the daemon changed nothing"
