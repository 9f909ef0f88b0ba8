#!/usr/bin/env bash
# An upgrade from schema version 17 to 18 (018_names.sql renames try_group_head_v2,
# which every grouped claim calls) while a daemon of version 17 runs, one grouped job in
# flight: its claimer session has claimed (its claim_batch compiled, with plans naming
# the old function), its slot holds the job in lock mode `transaction`. `pgjobd migrate`
# waits for that job's outcome (grant_roles locks pgjobd.jobs), applies 018, and the
# same claimer session's next claims start the group's next jobs: with twelve arguments
# as a daemon of version 17 claims, and with eleven as the previous release's daemon
# (version 8) does. The database at version 17 is made from sql/001..017 the way
# `pgjobd migrate` applies them (its embedded migrations only go to the newest).
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # setup_roles creates the roles (cluster-wide); it reads pg_stat_activity
empty_database
pg_start

plan 12

# ---------------------------------------------------------------- a database at version 17

{
	echo "SET client_min_messages = warning;"
	echo "CREATE SCHEMA pgjobd;"
	echo "CREATE TABLE pgjobd.schema_version (version integer PRIMARY KEY, name text NOT NULL,"
	echo "    applied_at timestamptz NOT NULL DEFAULT now());"
	for f in "$REPO_ROOT"/sql/[0-9][0-9][0-9]_*.sql; do
		n=$(basename "$f" .sql)
		v=$((10#${n%%_*}))
		[ "$v" -le 17 ] || continue
		cat "$f"
		echo "INSERT INTO pgjobd.schema_version (version, name) VALUES ($v, '$n');"
	done
	echo "SELECT pgjobd.setup_roles();"
} | psql -X -q -1 -v ON_ERROR_STOP=1 >"$T/v17.log" 2>&1
ok $? "sql/001..017 applied in one transaction, as pgjobd migrate does, and the roles set up"
is "$(psql_q "SELECT max(version) || ' ' || (to_regprocedure('pgjobd.try_group_head_v2(text, text, bigint)')
                                             IS NOT NULL)
                FROM pgjobd.schema_version")" "17 true" "schema version 17, with try_group_head_v2"

W=$(psql_q "SELECT pgjobd.register_worker('old:1', 600000, '{g}')")
read -r -d '' A B C < <(psql_q "INSERT INTO pgjobd.jobs (queue, group_id)
                                VALUES ('g', 'o'), ('g', 'o'), ('g', 'o') RETURNING id")
like "$A $B $C" '^[0-9]+ [0-9]+ [0-9]+$' "three jobs of group o: $A, $B, $C"

# session NAME FD: a psql session of the daemon's database role, reading its statements
# from $T/NAME.fifo (written through file descriptor FD), printing to $T/NAME.out.
session() {
	mkfifo "$T/$1.fifo"
	psql -X -qAt -v ON_ERROR_STOP=1 <"$T/$1.fifo" >"$T/$1.out" 2>&1 &
	echo $! >"$T/$1.pid"
	eval "exec $2>\"\$T/\$1.fifo\""
	echo "SET ROLE pgjobd_worker;" >&"$2"
}
# said NAME TAG: the last line of $T/NAME.out that starts with TAG, TAG cut off.
said() { sed -n "s/^$2 //p" "$T/$1.out" | tail -n 1; }
# claim ARGS: a claim of one job for slot old:1:g.0 in the claimer session, ARGS the
# arguments after p_skip; its answer (ID:GROUP_ROW:FENCE, or nothing) in $got.
n_claims=0
claim() {
	n_claims=$((n_claims + 1))
	got=
	# psql stops at an error (the answer is in the diagnostics): write to it no more.
	pid_alive "$(cat "$T/claimer.pid")" || return 1
	echo "SELECT 'claim $n_claims ' || coalesce(string_agg(job_id || ':' || group_row || ':' || fence, ','), '')
	        FROM pgjobd.claim_batch('g', $W, '{old:1:g.0}', 5, 0, 1048576, 1000, false,
	                                '{}', '{}', '{}'$1);" >&7
	wait_until 20 "grep -q '^claim $n_claims \|ERROR' '$T/claimer.out' || ! pid_alive \$(cat '$T/claimer.pid')"
	got=$(said claimer "claim $n_claims")
}

# ---------------------------------------------------------------- a job in flight

session claimer 7
claim ", NULL::bigint"
IFS=: read -r J G F <<<"$got"
is "$J" "$A" "a claim of version 17 (twelve arguments) starts $A, the group's head" ||
	diag "$(cat "$T/claimer.out")"

session slot 8
echo "BEGIN;
      SELECT 'group ' || g.id FROM pgjobd.groups g WHERE g.id = ${G:-0} FOR UPDATE;
      SELECT 'held ' || j.id FROM pgjobd.jobs j
       WHERE j.id = ${J:-0} AND j.status = 'running' AND j.fence = ${F:-0} FOR UPDATE OF j;" >&8
wait_until 20 "grep -q '^held \|ERROR' '$T/slot.out'"
is "$(said slot held)" "$A" "its slot holds it (group row, then job row, in an open transaction)" ||
	diag "$(cat "$T/slot.out")"

# ---------------------------------------------------------------- the upgrade

write_conf "$T/m.ini" <<EOF
$(conf_header)
EOF
"$PGJOBD" migrate -c "$T/m.ini" >"$T/migrate.log" 2>&1 &
mig=$!
echo "$mig" >"$T/migrate.pid"
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity
                                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                                   AND query LIKE '-- 018_names.sql%'\")\" = 1 ]"
ok $? "pgjobd migrate waits for the job in flight (018 takes pgjobd.jobs in grant_roles)" ||
	diag "$(cat "$T/migrate.log")"

# The outcome, in the holding transaction, as the slot writes it.
echo "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = clock_timestamp(),
             updated_at = clock_timestamp()
       WHERE id = ${J:-0} AND fence = ${F:-0} AND status = 'running';
      COMMIT;
      SELECT 'outcome ' || status FROM pgjobd.jobs WHERE id = ${J:-0};" >&8
wait_until 20 "grep -q '^outcome \|ERROR' '$T/slot.out'"
is "$(said slot outcome)" succeeded "the slot's outcome commits while the upgrade waits" ||
	diag "$(cat "$T/slot.out")"
wait_until 30 "! pid_alive $mig"
wait "$mig"
mig_rc=$?
# Every migration from 018 on, in order, from sql/ (a later migration adds its line).
expected=
for f in "$REPO_ROOT"/sql/[0-9][0-9][0-9]_*.sql; do
	f=${f##*/}
	f=${f%.sql}
	[ "$((10#${f%%_*}))" -ge 18 ] && expected+="applied $f"$'\n' && last=$((10#${f%%_*}))
done
is "$mig_rc:$(cat "$T/migrate.log")" "0:${expected}schema pgjobd is at version $last" \
	"then pgjobd migrate applies 018 (and the versions after it) and exits 0"
# (version 41 gave try_group_head two more arguments, version 43 took the horizon back)
is "$(psql_q "SELECT (to_regprocedure('pgjobd.try_group_head_v2(text, text, bigint)') IS NULL)
                     || ' ' || (to_regprocedure('pgjobd.try_group_head(text, text, bigint, int)') IS NOT NULL)")" \
	"true true" "try_group_head_v2 is try_group_head now"

# ---------------------------------------------------------------- the old daemon claims on

claim ", NULL::bigint"
is "${got%%:*}" "$B" "the same claimer session, twelve arguments: starts $B, the group's next job" ||
	diag "$(cat "$T/claimer.out")"
psql_q "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = clock_timestamp()
         WHERE id = ${B:-0}" >/dev/null
claim ""
is "${got%%:*}" "$C" "... and with eleven arguments (the previous release's claim): starts $C" ||
	diag "$(cat "$T/claimer.out")"
is "$(count_jobs "queue = 'g' AND status = 'running'")" 1 "one job of the group runs"
exec 7>&- 8>&-
wait_until 10 "! pid_alive \$(cat '$T/claimer.pid') && ! pid_alive \$(cat '$T/slot.pid')"
