#!/usr/bin/env bash
# Liveness: one group with a long backlog behind its running head must not
# hold back other groups or ungrouped jobs, however many of its jobs come
# first in start order (more than the claim's bounded scan).
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/busy.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.busy]
command = if [ "\$PGJOBD_GROUP_ID" = A ]; then while [ ! -e '$T/go' ]; do sleep 0.05; done; fi; echo ok
concurrency = 3
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate"

psql_q "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'busy', 'A' FROM generate_series(1, 3000)"
start_daemon d "$conf"
d=$DAEMON_PID
wait_until 20 "[ \"\$(count_jobs \"group_id = 'A' AND status = 'running'\")\" = 1 ]"
ok $? "the head of group A runs"
b=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('busy', 'B') RETURNING id")
u=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('busy') RETURNING id")
wait_until 20 "[ \"\$(count_jobs \"id IN ($b, $u) AND status = 'succeeded'\")\" = 2 ]"
ok $? "a later job of group B and a later ungrouped job run while A's 2,999 jobs wait"
is "$(count_jobs "group_id = 'A' AND status = 'running'")" 1 "group A still has exactly one job running"
is "$(count_jobs "group_id = 'A' AND status = 'succeeded'")" 0 "and none of A's jobs has finished"
# Running all 2,999 one after another would take a minute: cancel all but the last 200
# (an UPDATE, as an operator would), then A's head ends and the rest drains in id order.
psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE group_id = 'A' AND status = 'queued'
        AND id <= (SELECT max(id) - 200 FROM pgjobd.jobs WHERE group_id = 'A')" >/dev/null
touch "$T/go"
wait_until 60 "[ \"\$(count_jobs \"status NOT IN ('succeeded', 'cancelled')\")\" = 0 ]"
ok $? "then group A drains"
is "$(count_jobs "group_id = 'A' AND status = 'succeeded'")" 201 "A's head and its last 200 jobs succeeded"
is "$(psql_q "SELECT count(*) FROM (SELECT id, started_at, lag(started_at) OVER (ORDER BY id) AS prev FROM pgjobd.jobs WHERE group_id = 'A' AND status = 'succeeded') s WHERE started_at < prev")" 0 "group A started in id order"
stop_daemon "$d"
is $? 0 "the daemon exits 0"
done_testing
