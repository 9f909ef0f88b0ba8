#!/usr/bin/env bash
# Retention (pgjobd(8) "Observing", sql/003_job_control.sql pgjobd.maintain()): finished
# jobs older than their queue's `retention` are deleted by the daemons, in batches of at
# most 500, one daemon at a time; only what is old AND finished goes: younger finished
# jobs, queued jobs, jobs of a queue with `retention = 0` and of a queue no daemon serves
# stay. Group rows of groups with nothing left to run go with their jobs, and come back
# when a job is enqueued into the group again. A running job is not disturbed. Two
# daemons on one database delete everything between them without fighting: neither
# deletes while another session holds the maintenance lock (the row of
# pgjobd.maintenance_lock), neither waits for it, and pgrowlocks never shows it held by
# both.
#
# `short` has retention = 1h: "old" rows finished 61 min or more ago, "young" ones 50 to
# 59 min ago, so that a wrong unit or an ignored retention is caught either way.
. "$(dirname "$0")/lib.sh"
require_pgjobd

# Its own server: the test holds pgjobd.maintenance_lock and samples pg_stat_activity
# and pgrowlocks across the server.
own_cluster
pg_start

cat >"$T/job.sh" <<EOF
if [ -n "\${PGJOBD_ARG_gate:-}" ]; then
	while [ ! -e '$T/go' ]; do sleep 0.05; done
fi
echo "ran \$PGJOBD_JOB_ID"
EOF
for n in a b; do
	write_conf "$T/$n.ini" <<EOF
$(conf_header)

[queue.short]
command = /bin/sh '$T/job.sh'
retention = 1h
concurrency = 3

[queue.keep]
command = /bin/sh '$T/job.sh'
retention = 0
EOF
done
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

OLD_SHORT="queue = 'short' AND status IN ('succeeded', 'failed', 'cancelled') AND finished_at < now() - interval '1 hour'"

# old_rows QUEUE N [GROUP_EXPR]: N finished rows, 61 minutes to 2 hours old, of the
# three final statuses in turn.
old_rows() {
	echo "INSERT INTO pgjobd.jobs (queue, group_id, status, attempts, result, error, created_at,
	                              run_at, started_at, finished_at, updated_at)
	      SELECT '$1', ${3:-NULL}, (ARRAY['succeeded', 'failed', 'cancelled'])[1 + g % 3], 1,
	             '{\"old\": true}', NULL, now() - interval '1 day', now() - interval '1 day',
	             now() - interval '1 day', now() - interval '61 minutes' - g * interval '1 second',
	             now() - interval '61 minutes'
	        FROM generate_series(1, $2) g;"
}

# Rows of the queue with retention = 0 and of a queue no daemon serves, old and finished.
psql_q "$(old_rows keep 100) $(old_rows other 100)"

# A job that runs (until $T/go exists) through the maintenance passes below.
G=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('short', '{\"gate\": 1}') RETURNING id")
start_daemon a "$T/a.ini"
a=$DAEMON_PID
wait_until 20 "[ \"\$(job_field $G status)\" = running ]"
ok $? "a long job of queue short is running"

# ---------------------------------------------------------------- one daemon
# One transaction, the counts included: the daemon's maintenance pass (every second) sees
# the rows and their groups' rows together, and none of them before they are counted.
counted=$(psql_q "
BEGIN;
$(old_rows short 1200)
-- Groups whose jobs are all finished and old (3 jobs each).
$(old_rows short 15 "'gdone-' || (g % 5)")
-- A group with old finished jobs and a job still to run.
$(old_rows short 2 "'gbusy'")
INSERT INTO pgjobd.jobs (queue, group_id, created_at, run_at)
     VALUES ('short', 'gbusy', now() - interval '1 day', now() + interval '1 day');
-- Young finished rows: 50 to 59 minutes old.
INSERT INTO pgjobd.jobs (queue, status, attempts, created_at, run_at, started_at, finished_at)
     SELECT 'short', (ARRAY['succeeded', 'failed', 'cancelled'])[1 + g % 3], 1,
            now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
            now() - interval '50 minutes' - g * interval '10 seconds'
       FROM generate_series(1, 50) g;
-- Queued rows, created long ago, not due (some with a stale finished_at).
INSERT INTO pgjobd.jobs (queue, created_at, run_at, finished_at)
     SELECT 'short', now() - interval '2 days', now() + interval '1 day',
            CASE WHEN g <= 5 THEN now() - interval '1 day' END
       FROM generate_series(1, 20) g;
-- Group rows are created by the first claim of a group (not by the INSERT):
-- these stand for the rows those groups' claims left behind.
INSERT INTO pgjobd.groups (queue, group_id)
     SELECT 'short', g FROM unnest(ARRAY['gdone-0', 'gdone-1', 'gdone-2', 'gdone-3',
                                         'gdone-4', 'gbusy']) g;
SELECT string_agg(status || ':' || n, ' ' ORDER BY status)
  FROM (SELECT status, count(*) n FROM pgjobd.jobs WHERE $OLD_SHORT GROUP BY status) s;
SELECT count(*) FROM pgjobd.groups
 WHERE queue = 'short' AND (group_id LIKE 'gdone-%' OR group_id = 'gbusy');
COMMIT;
")
ok $? "inserted 1217 old finished rows in short (17 grouped), 50 young ones, 21 queued ones"
is "$(sed -n 1p <<<"$counted")" "cancelled:406 failed:406 succeeded:405" \
	"the old rows cover all three final statuses"
is "$(sed -n 2p <<<"$counted")" 6 "the 6 groups have their lock rows"

wait_until 30 "[ \"\$(count_jobs \"$OLD_SHORT\")\" = 0 ]"
ok $? "every old finished row of short is deleted"
is "$(count_jobs "queue = 'short' AND status IN ('succeeded', 'failed', 'cancelled')")" 50 \
	"the 50 young finished rows of short remain"
is "$(count_jobs "queue = 'short' AND status = 'queued'")" 21 \
	"the 21 queued rows of short remain (also those with an old finished_at)"
is "$(job_field "$G" "status || ' ' || attempts || ' ' || (error IS NULL)")" "running 1 true" \
	"the running job is still running, attempt 1"
is "$(count_jobs "queue = 'keep'")" 100 "the old rows of queue keep (retention = 0) remain"
is "$(count_jobs "queue = 'other'")" 100 "the old rows of queue other (served by no daemon) remain"
is "$(psql_q "SELECT coalesce(string_agg(group_id, ' ' ORDER BY group_id), '-') FROM pgjobd.groups WHERE queue = 'short'")" \
	"gbusy" "the group rows of groups with nothing left to run are gone; gbusy's stays"

grep 'msg="finished jobs deleted after their retention"' "$T/a.log" >"$T/a.deleted"
counts=$(sed -n 's/.* count=\([0-9]*\).*/\1/p' "$T/a.deleted" | tr '\n' ' ')
note "deletion batches logged by daemon a: $counts"
cmp_ok "$(wc -l <"$T/a.deleted")" -ge 3 "the daemon logs the deletion, in at least 3 batches"
is "$(awk '{ s += $1 } END { print s + 0 }' <<<"${counts// /$'\n'}")" 1217 "the logged counts add up to 1217"
is "$(awk '$1 > 500 { n++ } END { print n + 0 }' <<<"${counts// /$'\n'}")" 0 "no batch is larger than 500"

touch "$T/go"
wait_until 20 "[ \"\$(job_field $G status)\" = succeeded ]"
ok $? "the job that ran through the maintenance passes succeeds"
is "$(job_field "$G" "attempts || ' ' || (error IS NULL) || ' ' || (result->>'stdout')")" "1 true ran $G" \
	"in one attempt, with its own output"

# A job enqueued into a group whose row was deleted runs: its claim creates
# the row again.
N=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('short', 'gdone-1') RETURNING id")
wait_until 20 "[ \"\$(job_field $N status)\" = succeeded ]"
ok $? "a new job in group gdone-1, whose row was deleted, runs and succeeds"

# ---------------------------------------------------------------- two daemons
start_daemon b "$T/b.ini"
b=$DAEMON_PID
MAINT="SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobd maintenance'"
wait_until 20 "[ \"\$(psql_q \"$MAINT\")\" = 2 ]"
ok $? "both daemons' maintenance sessions are connected"

# Another session takes the maintenance lock (the row of pgjobd.maintenance_lock) and
# keeps it: while it does, no daemon may delete anything, and none may wait for the
# lock. pgrowlocks tells who holds a row lock; a session waiting for a lock waits
# with wait_event_type Lock.
psql_q "CREATE EXTENSION IF NOT EXISTS pgrowlocks" >/dev/null || bail_out "pgrowlocks is not available"
mkfifo "$T/locker.fifo"
PGAPPNAME=t79-locker psql -X -qAt -v ON_ERROR_STOP=1 <"$T/locker.fifo" >"$T/locker.out" 2>&1 &
locker=$!
echo "$locker" >"$T/locker.pid"
exec 8>"$T/locker.fifo"
echo "BEGIN; SELECT one FROM pgjobd.maintenance_lock FOR UPDATE;" >&8
HOLDERS="FROM pgrowlocks('pgjobd.maintenance_lock') r JOIN pg_stat_activity a ON a.pid = ANY(r.pids)"
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) $HOLDERS WHERE a.application_name = 't79-locker'\")\" = 1 ]"
ok $? "a test session holds the maintenance lock"

psql_q "$(old_rows short 2000) $(old_rows short 1000 "'bulk-' || (g % 40)")
        INSERT INTO pgjobd.jobs (queue, data) SELECT 'short', jsonb_build_object('batch', 3) FROM generate_series(1, 20);"
ok $? "inserted 3000 more old finished rows in short (1000 in 40 groups), and 20 new jobs"
t_ins=$(psql_q "SELECT clock_timestamp()")
# Each daemon's maintenance session starts a pass every second: a statement of it that
# began over 1.1 s after the insert belongs to a pass that began after the insert.
wait_until 20 "[ \"\$(psql_q \"$MAINT AND query_start > '$t_ins'::timestamptz + interval '1.1 s'\")\" = 2 ]"
ok $? "both daemons ran maintenance passes since"
is "$(count_jobs "$OLD_SHORT")" 3000 "nothing was deleted while another session held the maintenance lock"
is "$(psql_q "$MAINT AND wait_event_type = 'Lock'")" 0 "no daemon waits for the maintenance lock (SKIP LOCKED)"
wait_until 20 "[ \"\$(count_jobs \"queue = 'short' AND data ? 'batch' AND status = 'succeeded' AND attempts = 1\")\" = 20 ]"
ok $? "the 20 new jobs ran meanwhile and succeeded, each in one attempt"

# Sample the lock's holders while the two daemons delete: the maintenance lock is never
# held by both maintenance sessions at once, and neither maintenance session waits for
# the other (a session that waits for a row lock waits for its holder's transaction id,
# and pg_locks shows that). The sampler starts while the test session still holds the
# lock, and the test releases it only once the sampler saw that holder (the query sees a
# hold); the sampler also counts the 3000 old rows when it starts (it watched the whole
# deletion). A daemon's hold lasts one short batch, which a sampler descheduled on a
# loaded machine can miss, so `held` is reported only.
PGAPPNAME=t79-sampler psql -X -qAt -v ON_ERROR_STOP=1 >"$T/sampler.out" 2>&1 8>&- <<EOF &
DO \$\$
DECLARE
    maint int[] := ARRAY(SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobd maintenance'
                          AND datname = current_database());
    first int[] := maint;
    held int;
    other int;
    others int := 0;
    rows0 bigint := (SELECT count(*) FROM pgjobd.jobs WHERE $OLD_SHORT);
    waiting int;
    samples int := 0;
    seen int := 0;
    n_both int := 0;
    waits int := 0;
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. 10000000 LOOP
        -- A maintenance session that reconnected has a new pid.
        IF i % 20 = 0 THEN
            maint := ARRAY(SELECT pid FROM pg_stat_activity WHERE application_name = 'pgjobd maintenance'
                            AND datname = current_database());
        END IF;
        SELECT count(DISTINCT p) FILTER (WHERE p = ANY(maint)),
               count(DISTINCT p) FILTER (WHERE p <> ALL(maint))
          INTO held, other
          FROM pgrowlocks('pgjobd.maintenance_lock') r, unnest(r.pids) p;
        SELECT count(*) INTO waiting
          FROM pg_locks l JOIN pg_locks h ON h.locktype = 'transactionid'
                                         AND h.transactionid = l.transactionid AND h.granted
         WHERE l.locktype = 'transactionid' AND NOT l.granted
           AND l.pid = ANY(maint) AND h.pid = ANY(maint);
        samples := samples + 1;
        IF held >= 1 THEN seen := seen + 1; END IF;
        IF held >= 2 THEN n_both := n_both + 1; END IF;
        IF waiting > 0 THEN waits := waits + 1; END IF;
        IF other >= 1 THEN
            others := others + 1;
            -- The test releases its hold once it sees this.
            IF others = 1 THEN
                PERFORM set_config('application_name', 't79-sampler-ready', false);
            END IF;
        END IF;
        EXIT WHEN i % 20 = 0 AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs WHERE $OLD_SHORT);
        EXIT WHEN clock_timestamp() > t0 + interval '25 s';
    END LOOP;
    RAISE NOTICE 'sessions=% samples=% both=% waits=% locker=% rows0=% held=%', cardinality(maint),
        samples, n_both, waits, others, rows0, seen;
    RAISE NOTICE 'pids at the start % and at the end %', first, maint;
END
\$\$;
EOF
sampler=$!
echo "$sampler" >"$T/sampler.pid"
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE application_name = 't79-sampler-ready' AND state = 'active'\")\" = 1 ]"
ok $? "the lock sampler runs, and saw the test's hold"

# Release the lock: the locker's psql reads EOF and ends its session.
exec 8>&-
wait_until 20 "! pid_alive $locker"
ok $? "the test session released the maintenance lock"
wait "$locker"

wait_until 30 "[ \"\$(count_jobs \"$OLD_SHORT\")\" = 0 ]"
ok $? "then every one of the 3000 old rows is deleted"
wait_until 30 "! pid_alive $sampler"
ok $? "the lock sampler finished"
wait "$sampler"
sampled=$(grep -o 'sessions=.*' "$T/sampler.out")
note "lock sampler: $sampled"
like "$sampled" '^sessions=2 samples=[0-9]+ both=0 waits=0 locker=[1-9][0-9]* rows0=3000 held=[0-9]+$' \
	"the sampler, which saw the test's hold and all 3000 rows at its start, never saw the lock held by both daemons at once, nor waited for" ||
	diag "$(cat "$T/sampler.out")"
is "$(psql_q "SELECT count(*) FROM pgjobd.groups WHERE queue = 'short' AND group_id LIKE 'bulk-%'")" 0 \
	"the 40 bulk groups' rows are gone"
is "$(count_jobs "queue = 'short' AND status IN ('succeeded', 'failed', 'cancelled')")" 72 \
	"the young finished rows remain (50, plus the 22 jobs run here)"
is "$(count_jobs "queue = 'short' AND status = 'queued'")" 21 "the queued rows remain"
is "$(count_jobs "queue IN ('keep', 'other')")" 200 "the rows of keep and other remain"

for n in a b; do
	grep 'msg="finished jobs deleted after their retention"' "$T/$n.log" |
		sed -n 's/.* count=\([0-9]*\).*/\1/p' | tr '\n' ' '
	echo
done >"$T/counts"
note "deletion batches: daemon a: $(sed -n 1p "$T/counts")| daemon b: $(sed -n 2p "$T/counts")"
is "$(tr ' ' '\n' <"$T/counts" | awk 'NF { s += $1; if ($1 > 500) big++ } END { print s + 0, big + 0 }')" "4217 0" \
	"the two daemons' logged deletions add up to 4217 (each row once), no batch over 500"
is "$(cat "$T/a.log" "$T/b.log" | grep -c 'maintenance pass failed')" 0 "no maintenance pass failed"
is "$(cat "$T/a.log" "$T/b.log" | grep -c 'level=error')" 0 "neither daemon logged an error"
pid_alive "$a" && pid_alive "$b"
ok $? "both daemons are still running"
stop_daemon "$b"
is $? 0 "daemon b exits 0 on SIGTERM"
stop_daemon "$a"
is $? 0 "daemon a exits 0 on SIGTERM"

done_testing
