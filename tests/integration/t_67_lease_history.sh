#!/usr/bin/env bash
# Lock mode lease, what every job gets whatever its lock mode: each attempt's entry in
# jobs.history written with its outcome (reason, exit code, stderr, and what only the
# daemon knows: cpu_ms, max_rss_kb, duration_ms), the tail of stdout in a failure's
# error, a final failure logged at warn and a retry as retry=true, log_output = journal
# (the command's lines as "job output" log lines), a retry woken on time (not by the
# poll), and a schedule's job sees PGJOBD_SCHEDULE and PGJOBD_SCHEDULED_FOR. The
# scheduler takes turns on the lease session: a tick is enqueued within a second of its
# time while lease-mode jobs run, and the daemon still has three sessions.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

write_conf "$T/a.ini" <<EOF
$(conf_header poll_interval=1h)

[queue.lh]
command = echo "out of \$PGJOBD_ATTEMPT"; echo "err of \$PGJOBD_ATTEMPT" >&2; echo "\$PGJOBD_JOB_ID|\${PGJOBD_SCHEDULE-unset}|\${PGJOBD_SCHEDULED_FOR-unset}" >>'$T/env.log'; [ "\$PGJOBD_ATTEMPT" -ge "\${PGJOBD_ARG_ok_at:-1}" ]
lock_mode = lease
lease = 3s
concurrency = 2
max_attempts = 3
backoff = 400ms
backoff_max = 400ms
log_output = journal

[queue.ls]
command = exec sleep 8
lock_mode = lease
lease = 3s
max_attempts = 1
EOF
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
# The schedules' clock: 6 s from now it is 2030-01-01T00:00:00Z, at real speed.
real0=$(date +%s.%N)
boundary=$(date -u -d 2030-01-01T00:00:00Z +%s)
start_daemon a "$T/a.ini" PGJOBD_TEST_CLOCK="$real0 $((boundary - 6)) 1"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"
wait_until 10 "queues_waiting lh ls" || bail_out "daemon a's claims did not register as waiting"
psql_q "SELECT pgjobd.schedule('every', '* * * * *', 'lh')" >/dev/null
# Runs across the tick: its lease is extended every second meanwhile.
l=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('ls') RETURNING id")

finished() { job_field "$1" "status IN ('succeeded', 'failed', 'cancelled')" | grep -qx t; }
# h ID N EXPR: EXPR over entry N (0-based) of job ID's history, as e
h() { psql_q "SELECT $3 FROM pgjobd.jobs j, LATERAL (SELECT j.history -> $2 AS e) x WHERE j.id = $1"; }

# A job that fails twice, then succeeds; one that fails for good. poll_interval is an
# hour, so only the retry's own wake-up can start the next attempts in time.
r=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('lh', '{\"ok_at\": 3}') RETURNING id")
f=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('lh', '{\"ok_at\": 9}') RETURNING id")
wait_until 20 "finished $r && finished $f"
ok $? "both jobs finish (the retries are woken without a poll)"
is "$(job_field "$r" "status || ' ' || attempts || ' ' || jsonb_array_length(history)")" \
	"succeeded 3 3" "exit, exit, success: three entries"
is "$(job_field "$r" "(SELECT string_agg(e->>'attempt' || ':' || (e->>'reason') || ':' || (e->>'exit_code'), ' '
                        ORDER BY n) FROM jsonb_array_elements(history) WITH ORDINALITY AS a(e, n))")" \
	"1:exit:1 2:exit:1 3:none:0" "each entry with its attempt, reason and exit code"
is "$(h "$r" 1 "e->>'stderr'")" "err of 2" "an entry keeps its attempt's stderr"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs j, jsonb_array_elements(j.history) e
               WHERE j.id IN ($r, $f) AND e->>'worker' LIKE '%:$A:lh.%'
                 AND (e->>'started_at')::timestamptz <= (e->>'finished_at')::timestamptz
                 AND (e->>'duration_ms')::int >= 0 AND (e->>'cpu_ms')::int >= 0
                 AND (e->>'max_rss_kb')::int > 0")" 6 \
	"every entry: worker, times, duration_ms, cpu_ms and max_rss_kb (the daemon's, from wait4)"
is "$(job_field "$f" "status || ' ' || attempts || ' ' || (error->>'reason') || ' ' || (error->>'stdout')")" \
	"failed 3 exit out of 3" "a final failure keeps the tail of its stdout in error"
grep -q "level=warn msg=\"job finished\" status=failed reason=exit exit_code=1 ms=[0-9]* job=$f " "$T/a.log"
ok $? "the final failure is logged at warn"
grep -q "level=info msg=\"job finished\" status=queued reason=exit exit_code=1 retry=true ms=[0-9]* job=$r " "$T/a.log"
ok $? "a retry is logged at info, with retry=true"
grep -q "msg=\"job output\" job=$r queue=lh attempt=2 stream=stderr line=\"err of 2\"" "$T/a.log"
ok $? "log_output = journal: the command's lines are logged"

# The schedule of the lease queue ticked on the lease session, on time; its job sees its
# schedule and tick.
wait_until 10 '[ "$(count_jobs "schedule = '"'every'"'")" -ge 1 ]'
ok $? "the tick enqueues a job"
s=$(psql_q "SELECT id FROM pgjobd.jobs WHERE schedule = 'every' ORDER BY id LIMIT 1")
lateness=$(psql_q "SELECT round(extract(epoch FROM created_at) * 1000 - ($real0 + 6) * 1000)
                     FROM pgjobd.jobs WHERE id = $s")
note "the tick's job was created $lateness ms after the tick's time"
# How late a tick is on the lease session, is a figure of make bench (9b); here, a bound
# no busy machine reaches and no poll could meet (poll_interval is 1h).
cmp_ok "${lateness%.*}" -lt 5000 "on the scheduler's timer: within 5 s of its time"
cmp_ok "${lateness%.*}" -ge 0 "and not before it"
wait_until 10 "finished $s"
ok $? "the schedule's job finishes"
is "$(grep "^$s|" "$T/env.log")" "$s|every|2030-01-01T00:00:00Z" \
	"its command sees PGJOBD_SCHEDULE and PGJOBD_SCHEDULED_FOR"
wait_until 10 "finished $l"
is "$(job_field "$l" "status || ' ' || attempts")" "succeeded 1" \
	"a lease-mode job running across the tick kept its lease (extended on the same session)"
is "$(psql_q "SELECT string_agg(application_name, ',' ORDER BY application_name)
              FROM pg_stat_activity WHERE application_name LIKE 'pgjobd%'")" \
	"pgjobd fence,pgjobd lease,pgjobd listener" "with the scheduler, still three sessions"

stop_daemon "$A"
is $? 0 "the daemon exits 0"
done_testing
