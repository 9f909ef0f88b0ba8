#!/usr/bin/env bash
# Flow control composed with what else decides when a job starts (pgjobd(8), "Flow
# control"), measured from the commands' side (make_limit_script), with two daemons that
# serve every queue, daemon a in lock mode transaction and b in lock mode lease:
#  - priority: under concurrency 1, the jobs start one at a time, by priority (then id);
#  - run_at: a rate with room never starts a job before its run_at;
#  - expires_at: a job that waits for a limit past its expiry never runs: it ends
#    cancelled, reason expired, with no attempt counted;
#  - pause: a paused queue with a limit starts nothing; resumed, it drains at its limit;
#  - fairness across groups: a group held back by its group rate holds back no other
#    group, also those whose jobs came after its backlog;
#  - the per-daemon `concurrency` binds below a global limit: two daemons of 2 slots run
#    at most 4 of a queue limited to 10, and reach 4;
#  - other queues are not slowed: a queue whose rate holds its backlog back leaves a
#    queue without limits, on the same daemons, to drain at once.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
make_limit_script "$T/lim.sh" "$T"
: >"$T/starts"

# cd: 2 slots a daemon (the per-daemon concurrency below a global limit); the others 4
queues() {
	local q
	for q in cp cr ce cq cg cd slow free; do
		printf '[queue.%s]\ncommand = exec /bin/bash %s\nconcurrency = %d\n\n' \
			"$q" "'$T/lim.sh'" "$([ "$q" = cd ] && echo 2 || echo 4)"
	done
}
start_daemons a b < <(queues)
# b: every queue in lock mode lease
sed -i '/^\[queue\./a lock_mode = lease\nlease = 5s' "$T/b.ini"
restart_daemon b
wait_until 30 "workers_alive 2" || bail_out "the two daemons did not register"

# started QUEUE: the job ids of QUEUE's commands, in the order they started (the lines
# are written under the script's lock).
started() { awk -v q="$1" '$1 == "start" && $2 == q { print $4 }' "$T/starts" | paste -sd' '; }
succeeded() { [ "$(count_jobs "queue = '$1' AND status <> 'succeeded'")" = 0 ]; }

# --- priority under concurrency 1: paused while the jobs go in, so that the first
# claim sees all of them
psql_q "SELECT pgjobd.pause('cp'), pgjobd.set_limits('cp', concurrency => 1)" >/dev/null
want=$(psql_q "WITH i AS (INSERT INTO pgjobd.jobs (queue, priority, data)
                          SELECT 'cp', p, '{\"sleep\": 0.2}' FROM unnest(ARRAY[5, 5, 1, 3, 0, 2]) p
                          RETURNING id, priority)
               SELECT string_agg(id::text, ' ' ORDER BY priority, id) FROM i")
psql_q "SELECT pgjobd.resume('cp')" >/dev/null
wait_until 60 "succeeded cp"
ok $? "priority: the 6 jobs succeeded"
is "$(started cp)" "$want" "priority under concurrency 1: the jobs started by priority, then id"
is "$(limit_max "$T/starts" cp)" 1 "priority under concurrency 1: one command at a time"

# --- run_at under a rate with room: the later job waits for its run_at, not the rate
psql_q "SELECT pgjobd.set_limits('cr', rate => '10/1s')" >/dev/null
late=$(psql_q "INSERT INTO pgjobd.jobs (queue, run_at, data)
               VALUES ('cr', now() + interval '2 s', '{\"sleep\": 0}') RETURNING id")
psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('cr', '{\"sleep\": 0}')" >/dev/null
wait_until 30 "succeeded cr"
ok $? "run_at: both jobs succeeded"
is "$(psql_q "SELECT (history->0->>'started_at')::timestamptz >= run_at
                FROM pgjobd.jobs WHERE id = $late")" t \
	"run_at under a rate: the job did not start before its run_at"
is "$(awk -v id="$late" '$1 == "start" && $4 == id' "$T/starts" | wc -l)" 1 \
	"run_at under a rate: its command ran once"

# --- expires_at while waiting for a limit: concurrency 1 held by a job of 3 s
psql_q "SELECT pgjobd.set_limits('ce', concurrency => 1)" >/dev/null
holder=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('ce', '{\"sleep\": 3}') RETURNING id")
wait_until 30 "[ \"\$(job_field $holder status)\" = running ]" || bail_out "the holder did not start"
exp=$(psql_q "INSERT INTO pgjobd.jobs (queue, expires_at, data)
              VALUES ('ce', now() + interval '1 s', '{\"sleep\": 0}') RETURNING id")
wait_until 30 "[ \"\$(job_field $exp status)\" = cancelled ]"
ok $? "expires_at under concurrency 1: the waiting job ended cancelled"
is "$(psql_q "SELECT error->>'reason', attempts FROM pgjobd.jobs WHERE id = $exp")" "expired|0" \
	"... reason expired, no attempt counted"
is "$(awk -v id="$exp" '$1 == "start" && $4 == id' "$T/starts" | wc -l)" 0 "... and its command never ran"
wait_until 30 "[ \"\$(job_field $holder status)\" = succeeded ]"
ok $? "expires_at: the job that held the limit succeeded"

# --- pause: nothing starts while paused; resumed, the queue drains at its limit
psql_q "SELECT pgjobd.pause('cq'), pgjobd.set_limits('cq', concurrency => 2)" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'cq', '{\"sleep\": 0.4}' FROM generate_series(1, 6)" >/dev/null
holds_for 2 "[ -z \"\$(started cq)\" ]"
ok $? "pause: a paused queue with a limit started nothing in 2 s"
psql_q "SELECT pgjobd.resume('cq')" >/dev/null
wait_until 60 "succeeded cq"
ok $? "pause: resumed, its 6 jobs succeeded"
is "$(limit_max "$T/starts" cq)" 2 "pause: resumed, at most 2 commands alive at once, and 2 reached"

# --- fairness across groups: group a's backlog comes first in id order, and its group
# rate allows one start an hour
psql_q "SELECT pgjobd.set_limits('cg', group_rate => '1/1h')" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 'cg', g, '{\"sleep\": 0}' FROM unnest(ARRAY['a', 'a', 'a', 'a', 'b', 'c']) WITH ORDINALITY u(g, n)
         ORDER BY n" >/dev/null
wait_until 30 "[ \$(count_jobs \"queue = 'cg' AND status = 'succeeded'\") = 3 ]"
ok $? "fairness: the first job of each of the groups a, b and c succeeded"
is "$(psql_q "SELECT string_agg(group_id || ':' || status, ' ' ORDER BY id) FROM pgjobd.jobs WHERE queue = 'cg'")" \
	"a:succeeded a:queued a:queued a:queued b:succeeded c:succeeded" \
	"fairness: group a's backlog, held by its group rate, held back neither b nor c"
is "$(count_jobs "queue = 'cg' AND status = 'queued' AND attempts <> 0")" 0 \
	"fairness: the jobs a group rate holds back count no attempt"
is "$(psql_q "SELECT throttled FROM pgjobd.queue_stats WHERE queue = 'cg'")" group_rate \
	"fairness: queue_stats says the group rate throttles the queue"
psql_q "SELECT pgjobd.set_limits('cg', group_rate => NULL)" >/dev/null
wait_until 30 "succeeded cg"
ok $? "fairness: the group rate removed, group a's backlog drained"

# --- the per-daemon concurrency below a global limit
psql_q "SELECT pgjobd.set_limits('cd', concurrency => 10)" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'cd', '{\"sleep\": 0.5}' FROM generate_series(1, 16)" >/dev/null
wait_until 60 "succeeded cd"
ok $? "per-daemon concurrency: the 16 jobs succeeded"
is "$(limit_max "$T/starts" cd)" 4 \
	"per-daemon concurrency 2 on two daemons under a global 10: at most 4 alive, and 4 reached"

# --- other queues are not slowed: slow's rate holds its backlog back
psql_q "SELECT pgjobd.set_limits('slow', rate => '1/1h')" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'slow', '{\"sleep\": 0}' FROM generate_series(1, 5)" >/dev/null
wait_until 30 "[ \$(count_jobs \"queue = 'slow' AND status = 'succeeded'\") = 1 ]" ||
	bail_out "slow's first job did not run"
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'free', '{\"sleep\": 0}' FROM generate_series(1, 40)" >/dev/null
wait_until 60 "succeeded free"
ok $? "other queues: the 40 jobs of a queue without limits succeeded beside a throttled one"
is "$(count_jobs "queue = 'slow' AND status = 'queued' AND attempts = 0")" 4 \
	"... while the throttled queue kept its 4 jobs queued, no attempt counted"
is "$(psql_q "SELECT throttled FROM pgjobd.queue_stats WHERE queue = 'slow'")" rate \
	"... and queue_stats says its rate throttles it"

for n in a b; do
	stop_daemon "${DAEMONS[$n]}"
	is $? 0 "daemon $n exits 0"
done
done_testing
