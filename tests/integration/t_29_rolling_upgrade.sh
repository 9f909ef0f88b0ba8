#!/usr/bin/env bash
# A rolling upgrade, in the order pgjobd(8) gives (UPGRADES): two daemons of the running
# version ("old": $PGJOBD) run jobs of both lock modes and a producer keeps enqueueing;
# the next version ("new": $PGJOBD_NEXT, the same sources with one migration more,
# tests/integration/next/999_next.sql, which alters pgjobd.jobs) is refused before the
# migration (exit 3); `new migrate` runs while the old daemons work. Checked:
#  - the migration waits for the running transaction-mode jobs (they hold pgjobd.jobs)
#    with lock_timeout and retries: no producer INSERT waits 2 s or more meanwhile;
#  - once it commits, the old daemons stop claiming, let their running jobs finish (the
#    lease jobs longer than their lease), write their outcomes (attempt 1, nothing
#    killed), and exit 4, a status the unit does not restart;
#  - new daemons started side by side take over the queue: nothing is lost, nothing runs
#    twice.
. "$(dirname "$0")/lib.sh"
require_pgjobd
NEXT=${PGJOBD_NEXT:-$(dirname "$PGJOBD")/tests/pgjobd-next}
[ -x "$NEXT" ] || bail_out "the next version's binary is not at $NEXT (make build/tests/pgjobd-next, or set PGJOBD_NEXT)"

own_cluster # reads pg_stat_activity and pg_locks
pg_start

plan 23

make_mark_script "$T/mark.sh" "$T/marks.log"
body="[queue.tx]
command = $T/mark.sh
lock_mode = transaction
concurrency = 2

[queue.ls]
command = $T/mark.sh
lock_mode = lease
lease = 3s
concurrency = 3"
start_daemons old1 old2 <<<"$body"
OLD1=${DAEMONS[old1]} OLD2=${DAEMONS[old2]}
NEED=$(psql_q "SELECT max(version) FROM pgjobd.schema_version")
NEXT_V=$("$NEXT" --version | sed -n 's/.*schema version \([0-9]*\)).*/\1/p')
cmp_ok "${NEXT_V:-0}" -gt "$NEED" "the next version needs schema $NEXT_V, the running one $NEED"

# Long enough that the migration has to wait for the transaction-mode ones, and that
# the lease ones outlive their lease (3 s) after it.
read -r -d '' TX1 TX2 LS1 LS2 < <(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES
	('tx', '{\"sleep\": 7}'), ('tx', '{\"sleep\": 7}'),
	('ls', '{\"sleep\": 14}'), ('ls', '{\"sleep\": 14}') RETURNING id")
wait_until 30 "[ \"\$(count_jobs \"id IN ($TX1, $TX2, $LS1, $LS2) AND status = 'running'\")\" = 4 ]"
ok $? "two jobs of each lock mode run in the old daemons"

# start_new NAME CONF: as start_daemon, with the next version's binary.
start_new() {
	"$NEXT" -c "$2" >>"$T/$1.log" 2>&1 </dev/null &
	DAEMON_PID=$!
	DAEMON_PIDS+=("$DAEMON_PID")
	echo "$DAEMON_PID" >"$T/$1.pid"
}

# The new version before the migration: refused, and told what to do.
printf '%s\n\n%s\n' "$(conf_header)" "$body" >"$T/new.ini"
start_new new0 "$T/new.ini"
wait_daemon_exit "$DAEMON_PID" 20
is "$DAEMON_STATUS" 3 "the new version before the migration: exit 3"
grep -q 'schema pgjobd is older than this pgjobd: run pgjobd migrate' "$T/new0.log"
ok $? "... saying to run pgjobd migrate" || diag "$(cat "$T/new0.log")"

# The producer: one session, an INSERT every 100 ms, each one's time in the server
# (psql's \timing: the round trip, a lock wait included) in $T/producer.log.
producer() {
	local i=0
	echo '\timing on'
	while [ ! -e "$T/producer.stop" ]; do
		i=$((i + 1))
		echo "INSERT INTO pgjobd.jobs (queue, data) VALUES ('ls', '{\"p\": $i}') RETURNING 'inserted';"
		sleep 0.1
	done
}
producer | psql -X -qAt -v ON_ERROR_STOP=1 >"$T/producer.log" 2>&1 &
echo $! >"$T/producer.pid"
sleep 0.5

mig_start=$(now_ms)
"$NEXT" migrate -c "$T/old1.ini" >"$T/next-migrate.out" 2>"$T/next-migrate.err" &
mig=$!
echo $mig >"$T/migrate.pid"
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity
                                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                                   AND query LIKE '%999_next.sql%'\")\" = 1 ]"
ok $? "the migration waits for a lock on pgjobd.jobs (held by the running transaction-mode jobs)"
wait_until 60 "! pid_alive $mig"
wait "$mig"
mig_status=$?
mig_ms=$(($(now_ms) - mig_start))
is "$mig_status:$(cat "$T/next-migrate.out")" "0:applied 999_next
schema pgjobd is at version $NEXT_V" "new migrate: exit 0, 'applied' printed once committed" ||
	diag "$(cat "$T/next-migrate.err")"
is "$(job_field "$TX1" status) $(job_field "$TX2" status)" "succeeded succeeded" \
	"it committed only after the transaction-mode jobs had ended (${mig_ms} ms)"

# The new daemons, side by side with the old ones still draining.
start_new new1 "$T/new.ini"
NEW1=$DAEMON_PID
start_new new2 "$T/new.ini"
NEW2=$DAEMON_PID

wait_until 10 "grep -q 'schema is newer than this pgjobd' '$T/old1.log' && grep -q 'schema is newer than this pgjobd' '$T/old2.log'"
ok $? "both old daemons see the newer schema at once (the migration's NOTIFY)"
ok "$(pid_alive "$OLD1" || pid_alive "$OLD2"; echo $?)" "... and one at least still runs (its lease jobs)"
wait_daemon_exit "$OLD1" 40
s1=$DAEMON_STATUS
wait_daemon_exit "$OLD2" 40
is "$s1 $DAEMON_STATUS" "4 4" "once their jobs are done, the old daemons exit 4"
grep -q '^RestartPreventExitStatus=2 3 4$' "$REPO_ROOT/systemd/pgjobd.service" &&
	grep -q '^RestartPreventExitStatus=2 3 4$' "$REPO_ROOT/systemd/pgjobd@.service"
ok $? "the units do not restart on exit status 4 (nor 2, 3)"
is "$(cat "$T/old1.log" "$T/old2.log" | grep -c 'msg="terminating\|shutdown_grace over\|lost_lock\|lease lost\|outcome not recorded')" 0 \
	"the old daemons terminated nothing and lost no claim"
is "$(psql_q "SELECT string_agg(status || '/' || attempts, ' ' ORDER BY id) FROM pgjobd.jobs
               WHERE id IN ($TX1, $TX2, $LS1, $LS2)")" \
	"succeeded/1 succeeded/1 succeeded/1 succeeded/1" "their four jobs: succeeded, attempt 1"
started_after=$(for f in old1 old2; do
	awk '/schema is newer than this pgjobd/ { seen = 1 } seen && /msg="job started"/' "$T/$f.log"
done | wc -l)
is "$started_after" 0 "no old daemon started a job after it saw the newer schema"

touch "$T/producer.stop"
wait_until 10 "! pid_alive $(cat "$T/producer.pid")"
wait "$(cat "$T/producer.pid")" 2>/dev/null
n_ins=$(grep -c '^inserted$' "$T/producer.log")
max_ms=$(awk '/^inserted$/ { ins = 1; next } ins && $1 == "Time:" { if ($2 > m) m = $2; ins = 0 }
              END { printf "%d\n", m }' "$T/producer.log")
is "$(grep -vc '^inserted$\|^Time: ' "$T/producer.log")" 0 "no producer INSERT failed" ||
	diag "$(grep -v '^inserted$\|^Time: ' "$T/producer.log")"
cmp_ok "$n_ins" -ge 20 "the producer inserted all along ($n_ins jobs)"
cmp_ok "$max_ms" -lt 2000 "no producer INSERT waited 2 s or more (the longest took $max_ms ms; the migration $mig_ms ms)"

# The new daemons take over: the producer's jobs, and new ones of both modes.
psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('tx', '{}'), ('tx', '{}'), ('ls', '{}')" >/dev/null
wait_until 60 "[ \"\$(count_jobs \"status <> 'succeeded'\")\" = 0 ]"
ok $? "the new daemons run every job left: nothing lost" ||
	diag "$(psql_q "SELECT id, queue, status, attempts FROM pgjobd.jobs WHERE status <> 'succeeded'")"
is "$(count_jobs "attempts <> 1")" 0 "every job ran exactly once (attempts 1)"
check_markers "$T/marks.log" >"$T/markers.out"
ok $? "no overlap, no job started twice" || diag "$(cat "$T/markers.out")"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs")" "$(grep -c '^end ' "$T/marks.log")" \
	"one command ran to its end per job"
ok "$(pid_alive "$NEW1" && pid_alive "$NEW2"; echo $?)" "the new daemons serve on"
stop_daemon "$NEW1"
s1=$?
stop_daemon "$NEW2"
is "$s1 $?" "0 0" "SIGTERM: the new daemons exit 0"
