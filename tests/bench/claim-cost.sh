#!/usr/bin/env bash
# tests/bench/claim-cost.sh BUILD... - the server's time per claim of each build's claim
# statement, side by side on one throwaway PostgreSQL (tests/bench/README, "The claim").
#
# BUILD is a build directory (build/pgjobd and build/tests/claim-sql in it: `make
# build/pgjobd build/tests/claim-sql`), e.g. this tree's and one of an older commit made
# with `git archive COMMIT | tar -x -C DIR` and make there. Each build gets a database of
# its own, migrated by its pgjobd, and claims with the statement its claim-sql prints,
# prepared and planned as the daemon's claiming sessions do. Three loads, each in one
# psql session, for ROUNDS rounds, the builds taking turns:
#   steady   STEADY times: one ungrouped job queued, claimed for 4 slots, finished
#   burst    BURST ungrouped jobs queued at once, claimed 4 at a time, each batch finished
#   grouped  BURST jobs in BURST/4 groups queued at once, likewise (claim_batch's path)
# Printed per round: the claim statement's mean execution time in ms (pg_stat_statements,
# the executor only: no parse, no commit) and the mean planning time; its plans are
# generic, made once per session.
set -u
PGJOBD_LIB_MODE=quiet
. "$(dirname "$0")/../integration/lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BUILD..." >&2; exit 2; }
STEADY=${STEADY:-2000} BURST=${BURST:-20000} ROUNDS=${ROUNDS:-3}
pg_opts() {
	echo "-c listen_addresses='' -c unix_socket_directories=$T/sock -c fsync=off -c port=$PG_PORT" \
		"-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top" \
		"-c pg_stat_statements.track_planning=on"
}
DB_EMPTY=1
pg_start
declare -A W
i=0
for b in "$@"; do
	i=$((i + 1))
	psql_q "CREATE DATABASE b$i" >/dev/null
	PGDATABASE=b$i psql_q "CREATE EXTENSION pg_stat_statements" >/dev/null
	printf '[pgjobd]\ndatabase = host=%s port=%s dbname=b%s user=postgres\n' "$T/sock" "$PG_PORT" "$i" >"$T/b$i.ini"
	"$b/pgjobd" migrate -c "$T/b$i.ini" >"$T/b$i.migrate" 2>&1 || { cat "$T/b$i.migrate"; exit 1; }
	"$b/tests/claim-sql" >"$T/b$i.prep" || exit 1
	W[$i]=$(PGDATABASE=b$i psql_q "SELECT pgjobd.register_worker('bench:1', 3600000, '{q}')")
done
claim() { echo "EXECUTE qc('q', $1, '{a,b,c,d}', 5, 0, 1048576, 1000, false, '{}', NULL);"; }
finish="UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE status = 'running';"
script() { # LOAD I: the psql script of load LOAD for build I
	cat "$T/b$2.prep"
	case $1 in
	steady)
		for ((n = 0; n < STEADY; n++)); do
			echo "INSERT INTO pgjobd.jobs (queue) VALUES ('q');"
			claim "${W[$2]}"
			echo "$finish"
		done ;;
	burst | grouped)
		if [ "$1" = burst ]; then
			echo "INSERT INTO pgjobd.jobs (queue) SELECT 'q' FROM generate_series(1, $BURST);"
		else
			echo "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'q', 'g' || (n % ($BURST / 4)) FROM generate_series(1, $BURST) n;"
		fi
		echo "SELECT pg_stat_statements_reset();"
		for ((n = 0; n < BURST / 4; n++)); do
			claim "${W[$2]}"
			echo "$finish"
		done ;;
	esac
}
for load in steady burst grouped; do
	for ((i = 1; i <= $#; i++)); do script $load $i >"$T/$load.$i.sql"; done
done
printf '%-8s %-5s %-44s %8s %12s %10s\n' load round build claims "exec ms" "plan ms"
for ((r = 1; r <= ROUNDS; r++)); do
	for load in steady burst grouped; do
		for ((i = 1; i <= $#; i++)); do
			export PGDATABASE=b$i
			psql_q "DELETE FROM pgjobd.jobs; DELETE FROM pgjobd.groups; DELETE FROM pgjobd.waiting" >/dev/null
			psql_q "VACUUM ANALYZE pgjobd.jobs" >/dev/null
			psql_q "VACUUM ANALYZE pgjobd.groups" >/dev/null
			psql_q "SELECT pg_stat_statements_reset()" >/dev/null
			psql -X -qAt -v ON_ERROR_STOP=1 -f "$T/$load.$i.sql" >/dev/null || exit 1
			printf '%-8s %-5s %-44s %s\n' $load $r "${!i}" "$(psql_q "SELECT calls, round(mean_exec_time::numeric, 3), round(mean_plan_time::numeric, 3)
				FROM pg_stat_statements WHERE query LIKE '%/* pgjobd claim */%' AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE 'CREATE%' AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())" |
				awk -F'|' '{ printf "%8s %12s %10s", $1, $2, $3 }')"
		done
	done
done
