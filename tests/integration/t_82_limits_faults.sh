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
# the rate's queue (by when pgjobd started the commands), each group's jobs first claimed
# in id order, and every job succeeded in the end.
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
# Every committed claim of a grouped job, with its fence, as the server saw it: also a
# claim whose command never started, and one whose daemon was killed before it read the
# answer (neither leaves a history entry).
psql_q "CREATE TABLE public.claims (id bigint, group_id text, fence bigint);
        CREATE FUNCTION public.claims_add() RETURNS trigger LANGUAGE plpgsql AS
          \$\$BEGIN INSERT INTO public.claims VALUES (NEW.id, NEW.group_id, NEW.fence); RETURN NULL; END\$\$;
        CREATE TRIGGER claims_add AFTER UPDATE ON pgjobd.jobs FOR EACH ROW
          WHEN (NEW.group_id IS NOT NULL AND NEW.status = 'running' AND NEW.fence IS DISTINCT FROM OLD.fence)
          EXECUTE FUNCTION public.claims_add()" >/dev/null || bail_out "cannot add the claims trigger"
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
ok $? "every job succeeded" || diag "$(psql_q "SELECT queue, status, count(*) FROM pgjobd.jobs GROUP BY 1, 2")
$(psql_q "SELECT id, queue, status, attempts, error->>'reason',
                 (SELECT string_agg(concat_ws(' ', h->>'worker', h->>'started_at', h->>'finished_at', h->>'reason',
                                              h->>'signal'), '; ')
                    FROM jsonb_array_elements(history) h)
            FROM pgjobd.jobs WHERE status <> 'succeeded' ORDER BY id")"
note "the run took $(($(now_ms) - t0)) ms"
is "$(limit_max "$T/starts" fc)" 3 "concurrency 3, transaction mode: at most 3 commands alive at once, 3 reached"
is "$(limit_max "$T/starts" fl)" 3 "concurrency 3, lease mode: at most 3 commands alive at once, 3 reached"
is "$(limit_max "$T/starts" fg group)" 2 "group_concurrency 2: at most 2 commands of a group alive at once, 2 reached"
# The rate by when pgjobd started the commands (the kernel's start times of their
# processes). Their own stamps come later by however long a command takes to reach its
# first instruction, which a starved host (this file among seven others under the
# sanitizers) stretched to 100 ms for one start in sixteen runs: its window held 11
# stamps while the daemons' starts were 4.1 s apart. t_82_limits checks the commands'
# own stamps on a host that is only busy.
w=$(rate_worst "$T/starts" fr 4000 spawn)
ok "$([ "$w" -le 10 ] && [ "$w" -ge 8 ]; echo $?)" "rate 10/4s: at most 10 starts in any 4 s by when pgjobd started the commands, 8 or more reached ($w)"
note "by the commands' own stamps: at most $(rate_worst "$T/starts" fr 4000) starts in 4 s"
note "attempts: $(psql_q "SELECT string_agg(queue || ' ' || n || '×' || attempts, ', ')
                         FROM (SELECT queue, attempts, count(*) n FROM pgjobd.jobs GROUP BY 1, 2 ORDER BY 1, 2) s")"
# Group order under group_concurrency 2 is the order of the claims: a group's jobs are
# first claimed in id order (the fence counts the group's claims). A claim whose command
# could not start (its daemon could not confirm its claims in time: stopped, cut off, or
# only slow) gives the job back, not an attempt, to be claimed again first; a later job
# claimed meanwhile may have started by then, so the first *attempts* need not be in id
# order.
is "$(psql_q "SELECT string_agg(format('job %s of %s first claimed (fence %s) before job %s (fence %s)',
                                       id, group_id, f, prev, prev_f), '; ')
                FROM (SELECT id, group_id, f, lag(id) OVER w prev, lag(f) OVER w prev_f
                        FROM (SELECT j.id, j.group_id, min(c.fence) f
                                FROM pgjobd.jobs j LEFT JOIN public.claims c ON c.id = j.id
                               WHERE j.queue = 'fg' GROUP BY 1, 2) s
                      WINDOW w AS (PARTITION BY group_id ORDER BY id)) s
               WHERE f IS NULL OR f < prev_f")" "" \
	"group concurrency 2: each group's jobs were first claimed in id order (by their fences)"
note "first attempts after a later job's of their group (its claim given back unstarted): $(
	psql_q "WITH f AS (SELECT id, group_id, (history->0->>'started_at')::timestamptz t
	                     FROM pgjobd.jobs WHERE queue = 'fg')
	        SELECT count(*) FROM f a JOIN f b ON a.group_id = b.group_id AND a.id < b.id AND a.t > b.t")"
done_testing
