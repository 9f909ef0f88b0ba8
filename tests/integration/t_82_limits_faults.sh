#!/usr/bin/env bash
# Flow control under faults (pgjobd(8), "Flow control"; SPEC: a limit is never exceeded
# by commands actually running, under the faults of guarantee 1): three daemons, a
# through a TCP relay, serve four limited queues (concurrency 3 in transaction mode and
# in lease mode, group_concurrency 2, rate 10/4s) while the test
#  - kills daemon b with SIGKILL and starts it again,
#  - stops daemon c with SIGSTOP past its fence (fence_timeout 1 s), then SIGCONT,
#  - cuts daemon a off (the relay stopped) for 4 s, longer than the lease (3 s),
#  - restarts PostgreSQL.
# Measured from the commands' side (make_limit_script): never more commands of a queue
# (of a group) alive at once than its limit, no window of 4 s with more than 10 starts of
# the rate's queue, and every job succeeded in the end.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start_relayed
make_limit_script "$T/lim.sh" "$T"
: >"$T/starts"

body=$(
	cat <<EOF
[queue.fc]
command = exec /bin/bash '$T/lim.sh'
concurrency = 6
max_attempts = 10
backoff = 100ms
backoff_max = 100ms
kill_grace = 200ms

[queue.fl]
command = exec /bin/bash '$T/lim.sh'
concurrency = 6
lock_mode = lease
lease = 3s
max_attempts = 10
backoff = 100ms
backoff_max = 100ms
kill_grace = 200ms

[queue.fg]
command = exec /bin/bash '$T/lim.sh'
concurrency = 6
max_attempts = 10
backoff = 100ms
backoff_max = 100ms
kill_grace = 200ms

[queue.fr]
command = exec /bin/bash '$T/lim.sh'
concurrency = 6
max_attempts = 10
backoff = 100ms
backoff_max = 100ms
kill_grace = 200ms
EOF
)
printf '%s\n\n%s\n' "$(conf_header fence_timeout=1s "database=host=127.0.0.1 port=$RELAY_PORT dbname=$PGDATABASE user=postgres")" "$body" >"$T/a.ini"
for n in b c; do
	printf '%s\n\n%s\n' "$(conf_header fence_timeout=1s)" "$body" >"$T/$n.ini"
done
pgjobd_migrate "$T/b.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
for n in a b c; do
	start_daemon "$n" "$T/$n.ini"
	DAEMONS[$n]=$DAEMON_PID
done
psql_q "SELECT pgjobd.set_limits('fc', concurrency => 3), pgjobd.set_limits('fl', concurrency => 3),
               pgjobd.set_limits('fg', group_concurrency => 2), pgjobd.set_limits('fr', rate => '10/4s')" >/dev/null
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT q, '{\"sleep\": 0.7}'
          FROM unnest(ARRAY['fc', 'fl']) q, generate_series(1, 40);
        INSERT INTO pgjobd.jobs (queue, group_id, data)
        SELECT 'fg', 'g' || g, '{\"sleep\": 0.5}'::jsonb FROM generate_series(1, 3) g, generate_series(1, 14) ORDER BY 2, 3;
        INSERT INTO pgjobd.jobs (queue, data) SELECT 'fr', '{\"sleep\": 0.05}' FROM generate_series(1, 60)"
is "$(psql_q "SELECT string_agg(queue || ' ' || n, ', ' ORDER BY queue)
                FROM (SELECT queue, count(*) n FROM pgjobd.jobs GROUP BY 1) s")" \
	"fc 40, fg 42, fl 40, fr 60" "182 jobs queued"
t0=$(now_ms)
at() { while [ $(($(now_ms) - t0)) -lt "$1" ]; do sleep 0.05; done; }

at 2000
kill -KILL "${DAEMONS[b]}"
wait "${DAEMONS[b]}" 2>/dev/null
forget_daemon "${DAEMONS[b]}"
note "b killed with SIGKILL"
sleep 0.5
start_daemon b "$T/b.ini"
DAEMONS[b]=$DAEMON_PID

at 4000
kill -STOP "${DAEMONS[c]}"
note "c stopped"
at 7000
kill -CONT "${DAEMONS[c]}"
note "c continued"

at 8000
kill -STOP "$RELAY"
note "a cut off"
at 12000
kill -CONT "$RELAY"
note "a reachable again"

at 14000
pg_restart
ok $? "PostgreSQL restarted"

wait_until 120 "[ \$(count_jobs \"status <> 'succeeded'\") = 0 ]"
ok $? "every job succeeded" || diag "$(psql_q "SELECT queue, status, count(*) FROM pgjobd.jobs GROUP BY 1, 2")"
note "the run took $(($(now_ms) - t0)) ms"
is "$(limit_max "$T/starts" fc)" 3 "concurrency 3, transaction mode: at most 3 commands alive at once, 3 reached"
is "$(limit_max "$T/starts" fl)" 3 "concurrency 3, lease mode: at most 3 commands alive at once, 3 reached"
is "$(limit_max "$T/starts" fg group)" 2 "group_concurrency 2: at most 2 commands of a group alive at once, 2 reached"
w=$(rate_worst "$T/starts" fr 4000)
ok "$([ "$w" -le 10 ] && [ "$w" -ge 8 ]; echo $?)" "rate 10/4s: at most 10 starts in any 4 s by the commands' stamps, 8 or more reached ($w)"
note "attempts: $(psql_q "SELECT string_agg(queue || ' ' || n || '×' || attempts, ', ')
                         FROM (SELECT queue, attempts, count(*) n FROM pgjobd.jobs GROUP BY 1, 2 ORDER BY 1, 2) s")"
is "$(psql_q "SELECT count(*) FROM (SELECT group_id, array_agg(id ORDER BY id) a,
                                          array_agg(id ORDER BY (history->0->>'started_at')::timestamptz, id) b
                                     FROM pgjobd.jobs WHERE queue = 'fg' GROUP BY group_id) s WHERE a <> b")" 0 \
	"group concurrency: each group's jobs made their first attempts in id order"
done_testing
