#!/usr/bin/env bash
# A rate's start made later than its plan allows (pgjobd(8), "Flow control"; sql/README,
# "Limits"): the daemon moves the rate on (pgjobd.rate_late) and starts the job, or, when
# a start a period on may have been planned already, gives the job back.
#  - rate_late itself: moves the queue's and the group's next allowed start on by the
#    shift; several starts in one call move each rate once, by the largest shift; a job
#    not running under that fencing token, or a start so late that the start a period on
#    may be planned, moves nothing and is refused;
#  - through the daemon, made late on purpose (a trigger of the test's own makes each
#    job's claim commit 300 ms after its plan): every job starts once, at attempt 1, the
#    daemon says it moved the rate on, and no window of the period holds more starts
#    than the rate by the commands' stamps, with one daemon or with three;
#  - made later than the period allows (2.5 s at 5/2s): the job is given back, its
#    attempt and its run_at as they were (its place in the queue), and runs later.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
make_limit_script "$T/lim.sh" "$T"
: >"$T/starts"

printf '%s\n\n[queue.late]\ncommand = exec /bin/bash %s\nconcurrency = 1\n' "$(conf_header)" "'$T/lim.sh'" >"$T/a.ini"
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# --- rate_late, called directly
psql_q "SELECT pgjobd.set_limits('q', rate => '5/2s', group_rate => '2/2s')" >/dev/null
J=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('q', 'g1') RETURNING id")
psql_q "UPDATE pgjobd.jobs SET status = 'running', fence = 77, attempts = 1 WHERE id = $J" >/dev/null
late() { # ENTRIES: rate_late's answer, "n:ok" space-separated
	psql_q "SELECT string_agg(n || ':' || ok, ' ' ORDER BY n) FROM pgjobd.rate_late('$1')"
}
NOW="(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
now_us() { psql_q "SELECT $NOW"; }
# since AT_US: the queue's and the group's next allowed start, in ms after AT_US
since() {
	psql_q "SELECT round(extract(epoch FROM r.tat - to_timestamp($1 / 1000000.0)) * 1000) || ' '
	               || coalesce(round(extract(epoch FROM t.tat - to_timestamp($1 / 1000000.0)) * 1000)::text, '-')
	          FROM pgjobd.queue_limits l
	          JOIN pgjobd.queue_rates r ON r.queue = l.queue
	          LEFT JOIN pgjobd.group_rates t ON t.queue = l.queue AND t.group_id = 'g1'
	         WHERE l.queue = 'q'"
}

# The rates' next starts move on from the start after the late one (the queue's one
# per (2 s + lag) / 5, the group's one per (2 s + lag) / 2), by the shift.
LAG=$(psql_q "SELECT extract(epoch FROM pgjobd.rate_lag('2 s')) * 1000")
TQ=$(awk -v l="$LAG" 'BEGIN { printf "%d", (2000 + l) / 5 + 0.5 }')
TG=$(awk -v l="$LAG" 'BEGIN { printf "%d", (2000 + l) / 2 + 0.5 }')
at=$(now_us)
is "$(late "[{\"id\": $J, \"fence\": 77, \"at_us\": $at, \"shift_us\": 300000}]")" "1:true" \
	"rate_late: a start 300 ms late is allowed"
is "$(since "$at")" "$((TQ + 300)) $((TG + 300))" "the queue's next start moved on to $TQ + 300 ms after it, the group's to $TG + 300"
is "$(late "[{\"id\": $J, \"fence\": 78, \"at_us\": $(now_us), \"shift_us\": 900000}]")" "1:false" \
	"rate_late: another fencing token is refused"
is "$(since "$at")" "$((TQ + 300)) $((TG + 300))" "... and moves nothing"
is "$(late "[{\"id\": $J, \"fence\": 77, \"at_us\": $(($(now_us) - 3000000)), \"shift_us\": 100000}]")" \
	"1:false" "rate_late: a start planned 3 s ago (2 s period) is refused: its next may be planned"
is "$(since "$at")" "$((TQ + 300)) $((TG + 300))" "... and moves nothing"

# Two late starts in one call: each rate moves once, by the larger shift.
at=$(now_us)
psql_q "UPDATE pgjobd.queue_rates SET tat = to_timestamp($at / 1000000.0) + interval '2 s';
        UPDATE pgjobd.group_rates SET tat = to_timestamp($at / 1000000.0) + interval '2 s'" >/dev/null
is "$(late "[{\"id\": $J, \"fence\": 77, \"at_us\": $at, \"shift_us\": 100000},
             {\"id\": $J, \"fence\": 77, \"at_us\": $at, \"shift_us\": 200000}]")" "1:true 2:true" \
	"rate_late: two late starts in one call"
is "$(since "$at")" "2200 2200" "the queue and the group moved on once, by the larger shift (not by 300 ms)"
psql_q "DELETE FROM pgjobd.jobs WHERE queue = 'q'; SELECT pgjobd.set_limits('q', rate => NULL, group_rate => NULL)" >/dev/null

# A group rate moved on while a claim plans (rate_late between the claim's read of the
# group's rate and its write): the claim's write checks the row as it locked it, and the
# job waits for a later claim. Here another session holds the row, moves it an hour on
# and commits while the claim waits for it.
psql_q "SELECT pgjobd.set_limits('q2', group_rate => '2/10s')" >/dev/null
WID=$(psql_q "SELECT pgjobd.register_worker('t82:1', 600000, '{q2}')")
J2=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('q2', 'g1') RETURNING id")
psql_q "INSERT INTO pgjobd.group_rates (queue, group_id, tat) VALUES ('q2', 'g1', now() - interval '1 minute')" >/dev/null
mkfifo "$T/mover"
psql -X -qAt -v ON_ERROR_STOP=1 <"$T/mover" >"$T/mover.out" 2>&1 &
echo $! >"$T/mover.pid"
exec {MOVER}>"$T/mover"
echo "BEGIN; SELECT 'locked' FROM pgjobd.group_rates WHERE queue = 'q2' AND group_id = 'g1' FOR UPDATE;" >&"$MOVER"
wait_until 10 "grep -q locked '$T/mover.out'" || bail_out "the row lock was not taken: $(cat "$T/mover.out")"
psql_q "SELECT count(job_id) FROM pgjobd.claim_batch('q2', $WID, '{s1}', 5, 0, 1048576, 1000, false, '{}', NULL)" \
	>"$T/claim.out" 2>&1 &
claim=$!
holds_for 1 "[ ! -s '$T/claim.out' ]"
ok $? "a claim of the group waits for its group rate's row"
echo "UPDATE pgjobd.group_rates SET tat = now() + interval '1 hour' WHERE queue = 'q2' AND group_id = 'g1'; COMMIT;" >&"$MOVER"
wait "$claim"
is "$(cat "$T/claim.out")" 0 "the row moved past its plan meanwhile: the claim starts nothing"
is "$(psql_q "SELECT status || ' ' || attempts FROM pgjobd.jobs WHERE id = $J2")
$(psql_q "SELECT tat > now() + interval '50 minutes' FROM pgjobd.group_rates WHERE queue = 'q2' AND group_id = 'g1'")" \
	"queued 0
t" "the job is still queued, no attempt counted, and the moved rate is kept"
exec {MOVER}>&-
psql_q "DELETE FROM pgjobd.jobs WHERE queue = 'q2'; SELECT pgjobd.set_limits('q2', group_rate => NULL)" >/dev/null

# --- through the daemon: each job's claim commits 300 ms after its plan (once per job).
# One slot per daemon: a claim sleeping in the trigger holds the queue's limits row, which
# a move waits for; with one slot the daemon's next claim comes after its job started.
psql_q "CREATE TABLE slowed (id bigint PRIMARY KEY, ms int);
        CREATE FUNCTION public.slow_claim() RETURNS trigger LANGUAGE plpgsql
            SET search_path = public, pg_catalog AS \$\$
        BEGIN
            INSERT INTO slowed (id, ms)
            SELECT NEW.id, coalesce((NEW.data->>'slow_ms')::int, 300) ON CONFLICT DO NOTHING;
            IF FOUND THEN
                PERFORM pg_sleep(coalesce((NEW.data->>'slow_ms')::int, 300) / 1000.0);
            END IF;
            RETURN NULL;
        END \$\$;
        CREATE TRIGGER slow_claim AFTER UPDATE OF status ON pgjobd.jobs FOR EACH ROW
            WHEN (NEW.status = 'running' AND NEW.queue = 'late') EXECUTE FUNCTION public.slow_claim();
        SELECT pgjobd.set_limits('late', rate => '5/2s')" >/dev/null
start_daemon a "$T/a.ini"
DAEMONS[a]=$DAEMON_PID
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'late', '{\"sleep\": 0.05}' FROM generate_series(1, 8)"
wait_until 60 "[ \$(count_jobs \"queue = 'late' AND status <> 'succeeded'\") = 0 ]"
ok $? "late starts: all 8 jobs succeeded"
is "$(count_jobs "queue = 'late' AND attempts <> 1")" 0 "late starts: each ran once, at attempt 1"
# (How many of the moves came back in time depends on the machine's load: a move that
# comes later than the daemon allowed for gives the job back, which then runs later.)
moved=$(grep -c 'rate moved on for a late start' "$T/a.log")
back=$(grep -c 'planned start missed' "$T/a.log")
note "late starts: $moved moves of the rate, $back given back"
started=$(grep 'rate moved on for a late start' "$T/a.log" | sed 's/.* job=\([0-9]*\) .*/\1/' | sort -u |
	while read -r j; do grep -q "planned start missed.* job=$j " "$T/a.log" || echo "$j"; done | wc -l)
cmp_ok "$started" -ge 1 "the daemon moved the rate on and started the late job ($started of 8)"
worst=$(rate_worst "$T/starts" late 2000)
cmp_ok "$worst" -le 5 "rate 5/2s with every claim 300 ms late: at most 5 starts in any 2 s by the commands' stamps (worst: $worst)"

# Three daemons, 30 jobs, the rate at 10/2s: still never more than the rate.
start_daemon b "$T/a.ini"
DAEMONS[b]=$DAEMON_PID
start_daemon c "$T/a.ini"
DAEMONS[c]=$DAEMON_PID
psql_q "SELECT pgjobd.set_limits('late', rate => '10/2s')" >/dev/null
: >"$T/starts"
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'late', '{\"sleep\": 0.05, \"slow_ms\": 150}' FROM generate_series(1, 30)"
wait_until 60 "[ \$(count_jobs \"queue = 'late' AND status <> 'succeeded'\") = 0 ]"
ok $? "three daemons, late starts: all 30 jobs succeeded"
worst=$(rate_worst "$T/starts" late 2000)
cmp_ok "$worst" -le 10 "rate 10/2s over three daemons, every claim 150 ms late: at most 10 starts in any 2 s (worst: $worst)"
is "$(count_jobs "queue = 'late' AND attempts <> 1")" 0 "three daemons: each job ran once, at attempt 1"

# --- later than the period allows: given back, its place kept
stop_daemon "${DAEMONS[b]}" >/dev/null
stop_daemon "${DAEMONS[c]}" >/dev/null
psql_q "SELECT pgjobd.set_limits('late', rate => '5/2s')" >/dev/null
J=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('late', '{\"sleep\": 0.05, \"slow_ms\": 2500}') RETURNING id")
run_at=$(psql_q "SELECT run_at FROM pgjobd.jobs WHERE id = $J")
wait_until 30 "[ \$(count_jobs \"id = $J AND status = 'succeeded'\") = 1 ]"
ok $? "a claim 2.5 s late (2 s period): the job succeeded in the end"
cmp_ok "$(grep -c "planned start missed; job given back.* job=$J " "$T/a.log")" -ge 1 \
	"... after it was given back once (its start a period on may have been planned)"
is "$(psql_q "SELECT attempts || ' ' || (run_at = '$run_at') FROM pgjobd.jobs WHERE id = $J")" "1 true" \
	"... at attempt 1, with the run_at it had (its place in the queue)"
done_testing
