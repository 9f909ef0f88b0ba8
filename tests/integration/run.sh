#!/usr/bin/env bash
# tests/integration/run.sh - runs the integration test files in parallel, against one
# PostgreSQL server for the whole run. `make check-integration` calls it.
#
#     bash tests/integration/run.sh [-j N] [PROVE-OPTION...] [FILE...]
#
# FILE defaults to every tests/integration/t_*.sh; N (files at once) to $PGJOBD_TEST_JOBS,
# else 8: the files mostly wait (for daemons, commands, timers), so 2 cores keep 8 busy.
# PGJOBD (and NOTIFY_SINK, CHAOS_PROXY) as for a single file.
#
# Before prove starts, this script:
#  - initialises a data directory and keeps a copy of it ($dir/initdb), which a file that
#    needs a server of its own copies instead of running initdb (lib.sh, pg_initdb);
#  - starts the server from another copy, on a Unix socket in $dir/sock only, with room for
#    every file's sessions and each log line naming its database (lib.sh gives a failed
#    file its database's lines);
#  - creates the database pgjobd_template, migrates it with $PGJOBD and closes it to
#    connections (a template must have none when it is copied);
#  - runs prove with PGJOBD_TEST_CLUSTER=$dir: each file then creates its own database
#    from the template and drops it at its end (lib.sh, own_cluster and pg_start);
#  - after prove's summary, prints every check skipped (lib.sh's skip, skip_all), which
#    prove itself counts as passed.
# The server and $dir go at the end (kept with PGJOBD_KEEP_TMP=1); the exit status is
# prove's.
#
# The slowest files start first: each file's time of the last run is kept in a prove state
# file next to $PGJOBD (build/integration.prove; PGJOBD_PROVE_STATE names another); files it
# does not know yet start first of all, in name order.
set -u
PGJOBD_LIB_MODE=quiet
. "$(dirname "$0")/lib.sh"
unset PGJOBD_TEST_CLUSTER # this script makes the server, never uses one

jobs=${PGJOBD_TEST_JOBS:-8}
prove_opts=()
while [ $# -gt 0 ]; do
	case $1 in
	-j) jobs=${2:-} && shift 2 ;;
	-j*) jobs=${1#-j} && shift ;;
	-*) prove_opts+=("$1") && shift ;;
	*) break ;;
	esac
done
case $jobs in '' | *[!0-9]* | 0) echo "run.sh: -j needs a number of files at once" >&2 && exit 2 ;; esac
files=("$@")
[ ${#files[@]} = 0 ] && files=("$(realpath --relative-to=. "$LIB_DIR")"/t_*.sh)
require_pgjobd

make_tmp
pg_setup
pg_initdb "$T/initdb"
cp -a "$T/initdb" "$T/pg" || bail_out "cannot copy the data directory"
mkdir -p "$T/sock"
: >"$T/pg.log"
[ "$(id -u)" = 0 ] && chown "$PG_USER" "$T/sock" "$T/pg.log"
# Each file holds up to about 25 sessions (two daemons of 8 slots, claimers, listeners,
# psql), the heaviest about 105 (t_82_limits: three daemons, 28 transaction-mode slots
# each); PGJOBD_TEST_MAX_CONNECTIONS (default 500) raises the room for runs of many heavy
# files at once (tests/stress.sh). %q leaves the database out of the lines of background
# processes.
opts="-c listen_addresses='' -c unix_socket_directories=$T/sock -c port=$PG_PORT -c fsync=off"
opts="$opts -c max_connections=${PGJOBD_TEST_MAX_CONNECTIONS:-500} -c 'log_line_prefix=%m [%p] %qdb=%d app=%a '"
as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -o "$opts" start >/dev/null ||
	bail_out "pg_ctl start failed (see $T/pg.log)"
PG_RUNNING=1

psql -X -qAt -v ON_ERROR_STOP=1 -h "$T/sock" -p "$PG_PORT" -U postgres -d postgres \
	-c "CREATE DATABASE $PG_TEMPLATE" >/dev/null || bail_out "CREATE DATABASE $PG_TEMPLATE failed"
printf '[pgjobd]\ndatabase = host=%s port=%s dbname=%s user=postgres\n' "$T/sock" "$PG_PORT" \
	"$PG_TEMPLATE" >"$T/template.ini"
"$PGJOBD" migrate -c "$T/template.ini" >"$T/migrate.log" 2>&1 ||
	bail_out "pgjobd migrate of $PG_TEMPLATE failed: $(cat "$T/migrate.log")"
psql -X -qAt -v ON_ERROR_STOP=1 -h "$T/sock" -p "$PG_PORT" -U postgres -d postgres \
	-c "ALTER DATABASE $PG_TEMPLATE WITH IS_TEMPLATE true ALLOW_CONNECTIONS false" >/dev/null ||
	bail_out "cannot close $PG_TEMPLATE"

# Longest first, by the last run's times; unknown files before all of them.
state=${PGJOBD_PROVE_STATE:-$(dirname "$PGJOBD")/integration.prove}
ordered=$(
	for f in "${files[@]}"; do
		echo "$f"
	done | awk -v state="$state" '
		BEGIN {
			while ((getline line < state) > 0) {
				if (line ~ /^  [^ ].*:$/) {
					name = line
					sub(/^  /, "", name)
					sub(/:$/, "", name)
					if (name ~ /^".*"$/) name = substr(name, 2, length(name) - 2)
				}
				else if (line ~ /^    elapsed: /) { t = line; sub(/.*: /, "", t); el[name] = t + 0 }
			}
		}
		{ printf "%012.3f %s\n", ($0 in el) ? el[$0] : 99999999, $0 }' |
		sort -s -k1,1nr | cut -d' ' -f2-
)
mapfile -t files <<<"$ordered"

PGJOBD_TEST_CLUSTER=$T prove -j "$jobs" "${prove_opts[@]}" --state=save --statefile="$state" "${files[@]}"
status=$?
# prove's summary counts a skipped check as passed and names only files skipped whole:
# every skip (lib.sh's skip and skip_all record theirs in $T/skips), with its reason.
if [ -s "$T/skips" ]; then
	awk -F'\t' '
		$2 == "all" { whole[++nw] = $1 ": " $3; next }
		{ n += $2; files[$1] = 1; why[++nr] = "  " $1 ": " $2 " x " $3 }
		END {
			nf = 0; for (f in files) nf++
			if (n) { printf "%d checks skipped (ok # SKIP) in %d file(s):\n", n, nf; for (i = 1; i <= nr; i++) print why[i] }
			if (nw) { printf "%d file(s) skipped whole:\n", nw; for (i = 1; i <= nw; i++) print "  " whole[i] }
		}' "$T/skips"
else
	echo "0 checks skipped"
fi
# lib.sh's cleanup would print the server's whole log after a failure; each failed file
# has printed its own database's lines already.
as_pg "$PG_BINDIR/pg_ctl" -D "$T/pg" -m immediate stop >/dev/null 2>&1
PG_RUNNING=0
if [ "${PGJOBD_KEEP_TMP:-0}" = 1 ]; then
	echo "kept $T" >&2
else
	rm -rf "$T"
fi
trap - EXIT
exit $status
