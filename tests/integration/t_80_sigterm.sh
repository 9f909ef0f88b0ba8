#!/usr/bin/env bash
# SIGTERM/SIGINT (pgjobd(8)): stop claiming, let running commands finish within
# shutdown_grace, else terminate them (their jobs return to queued, the attempt not held
# against max_attempts) and exit 0.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start

# 1. A short job finishes during the drain; nothing new is claimed; exit 0.
write_conf "$T/short.ini" <<EOF
$(conf_header shutdown_grace=20s)

[queue.short]
command = echo \$\$ > '$T/short.pid'; while [ ! -e '$T/go' ]; do sleep 0.05; done; echo fine
EOF
pgjobd_migrate "$T/short.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon drain1 "$T/short.ini"
d=$DAEMON_PID
j1=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('short') RETURNING id")
wait_until 20 "[ -s '$T/short.pid' ]"
ok $? "the short job runs"
kill -TERM "$d"
wait_until 10 "grep -q 'msg=\"shutting down\" running=1' '$T/drain1.log'"
ok $? "draining: the daemon says it waits for its running job"
j2=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('short') RETURNING id")
holds_for 0.5 "pid_alive $d"
ok $? "... and does not exit meanwhile"
pid_alive "$(cat "$T/short.pid")"
ok $? "... which was not signalled"
touch "$T/go"
wait_daemon_exit "$d" 20
is "$DAEMON_STATUS" 0 "the daemon exits 0 once the job is done"
is "$(job_field "$j1" "status || ' ' || attempts || ' ' || (result->>'stdout')")" "succeeded 1 fine" \
	"the running job finished and succeeded"
is "$(job_field "$j2" "status || ' ' || attempts")" "queued 0" "a job enqueued after SIGTERM is not claimed"
psql_q "DELETE FROM pgjobd.jobs WHERE id = $j2"

# 2. A long job outlives shutdown_grace: terminated, back to queued, attempts restored.
cat >"$T/long.sh" <<EOF
if [ -e '$T/long.first' ]; then echo again; exit 0; fi
touch '$T/long.first'
echo \$\$ > '$T/long.pid'
sleep 300
EOF
write_conf "$T/long.ini" <<EOF
$(conf_header shutdown_grace=1s)

[queue.long]
command = /bin/sh '$T/long.sh'
kill_grace = 1s
max_attempts = 3
EOF
start_daemon drain2 "$T/long.ini"
d=$DAEMON_PID
j3=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
wait_until 20 "[ -s '$T/long.pid' ]"
ok $? "the long job runs"
is "$(job_field "$j3" "status || ' ' || attempts")" "running 1" "running, attempt 1"
t0=$(now_ms)
kill -TERM "$d"
wait_daemon_exit "$d" 15
is "$DAEMON_STATUS" 0 "the daemon exits 0"
elapsed=$(($(now_ms) - t0))
cmp_ok "$elapsed" -lt 6000 "within shutdown_grace + kill_grace + slack (${elapsed} ms)"
cmp_ok "$elapsed" -ge 900 "after shutdown_grace (${elapsed} ms)"
pid_alive "$(cat "$T/long.pid")"
isnt $? 0 "the command was terminated"
is "$(job_field "$j3" "status || ' ' || attempts || ' ' || (finished_at IS NULL)")" "queued 0 true" \
	"the job is queued again, attempts back to 0"

start_daemon drain3 "$T/long.ini"
d=$DAEMON_PID
wait_until 20 "[ \"\$(job_field $j3 status)\" = succeeded ]"
ok $? "a new daemon runs it to success"
is "$(job_field "$j3" "attempts || ' ' || (result->>'stdout')")" "1 again" "in attempt 1"

# 3. SIGINT on an idle daemon: exit 0 promptly.
kill -INT "$d"
wait_daemon_exit "$d" 10
is "$DAEMON_STATUS" 0 "SIGINT: an idle daemon exits 0"
done_testing
