#!/usr/bin/env bash
# Flow control enforced (pgjobd(8), "Flow control"), measured from the commands' side
# (make_limit_script: each command counts, under flock, the commands of its queue and
# of its group alive at its start, and stamps its start): three daemons, each with more
# slots than the limits allow,
#  - concurrency 4 on a transaction-mode queue, 3 on a lease-mode one, and 3 on a queue
#    that a transaction-mode and a lease-mode daemon serve at once: never more commands
#    alive at once than the limit, the limit reached, every job succeeded at attempt 1;
#  - group_concurrency 3: never more than 3 of a group at once, 3 reached; a group's
#    jobs start in id order; a job waiting for its retry holds its group back (no job of
#    its group starts between its failed attempt and its retry);
#  - rate 20/4s: no window of 4 s holds more than 20 starts by the commands' stamps; the
#    rate reached is at least 3.5/s; no start counted as an attempt twice;
#  - group_rate 2/4s: the same per group;
# (Periods of 4 s: a planned start may come late by a fifth of 2.5 % of the period,
# here 20 ms; a start that would come later moves the rate on first (t_82_limits_late.sh).
# tests/bench/README has the rates' accuracy with periods of a second.)
#  - maintain() deletes the group rates' past states;
#  - a raised limit is used at once (set_limits' NOTIFY), not at the poll;
#  - a changed rate and group rate take their state along: raised from 1/1d to 10/1s,
#    the next start does not wait out the day; lowered, it is the new spacing after the
#    last; removed, no state is left.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
make_limit_script "$T/lim.sh" "$T"
: >"$T/starts"

cat >"$T/queues" <<EOF
[queue.lc]
command = exec /bin/bash '$T/lim.sh'
concurrency = 8

[queue.ll]
command = exec /bin/bash '$T/lim.sh'
concurrency = 8
lock_mode = lease
lease = 5s

[queue.lg]
command = exec /bin/bash '$T/lim.sh'
concurrency = 8
backoff = 1s
backoff_max = 1s

[queue.lr]
command = exec /bin/bash '$T/lim.sh'
concurrency = 8

[queue.lgr]
command = exec /bin/bash '$T/lim.sh'
concurrency = 8
lock_mode = lease
EOF
# lm: transaction mode in a and c, lease mode in b.
start_daemons a b c <<EOF
$(cat "$T/queues")

[queue.lm]
command = exec /bin/bash '$T/lim.sh'
concurrency = 4
EOF
sed -i '/^\[queue.lm\]/a lock_mode = lease' "$T/b.ini"
restart_daemon b

psql_q "SELECT pgjobd.set_limits('lc', concurrency => 4), pgjobd.set_limits('ll', concurrency => 3),
               pgjobd.set_limits('lm', concurrency => 3), pgjobd.set_limits('lg', group_concurrency => 3),
               pgjobd.set_limits('lr', rate => '20/4s'), pgjobd.set_limits('lgr', group_rate => '2/4s')" >/dev/null

# --- concurrency (0.4 s a job: long enough that the limit is reached also on a starved
# host; at 0.2 s, eight copies of this file at once saw at most 3 of 4 alive in one run)
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT q, '{\"sleep\": 0.4}'
          FROM unnest(ARRAY['lc', 'll', 'lm']) q, generate_series(1, 48)"
wait_until 120 "[ \$(count_jobs \"queue IN ('lc', 'll', 'lm') AND status <> 'succeeded'\") = 0 ]"
ok $? "concurrency: all 144 jobs succeeded" ||
	diag "$(psql_q "SELECT queue, status, count(*) FROM pgjobd.jobs GROUP BY 1, 2")"
for ql in lc:4 ll:3 lm:3; do
	q=${ql%:*} lim=${ql#*:}
	is "$(limit_max "$T/starts" "$q")" "$lim" "concurrency $lim on queue $q: at most $lim commands alive at once, and $lim reached"
done
is "$(count_jobs "queue IN ('lc', 'll', 'lm') AND attempts <> 1")" 0 "concurrency: every job ran once"
is "$(awk '$1 == "start" && $2 == "lm"' "$T/starts" | wc -l)" 48 "the queue both lock modes serve ran each job once"

# --- group concurrency: 6 groups of 8; in group g0 the third job fails its first attempt
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 'lg', 'g' || g, CASE WHEN g = 0 AND i = 3 THEN '{\"sleep\": 0.3, \"fail_attempts\": 1}'
                                    ELSE '{\"sleep\": 0.3}' END::jsonb
          FROM generate_series(0, 5) g, generate_series(1, 8) i ORDER BY g, i" >/dev/null
wait_until 120 "[ \$(count_jobs \"queue = 'lg' AND status <> 'succeeded'\") = 0 ]"
ok $? "group concurrency: all 48 jobs succeeded"
is "$(limit_max "$T/starts" lg group)" 3 "group_concurrency 3: at most 3 commands of a group alive at once, and 3 reached"
is "$(psql_q "SELECT count(*) FROM (SELECT group_id, array_agg(id ORDER BY id) a,
                                          array_agg(id ORDER BY (history->0->>'started_at')::timestamptz, id) b
                                     FROM pgjobd.jobs WHERE queue = 'lg' GROUP BY group_id) s WHERE a <> b")" 0 \
	"group concurrency: each group's jobs started in id order"
# (A claim that ran while the failed attempt's outcome was being committed saw that job
# still running, rightly under group_concurrency 3: the check starts 250 ms after the
# attempt's end, and the retry comes 1 s after it.)
failed=$(psql_q "SELECT id FROM pgjobd.jobs WHERE queue = 'lg' AND attempts = 2")
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs j, pgjobd.jobs f
               WHERE f.id = '$failed' AND j.queue = 'lg' AND j.group_id = f.group_id AND j.id > f.id
                 AND (j.history->0->>'started_at')::timestamptz
                     > (f.history->0->>'finished_at')::timestamptz + interval '250 ms'
                 AND (j.history->0->>'started_at')::timestamptz < (f.history->1->>'started_at')::timestamptz")" 0 \
	"group concurrency: no job of a group starts while its earlier job waits for its retry"

# --- rate: 40 jobs at 20/4s over three daemons
t0=$(now_ms)
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'lr', '{\"sleep\": 0.05}' FROM generate_series(1, 40)"
wait_until 60 "[ \$(count_jobs \"queue = 'lr' AND status <> 'succeeded'\") = 0 ]"
ok $? "rate: all 40 jobs succeeded"
worst=$(rate_worst "$T/starts" lr 4000)
cmp_ok "$worst" -le 20 "rate 20/4s: at most 20 starts in any 4 s by the commands' stamps (worst: $worst)"
span=$(awk '$1 == "start" && $2 == "lr" { t = $6 / 1e6; if (!a || t < a) a = t; if (t > b) b = t } END { printf "%d", b - a }' "$T/starts")
rate=$(awk -v s="$span" 'BEGIN { printf "%.2f", 39 * 1000 / s }')
note "rate: 40 starts in $span ms: $rate/s; the run took $(($(now_ms) - t0)) ms"
cmp_ok "$(awk -v r="$rate" 'BEGIN { print (r >= 3.5) ? 1 : 0 }')" -eq 1 "rate 20/4s: at least 3.5/s reached ($rate/s)"
is "$(count_jobs "queue = 'lr' AND attempts <> 1")" 0 "rate: no job counted two attempts"

# --- group rate: 4 groups of 3 at 2/4s each
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 'lgr', 'r' || g, '{\"sleep\": 0.01}' FROM generate_series(1, 4) g, generate_series(1, 3) ORDER BY 1, 2" >/dev/null
wait_until 60 "[ \$(count_jobs \"queue = 'lgr' AND status <> 'succeeded'\") = 0 ]"
ok $? "group rate: all 12 jobs succeeded"
worst=$(rate_worst "$T/starts" lgr 4000 group)
cmp_ok "$worst" -le 2 "group_rate 2/4s: at most 2 starts of a group in any 4 s (worst: $worst)"
# Per group, not for the queue: in the first 4 s the four groups may start 8 jobs (2
# each), where a queue-wide 2/4s would allow 2.
first=$(awk '$1 == "start" && $2 == "lgr" { print $6 / 1e6 }' "$T/starts" | sort -n |
	awk 'NR == 1 { a = $1 } $1 - a < 4000 { n++ } END { print n + 0 }')
cmp_ok "$first" -ge 3 "group rate: per group, the groups run side by side ($first starts in the first 4 s; a queue-wide 2/4s allows 2)"

# maintain() deletes the group rates' states that have passed.
wait_until 10 "[ \$(psql_q 'SELECT count(*) FROM pgjobd.group_rates') = 0 ]"
ok $? "the group rates' past states are deleted"

# --- a raised limit is used at once: concurrency 1, then 4 (poll_interval 30 s)
stop_daemon "${DAEMONS[a]}" >/dev/null
stop_daemon "${DAEMONS[b]}" >/dev/null
stop_daemon "${DAEMONS[c]}" >/dev/null
sed -i 's/^poll_interval = .*/poll_interval = 30s/' "$T/a.ini"
start_daemon a "$T/a.ini"
psql_q "SELECT pgjobd.set_limits('lc', concurrency => 1)" >/dev/null
sleep 1
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'lc', '{\"sleep\": 30}' FROM generate_series(1, 4)"
wait_until 10 "[ \$(count_jobs \"queue = 'lc' AND status = 'running'\") = 1 ]"
ok $? "concurrency 1: one job runs"
holds_for 1 "[ \$(count_jobs \"queue = 'lc' AND status = 'running'\") = 1 ]"
ok $? "concurrency 1: the others wait"
psql_q "SELECT pgjobd.set_limits('lc', concurrency => 4)" >/dev/null
wait_until 3 "[ \$(count_jobs \"queue = 'lc' AND status = 'running'\") = 4 ]"
ok $? "raised to 4: four run within 3 s (poll_interval is 30 s)"
psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE queue = 'lc' AND status = 'queued'" >/dev/null

# --- a changed rate takes its state with it: 1/1d, then 10/1s (the state planned by
# 1/1d is a day away, and the second job would wait it out), then 1/1h, then none.
# (lr started jobs seconds ago: 1/1d set now would count them; removed first, its
# state goes.)
psql_q "SELECT pgjobd.set_limits('lr', rate => NULL)" >/dev/null
psql_q "SELECT pgjobd.set_limits('lr', rate => '1/1d'), pgjobd.set_limits('lgr', group_rate => '1/1d')" >/dev/null
m=$(psql_q "SELECT max(id) FROM pgjobd.jobs")
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'lr', '{\"sleep\": 0.01}' FROM generate_series(1, 2)" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) SELECT 'lgr', 'x', '{\"sleep\": 0.01}' FROM generate_series(1, 2)" >/dev/null
wait_until 10 "[ \$(count_jobs \"queue IN ('lr', 'lgr') AND id > $m AND status = 'succeeded'\") = 2 ]"
ok $? "rate 1/1d: the first job of the queue and of the group ran"
holds_for 1 "[ \$(count_jobs \"id > $m AND status = 'queued'\") = 2 ]"
ok $? "rate 1/1d: the second waits"
is "$(psql_q "SELECT (SELECT tat > now() + interval '23 hours' FROM pgjobd.queue_rates WHERE queue = 'lr')
                     || ' ' || (SELECT tat > now() + interval '23 hours' FROM pgjobd.group_rates
                                 WHERE queue = 'lgr' AND group_id = 'x')")" "true true" \
	"rate 1/1d: the next start allowed is a day away"
psql_q "SELECT pgjobd.set_limits('lr', rate => '10/1s'), pgjobd.set_limits('lgr', group_rate => '10/1s')" >/dev/null
wait_until 5 "[ \$(count_jobs \"id > $m AND status = 'succeeded'\") = 4 ]"
ok $? "raised to 10/1s: the second jobs run at once, not a day later"
psql_q "SELECT pgjobd.set_limits('lr', rate => '1/1h'), pgjobd.set_limits('lgr', group_rate => '1/1h')" >/dev/null
is "$(psql_q "SELECT (SELECT tat BETWEEN now() + interval '59 minutes' AND now() + interval '62 minutes'
                       FROM pgjobd.queue_rates WHERE queue = 'lr')
                     || ' ' || (SELECT tat BETWEEN now() + interval '59 minutes' AND now() + interval '62 minutes'
                                 FROM pgjobd.group_rates WHERE queue = 'lgr' AND group_id = 'x')")" "true true" \
	"lowered to 1/1h: the next start allowed is an hour after the last"
psql_q "SELECT pgjobd.set_limits('lr', rate => NULL), pgjobd.set_limits('lgr', group_rate => NULL)" >/dev/null
is "$(psql_q "SELECT (SELECT count(*) FROM pgjobd.queue_rates WHERE queue = 'lr')
                     + (SELECT count(*) FROM pgjobd.group_rates WHERE queue = 'lgr')")" 0 \
	"a removed rate leaves no state"
done_testing
