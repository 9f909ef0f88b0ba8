#!/usr/bin/env bash
# Pause (pgjobd(8)): pgjobd.pause('q') stops new starts of queue q on every daemon
# at once and persistently (a daemon started while q is paused starts nothing of it);
# running jobs are not disturbed; other queues go on; pgjobd.resume('q') restarts q on
# every daemon at once (its NOTIFY wakes them: the fallback poll here is an hour).
. "$(dirname "$0")/lib.sh"
require_pgjobd

shared_cluster # the sessions it counts are its own database's
pg_start
conf=$T/pause.ini
write_conf "$conf" <<EOF
$(conf_header poll_interval=1h)

[queue.pq]
command = echo "\$PGJOBD_JOB_ID" >> '$T/pq.ran'; sleep "\${PGJOBD_ARG_sleep:-0}"
concurrency = 2

[queue.other]
command = true
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
: >"$T/pq.ran"

start_daemon d1 "$conf"
d1=$DAEMON_PID
start_daemon d2 "$conf"
d2=$DAEMON_PID
# Both daemons' claimers are idle and registered (so NOTIFY reaches them).
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'pq'\")\" = 2 ]"
ok $? "two daemons serve pq"

long=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('pq', '{\"sleep\": 3}') RETURNING id")
wait_until 10 "[ \"\$(job_field $long status)\" = running ]"
ok $? "a long job is running"
is "$(psql_q "SELECT pgjobd.pause('pq')")" t "pause() returns true"
is "$(psql_q "SELECT pgjobd.pause('pq')")" f "pause() again returns false"
is "$(psql_q "SELECT paused FROM pgjobd.queue_stats WHERE queue = 'pq'")" t "queue_stats shows pq paused"

psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'pq' FROM generate_series(1, 6)"
o=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('other') RETURNING id")
wait_until 10 "[ \"\$(job_field $o status)\" = succeeded ]"
ok $? "another queue is not paused"
wait_until 10 "[ \"\$(job_field $long status)\" = succeeded ]"
ok $? "the running job was not disturbed: it succeeded"
is "$(job_field "$long" attempts)" 1 "... in one attempt"
# The INSERT woke both waiting claimers; a claim that finds its queue paused starts
# nothing and takes its claimer off pgjobd.waiting. Both are off: both have claimed.
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'pq'\")\" = 0 ]"
ok $? "both daemons have claimed since the pause (neither waits for pq any more)"
is "$(count_jobs "queue = 'pq' AND status = 'queued'")" 6 "while paused, neither daemon starts pq's jobs"

# Restart one daemon, replace the other: still paused.
stop_daemon "$d1" 30
is $? 0 "daemon 1 stops"
stop_daemon "$d2" 30
is $? 0 "daemon 2 stops"
start_daemon d3 "$conf"
start_daemon d4 "$conf"
wait_until 10 "grep -q 'msg=\"ready\"' '$T/d3.log' && grep -q 'msg=\"ready\"' '$T/d4.log'"
ok $? "two new daemons are ready"
# Each claims once at startup (the poll is an hour): wait until both claimers' sessions
# have finished a claim.
wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
	AND application_name = 'pgjobd claimer ' || left(encode(sha256('pq'::bytea), 'hex'), 16) AND state = 'idle' AND query LIKE '/* pgjobd claim */%'\")\" = 2 ]"
ok $? "... and their claimers have claimed"
is "$(count_jobs "queue = 'pq' AND status = 'queued'")" 6 "a daemon started while pq is paused starts nothing of it"

is "$(psql_q "SELECT pgjobd.resume('pq')")" t "resume() returns true"
is "$(psql_q "SELECT pgjobd.resume('pq')")" f "resume() again returns false"
wait_until 10 "[ \"\$(count_jobs \"queue = 'pq' AND status = 'succeeded'\")\" = 7 ]"
ok $? "after resume the waiting jobs run at once (woken by NOTIFY, not by the hourly poll)"
is "$(psql_q "SELECT paused FROM pgjobd.queue_stats WHERE queue = 'pq'")" f "queue_stats shows pq not paused"

psql -X -qAt -c "SELECT pgjobd.pause('no such queue')" >/dev/null 2>"$T/err"
ok $((! $?)) "pause() of a bad queue name is an error"
like "$(cat "$T/err")" "bad queue name" "... saying so"
is "$(psql_q "SELECT pgjobd.pause('unserved')")" t "a queue nobody serves (yet) can be paused"
is "$(psql_q "SELECT queue || ' ' || paused || ' ' || queued FROM pgjobd.queue_stats WHERE queue = 'unserved'")" \
	"unserved true 0" "... and shows in queue_stats with no jobs"

stop_daemon "$DAEMON_PID" 30
done_testing
