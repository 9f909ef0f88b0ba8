#!/usr/bin/env bash
# Failed attempts and retries (pgjobd(8)): exit status, backoff, max_attempts (queue and
# row), a missing program (shell exit 127), death by signal, a working_dir that vanished.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/retry.ini
mkdir "$T/wd"
# Jobs start on NOTIFY and retries on their own timer: a slow fallback poll (1 s)
# costs nothing here but spares the CPU the other test files share.
write_conf "$conf" <<EOF
$(conf_header poll_interval=1s)

[queue.fail3]
command = echo "oops on attempt \$PGJOBD_ATTEMPT" >&2; exit 3
max_attempts = 3
backoff = 100ms
backoff_max = 200ms

[queue.flaky]
command = if [ "\$PGJOBD_ATTEMPT" -lt 2 ]; then echo first >&2; exit 1; fi; echo ok
max_attempts = 3
backoff = 100ms
backoff_max = 200ms

[queue.missing]
command = /nonexistent/pgjobd-no-such-program
max_attempts = 1

[queue.signal]
command = kill -9 \$\$
max_attempts = 1

[queue.nodir]
command = echo should-not-run
working_dir = $T/wd
max_attempts = 1

[queue.slowretry]
command = exit 1
max_attempts = 2
backoff = 10s
backoff_max = 10s
EOF

pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
# The working_dir exists when the config is loaded and is gone when the job starts.
rmdir "$T/wd"
start_daemon d "$conf"

enqueue() { # QUEUE [MAX_ATTEMPTS]
	psql_q "INSERT INTO pgjobd.jobs (queue, max_attempts) VALUES ($(sql_lit "$1"), ${2:-NULL}) RETURNING id"
}
finished() { job_field "$1" "status IN ('succeeded', 'failed', 'cancelled')" | grep -qx t; }

f3=$(enqueue fail3)
f2=$(enqueue fail3 2)
fl=$(enqueue flaky)
mi=$(enqueue missing)
si=$(enqueue signal)
nd=$(enqueue nodir)
sr=$(enqueue slowretry)

# A retry waits for its backoff: after attempt 1 the job is queued again, run_at ahead.
# The backoff (10s, 5 to 10 s with jitter) leaves this check time to see the job
# between its attempts, when it looks first (the others' checks can take that long).
wait_until 20 "job_field $sr \"status = 'queued' AND attempts = 1\" | grep -qx t"
ok $? "after a failed attempt the job returns to queued"
is "$(job_field "$sr" "(run_at > now()) || ' ' || (error->>'reason')")" "true exit" \
	"run_at is in the future (backoff), error of the failed attempt recorded"

wait_until 30 "finished $f3 && finished $f2 && finished $fl && finished $mi && finished $si && finished $nd"
ok $? "the jobs finish"

is "$(job_field "$f3" "status || ' ' || attempts || ' ' || (error->>'reason') || ' ' || (error->>'exit_code')")" \
	"failed 3 exit 3" "exit 3: failed after max_attempts = 3, reason exit, exit_code 3"
like "$(job_field "$f3" "error->>'stderr'")" "oops on attempt 3" "stderr of the last attempt is kept"
is "$(job_field "$f3" "finished_at IS NOT NULL")" t "failed: finished_at set"
is "$(job_field "$f2" "status || ' ' || attempts")" "failed 2" "the row's max_attempts overrides the queue's"
is "$(job_field "$fl" "status || ' ' || attempts || ' ' || (result->>'stdout')")" "succeeded 2 ok" \
	"fails on attempt 1, succeeds on attempt 2"
is "$(job_field "$mi" "status || ' ' || attempts || ' ' || (error->>'reason') || ' ' || (error->>'exit_code')")" \
	"failed 1 exit 127" "a missing program: the shell's exit 127, reason exit"
like "$(job_field "$mi" "error->>'stderr'")" "pgjobd-no-such-program" "the shell's complaint is in error.stderr"
is "$(job_field "$si" "status || ' ' || (error->>'reason') || ' ' || (error->>'signal')")" \
	"failed signal 9" "death by SIGKILL: reason signal, signal 9"
is "$(job_field "$nd" "status || ' ' || attempts || ' ' || (error->>'reason')")" "failed 1 spawn" \
	"a working_dir that does not exist: reason spawn"

wait_until 30 "finished $sr"
is "$(job_field "$sr" "status || ' ' || attempts || ' ' || (finished_at - created_at >= interval '5 seconds')")" \
	"failed 2 true" "the retry ran after the backoff"

pid_alive "$(cat "$T/d.pid")"
ok $? "the daemon is still running"
done_testing
