#!/usr/bin/env bash
# Lock modes side by side (SPEC guarantees 1 and 2 across modes):
#  A. One queue switched from lock mode transaction to lease and back by SIGHUP while its
#     grouped jobs run: running jobs finish in the mode they were claimed in, the next
#     ones are claimed in the new mode, and a group never runs two jobs at once nor out
#     of order.
#  B. Two daemons serve the same queue, one in lock mode transaction, the other in lease:
#     a group's running job keeps the group busy for both.
#  C. A job that commits after a later-numbered job of its group has started becomes the
#     group's head while that job runs under a lease (which holds no lock): it waits for
#     that job to end, on either daemon.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

make_mark_script "$T/mark.sh" "$T/marks.log"
# mode_conf FILE MODE
mode_conf() {
	write_conf "$1" <<EOF
$(conf_header)

[queue.m]
command = exec '$T/mark.sh'
concurrency = 4
lock_mode = $2
lease = 3s
max_attempts = 3
backoff = 100ms
backoff_max = 100ms
kill_grace = 1s
EOF
}
mode_conf "$T/a.ini" transaction
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

# ---- A: switch while jobs run. 5 groups of 12 jobs, 0.2-0.5 s each.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 'm', 'a' || (i % 5), jsonb_build_object('sleep', 0.2 + (i % 4) * 0.1)
        FROM generate_series(1, 60) i ORDER BY i" >/dev/null
wait_until 15 "[ \"\$(count_jobs \"status = 'succeeded'\")\" -ge 5 ]" || fail "A: jobs run"
in_tx=$(count_jobs "status = 'running' AND lease_until IS NULL")
mode_conf "$T/a.ini" lease
kill -HUP "$A"
wait_until 10 "grep -q 'queue changed lock mode.*lock_mode=lease' '$T/a.log'"
ok $? "A: the reload switched the queue to lock mode lease ($in_tx jobs were running in transaction mode)"
wait_until 15 "[ \"\$(count_jobs \"status = 'running' AND lease_until IS NOT NULL\")\" -ge 1 ]"
ok $? "A: jobs are now claimed with leases"
sleep 1
mode_conf "$T/a.ini" transaction
kill -HUP "$A"
wait_until 10 "grep -q 'queue changed lock mode.*lock_mode=transaction' '$T/a.log'"
ok $? "A: and back to lock mode transaction"
wait_until 60 "[ \"\$(count_jobs \"status = 'succeeded'\")\" = 60 ]"
ok $? "A: all 60 jobs succeeded"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE attempts <> 1")" 0 "A: each in one attempt"
is "$(awk '$1 == "start"' "$T/marks.log" | wc -l | tr -d ' ')" 60 "A: each command started once"
problems=$(check_markers "$T/marks.log")
is "$problems" "" "A: no overlap within a group, id order kept"
leased=$(grep -c 'msg="job claimed with a lease"' "$T/a.log")
cmp_ok "$leased" -ge 1 "A: some jobs ran under leases ($leased)"

# ---- B: the same queue in both modes at once, on two daemons
mode_conf "$T/b.ini" lease
start_daemon b "$T/b.ini"
B=$DAEMON_PID
wait_until 10 "workers_alive 2" || fail "B: daemon b registered"
: >"$T/marks.log"
# 8 groups for 4 slots on each daemon. The first jobs of 6 groups wait for $T/gate.b:
# a daemon runs at most 4, so the 6 run only once both daemons, in both modes, run some
# (a barrier: whichever daemon claims first cannot keep every group to itself). The
# other 2 groups and every later job sleep 10-90 ms.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 'm', 'b' || (i % 8), CASE WHEN i <= 6 THEN '{\"gate\": \"b\"}'
                                          ELSE '{\"sleep\": \"rand\"}' END::jsonb
        FROM generate_series(1, 80) i ORDER BY i" >/dev/null
wait_until 60 "[ \"\$(count_jobs \"status = 'running' AND data ? 'gate'\")\" = 6 ]"
ok $? "B: the 6 gated heads run at once"
is "$(psql_q "SELECT count(*) FILTER (WHERE lease_until IS NULL) > 0 AND count(*) FILTER (WHERE lease_until IS NOT NULL) > 0
              AND count(DISTINCT worker_id) = 2 FROM pgjobd.jobs WHERE status = 'running' AND data ? 'gate'")" t \
	"B: ... on both daemons, in both lock modes"
touch "$T/gate.b"
wait_until 90 "[ \"\$(count_jobs \"group_id LIKE 'b%' AND status = 'succeeded'\")\" = 80 ]"
ok $? "B: all 80 jobs succeeded"
ta=$(grep -c "msg=\"job started\".*queue=m" "$T/a.log")
tb=$(grep -c "msg=\"job started\".*queue=m" "$T/b.log")
note "B: job starts so far: daemon a (transaction) $ta, daemon b (lease) $tb"
cmp_ok "$(count_jobs "group_id LIKE 'b%' AND worker LIKE '%:$A:%'")" -ge 1 "B: daemon a (transaction) ran some of them"
cmp_ok "$(count_jobs "group_id LIKE 'b%' AND worker LIKE '%:$B:%'")" -ge 1 "B: daemon b (lease) ran some of them"
problems=$(check_markers "$T/marks.log")
is "$problems" "" "B: no overlap within a group across the two modes, id order kept"
# ---- C: a head that commits late. Job x gets the lower id, in a transaction that commits
# only after job y (a higher id, same group) has started on the lease daemon.
stop_daemon "$A" >/dev/null
: >"$T/marks.log"
psql -X -qAt -c "BEGIN; INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('m', 'c', '{\"sleep\": 0.2}');
                 SELECT pg_sleep(3); COMMIT" >/dev/null 2>&1 &
producer=$!
wait_until 5 "[ \"\$(psql_q \"SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND pid <> pg_backend_pid()\")\" -ge 1 ]"
y=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('m', 'c', '{\"sleep\": 8}') RETURNING id")
wait_until 10 "mark_started $T/marks.log $y 1"
ok $? "C: job $y started on the lease daemon"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait "$producer"
x=$(psql_q "SELECT id FROM pgjobd.jobs WHERE group_id = 'c' AND id < $y")
note "C: job $x (lower id) committed while job $y runs"
sleep 1.5
is "$(job_field "$x" status)" queued "C: job $x waits while job $y runs (no daemon starts it)"
wait_until 20 "[ \"\$(count_jobs \"group_id = 'c' AND status = 'succeeded'\")\" = 2 ]"
ok $? "C: both succeeded"
is "$(grep -c '^overlap' "$T/marks.log")" 0 "C: never both at once"
is "$(awk '$1 == "start" { print $3 }' "$T/marks.log" | tr '\n' ' ')" "$y $x " \
	"C: job $x started after job $y had ended"

stop_daemon "$B"
is $? 0 "daemon b exits 0"
stop_daemon "$A"
is $? 0 "daemon a exits 0"
done_testing
