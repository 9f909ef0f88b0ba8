#!/usr/bin/env bash
# The claimer (one session per queue that claims for the idle slots, and
# answers for each claimed job until its slot holds the job's rows) under
# fire: two daemons share a grouped queue while the claimer sessions are
# terminated again and again (pg_terminate_backend), so claims die between
# their commit and the slots' holds. Guarantees 1-3 must hold: never two
# commands of one group, group order kept, nothing lost, and a job taken
# over from a lost claim is run again (attempts counted), never twice at once.
. "$(dirname "$0")/lib.sh"
require_pgjobd

shared_cluster # the claimer sessions it ends are its own database's
pg_start
make_mark_script "$T/mark.sh" "$T/markers.log"
start_daemons a b <<EOF
[queue.c]
command = /bin/bash '$T/mark.sh'
concurrency = 6
max_attempts = 10
EOF

# 8 groups x 25 short jobs, interleaved ids, plus 50 ungrouped ones.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
	SELECT 'c', 'g' || (i % 8), '{\"sleep\": \"rand\"}' FROM generate_series(0, 199) i ORDER BY i"
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'c', '{\"sleep\": \"rand\"}' FROM generate_series(1, 50)"

kills=0
finished() { [ "$(count_jobs "status IN ('succeeded', 'failed')")" = 250 ]; }
for _ in $(seq 40); do
	finished && break
	k=$(psql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'pgjobd claimer %'")
	kills=$((kills + k))
	sleep 0.$((RANDOM % 3 + 1))
done
cmp_ok "$kills" -ge 5 "claimer sessions were terminated while jobs ran ($kills)"

wait_until 90 finished
ok $? "all 250 jobs finish"
is "$(count_jobs "status <> 'succeeded'")" 0 "all succeeded"
problems=$(check_markers --lenient "$T/markers.log")
ok $? "no two commands of a group at once, group order kept" || diag "$problems"
is "$(grep -c '^overlap' "$T/markers.log")" 0 "flock never saw two commands of one group"
# A job runs more than once only when a claim was lost after its commit; its
# attempts count every start (at-least-once, each run counted).
starts=$(grep -c '^start ' "$T/markers.log")
attempts=$(psql_q "SELECT sum(attempts) FROM pgjobd.jobs")
cmp_ok "$starts" -le "$attempts" "every command start was counted as an attempt ($starts starts, $attempts attempts)"
# pgjobd takes no advisory locks (sql/009_row_locks.sql).
is "$(psql_q "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
              WHERE l.locktype = 'advisory' AND d.datname = current_database()")" 0 "no advisory lock is held"
for n in a b; do
	pid_alive "${DAEMONS[$n]}"
	ok $? "daemon $n is still running"
done
done_testing
