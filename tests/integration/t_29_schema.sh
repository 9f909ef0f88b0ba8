#!/usr/bin/env bash
# A schema this pgjobd cannot use (pgjobd(8), UPGRADES and EXIT STATUS):
#  - never migrated: the daemon exits 3 at once, says to run `pgjobd migrate`, logs the
#    server's own error text, and terminates nothing; `pgjobd check` exits 3 too; a
#    `pgjobd migrate` that fails halfway prints no "applied" line;
#  - newer than this binary at start: exit 4, "upgrade pgjobd", not "run pgjobd migrate"
#    (check and migrate exit 4 too);
#  - newer while it runs (another host migrated, then the listener's session reconnects):
#    it stops claiming and lets its running commands finish, however long (a lease job
#    keeps its lease, extended until done; a transaction-mode job keeps its session), writes
#    their outcomes (attempt 1, no kill), then exits 4.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # kills the listener's session (pg_terminate_backend)
empty_database
pg_start

plan 32

make_mark_script "$T/mark.sh" "$T/marks.log"
conf() {
	write_conf "$1" <<EOF
$(conf_header)

[queue.tx]
command = $T/mark.sh
lock_mode = transaction
concurrency = 2

[queue.ls]
command = $T/mark.sh
lock_mode = lease
lease = 2s
concurrency = 2
EOF
}
conf "$T/d.ini"

# ---------------------------------------------------------------- never migrated

start_daemon nomig "$T/d.ini"
d=$DAEMON_PID
wait_daemon_exit "$d" 20
is "$DAEMON_STATUS" 3 "unmigrated database: exit 3 (the unit does not restart it)"
grep -q 'level=error msg="schema pgjobd is missing: run pgjobd migrate" .*hint="pgjobd migrate -c ' "$T/nomig.log"
ok $? "it says to run pgjobd migrate, with the file" || diag "$(cat "$T/nomig.log")"
grep -q 'err="relation \\"pgjobd.schema_version\\" does not exist"' "$T/nomig.log"
ok $? "it logs the server's own error text"
is "$(grep -c 'PGRES_PIPELINE_ABORTED' "$T/nomig.log")" 0 "never a bare PGRES_PIPELINE_ABORTED"
is "$(grep -c 'terminating running commands' "$T/nomig.log")" 0 "no 'terminating running commands'"
timeout 20 "$PGJOBD" check -c "$T/d.ini" >"$T/check.out" 2>&1
is "$?" 3 "pgjobd check: exit 3"
like "$(cat "$T/check.out")" "run 'pgjobd migrate -c $T/d.ini'" "... and says to run pgjobd migrate"

# A migration that fails halfway (006 creates pgjobd.workers, which is in the way): no
# "applied" line for what was rolled back.
psql_q "CREATE SCHEMA pgjobd; CREATE TABLE pgjobd.workers (x int)" >/dev/null
timeout 60 "$PGJOBD" migrate -c "$T/d.ini" >"$T/migrate1.out" 2>"$T/migrate1.err"
is "$?:$(cat "$T/migrate1.out")" "1:" "a migration failing halfway: exit 1, nothing said to be applied" ||
	diag "$(cat "$T/migrate1.err")"
like "$(cat "$T/migrate1.err")" 'migration 006_fencing failed; nothing was changed' "... and what failed"
psql_q "SET client_min_messages = warning; DROP SCHEMA pgjobd CASCADE" >/dev/null

pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
NEED=$(psql_q "SELECT max(version) FROM pgjobd.schema_version")

# ---------------------------------------------------------------- newer at start

psql_q "INSERT INTO pgjobd.schema_version (version, name) VALUES ($((NEED + 1)), 'future')" >/dev/null
start_daemon newer "$T/d.ini"
d=$DAEMON_PID
wait_daemon_exit "$d" 20
is "$DAEMON_STATUS" 4 "a newer schema at start: exit 4"
grep -q "level=error msg=\"the database's schema is newer than this pgjobd: upgrade pgjobd on this host\" have=$((NEED + 1)) need=$NEED" "$T/newer.log"
ok $? "it says to upgrade pgjobd" || diag "$(cat "$T/newer.log")"
is "$(grep -c 'run pgjobd migrate\|terminating running commands' "$T/newer.log")" 0 \
	"... not to run pgjobd migrate, and terminates nothing"
timeout 20 "$PGJOBD" check -c "$T/d.ini" >"$T/check.out" 2>&1
is "$?" 4 "pgjobd check: exit 4"
like "$(cat "$T/check.out")" 'newer than this pgjobd .*: upgrade pgjobd on this host' "... and says upgrade"
timeout 20 "$PGJOBD" migrate -c "$T/d.ini" >"$T/migrate2.out" 2>&1
is "$?:$(grep -c 'upgrade pgjobd' "$T/migrate2.out")" "4:1" "pgjobd migrate: exit 4, says upgrade pgjobd"
psql_q "DELETE FROM pgjobd.schema_version WHERE version > $NEED" >/dev/null

# ---------------------------------------------------------------- newer while running

start_daemon run "$T/d.ini"
d=$DAEMON_PID
read -r -d '' T1 T2 L1 L2 < <(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES
	('tx', '{\"gate\": \"go\"}'), ('tx', '{\"gate\": \"go\"}'),
	('ls', '{\"gate\": \"go\"}'), ('ls', '{\"gate\": \"go\"}') RETURNING id")
wait_until 30 "[ \$(grep -c '^start ' '$T/marks.log' 2>/dev/null || echo 0) = 4 ]"
ok $? "two jobs of each lock mode run ($T1 $T2 $L1 $L2)"

# Another host's `pgjobd migrate`, without its NOTIFY: only a reconnect shows it.
psql_q "INSERT INTO pgjobd.schema_version (version, name) VALUES ($((NEED + 1)), 'future')" >/dev/null
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'pgjobd listener'" >/dev/null
wait_until 20 "grep -q 'schema is newer than this pgjobd' '$T/run.log'"
ok $? "after the listener reconnects, the daemon sees the newer schema"
grep -q 'msg="claiming stopped: running jobs finish, then the daemon exits" running=4 exit_code=4' "$T/run.log"
ok $? "it stops claiming; its 4 running jobs go on" || diag "$(grep -v level=debug "$T/run.log" | tail -n 20)"
N=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('tx') RETURNING id")
# Longer than the lease (2 s) and than the daemon's reaction to a wake-up.
holds_for 5 "pid_alive $d && [ \"\$(job_field $N status)\" = queued ] &&
             [ \"\$(count_jobs \"id IN ($T1, $T2, $L1, $L2) AND status = 'running'\")\" = 4 ]"
ok $? "for 5 s (lease 2 s): the daemon runs on, its 4 jobs still run, a new job is not claimed"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE id IN ($L1, $L2) AND lease_until > now()")" 2 \
	"the lease jobs' leases are still being extended"
is "$(grep -c 'msg="terminating\|lost_lock\|lease lost' "$T/run.log")" 0 "nothing was terminated or lost"

touch "$T/gate.go"
wait_daemon_exit "$d" 30
is "$DAEMON_STATUS" 4 "once they are done, the daemon exits 4"
is "$(psql_q "SELECT string_agg(status || '/' || attempts, ' ' ORDER BY id) FROM pgjobd.jobs
               WHERE id IN ($T1, $T2, $L1, $L2)")" \
	"succeeded/1 succeeded/1 succeeded/1 succeeded/1" "each finished job's outcome is written: succeeded, attempt 1"
is "$(grep -c '^end ' "$T/marks.log")" 4 "each command ran to its end"
is "$(job_field "$N" "status || '/' || attempts")" "queued/0" "the job enqueued meanwhile waits for a new daemon"
is "$(grep -c 'terminating running commands\|shutdown_grace over' "$T/run.log")" 0 \
	"no 'terminating running commands'"
check_markers "$T/marks.log" >"$T/markers.out"
ok $? "no overlap, no job run twice" || diag "$(cat "$T/markers.out")"

# ---------------------------------------------------------------- a TERM during that drain

# Newer again, this time seen through pgjobd migrate's NOTIFY; then a TERM: the running
# command gets shutdown_grace (1 s here), as at any stop, and its job goes back to queued.
psql_q "DELETE FROM pgjobd.schema_version WHERE version > $NEED; DELETE FROM pgjobd.jobs" >/dev/null
write_conf "$T/g.ini" <<EOF2
$(conf_header shutdown_grace=1s)

[queue.tx]
command = $T/mark.sh
lock_mode = transaction
EOF2
start_daemon grace "$T/g.ini"
d=$DAEMON_PID
G=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('tx', '{\"gate\": \"never\"}') RETURNING id")
wait_until 20 "[ \"\$(job_field $G status)\" = running ]"
psql_q "INSERT INTO pgjobd.schema_version (version, name) VALUES ($((NEED + 1)), 'future');
        NOTIFY pgjobd_schema" >/dev/null
wait_until 10 "grep -q 'schema is newer than this pgjobd' '$T/grace.log'"
ok $? "a NOTIFY on pgjobd_schema makes the daemon look at once"
holds_for 2 "pid_alive $d && [ \"\$(job_field $G status)\" = running ]"
ok $? "its job runs on"
kill -TERM "$d"
wait_daemon_exit "$d" 20
is "$DAEMON_STATUS" 4 "a TERM then: the daemon exits, still with status 4"
grep -q 'msg="shutting down" running=1 shutdown_grace_ms=1000' "$T/grace.log"
ok $? "the TERM gave the command shutdown_grace"
is "$(job_field "$G" "status || '/' || attempts")" "queued/0" \
	"its job went back to queued, the attempt not counted, as at any stop"
