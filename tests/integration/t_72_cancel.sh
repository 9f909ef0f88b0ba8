#!/usr/bin/env bash
# Cancel (pgjobd(8)): UPDATE ... SET status = 'cancelled' on a queued job stops it
# from ever running; pgjobd.cancel(id) on a running job terminates its command's whole
# process group (SIGTERM, SIGKILL after kill_grace) within about a second, and the job
# ends `cancelled`, reason `cancelled`, not retried; on a queued job it cancels it, on a
# finished one it returns false. UPDATE to cancelled of a running job does what cancel()
# does (the row stays running until the command is dead). A cancel that finds the job's daemon dead (kill -9)
# still ends the job cancelled instead of running it again.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
make_sleeper_script "$T/sleeper.sh"
conf=$T/cancel.ini
write_conf "$conf" <<EOF
$(conf_header poll_interval=1s)

[queue.long]
command = exec /bin/sh '$T/sleeper.sh'
concurrency = 2
kill_grace = 10s
max_attempts = 5

[queue.stubborn]
command = trap '' TERM; echo \$\$ > '$T/stubborn.pid'; sleep 300
kill_grace = 2500ms
max_attempts = 5

[queue.later]
command = echo ran >> '$T/later.ran'

[queue.deaf]
command = trap '' TERM; echo \$\$ > '$T/deaf.pid'; sleep 300
kill_grace = 2500ms
max_attempts = 5
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"
d=$DAEMON_PID

status_of() { job_field "$1" status; }

# --- queued jobs: an UPDATE by hand, and pgjobd.cancel()
# Due in an hour: nothing starts them before they are cancelled, however slow the machine.
q1=$(psql_q "INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('later', now() + interval '1 hour') RETURNING id")
q2=$(psql_q "INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('later', now() + interval '1 hour') RETURNING id")
psql_q "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $q1"
is "$(psql_q "SELECT pgjobd.cancel($q2)")" t "cancel() of a queued job returns true"
is "$(job_field "$q1" "status || ' ' || (finished_at IS NOT NULL) || ' ' || (error->>'reason')")" \
	"cancelled true cancelled" "UPDATE to cancelled: finished_at and a reason are filled in"
is "$(job_field "$q2" "status || ' ' || attempts || ' ' || (error->>'reason')")" "cancelled 0 cancelled" \
	"cancel() of a queued job: cancelled at once, attempts 0"
# Due now, the two cancelled ones and a new job of the same queue: only the new one runs.
psql_q "UPDATE pgjobd.jobs SET run_at = now() WHERE id IN ($q1, $q2)"
sentinel=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('later') RETURNING id")
wait_until 20 "[ \"\$(status_of $sentinel)\" = succeeded ]"
ok $? "a job of the same queue due at the same time ran"
is "$(wc -l <"$T/later.ran" | tr -d ' ')" 1 "... and the two cancelled ones never ran"

# --- a running job: its command and grandchild die within seconds
r=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
wait_until 20 "[ \"\$(status_of $r)\" = running ] && [ -s '$T/gc.pids' ]"
ok $? "the long job is running"
t0=$(now_ms)
is "$(psql_q "SELECT pgjobd.cancel($r)")" t "cancel() of a running job returns true"
wait_until 10 "[ \"\$(status_of $r)\" = cancelled ]"
ok $? "the running job ends cancelled"
elapsed=$(($(now_ms) - t0))
cmp_ok "$elapsed" -lt 5000 "... within seconds (${elapsed} ms), not after kill_grace (10 s)"
is "$(job_field "$r" "attempts || ' ' || (error->>'reason') || ' ' || (finished_at IS NOT NULL)")" \
	"1 cancelled true" "... reason cancelled, attempts 1, finished_at set"
wait_until 5 "all_dead '$T/sh.pids' && all_dead '$T/gc.pids'"
ok $? "the shell and its grandchild (sleep 300 &) are dead"
is "$(psql_q "SELECT count(*) FROM pgjobd.cancel_requests")" 0 "the cancel request is gone"
is "$(psql_q "SELECT pgjobd.cancel($r)")" f "cancel() of a finished job returns false"
done_id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('later') RETURNING id")
wait_until 20 "[ \"\$(status_of $done_id)\" = succeeded ]"
ok $? "a 'later' job succeeded"
is "$(psql -X -At -c "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $done_id" 2>&1)" \
	"UPDATE 0" "UPDATE to cancelled leaves a finished job alone"
is "$(status_of "$done_id")" succeeded "... it stays succeeded"
is "$(psql_q "SELECT pgjobd.cancel(999999999)")" f "cancel() of no job returns false"

# --- UPDATE to cancelled of a running job: a cancel request, the row running until
# the command is dead (its slot holds the row FOR KEY SHARE, which the UPDATE does not
# wait for: it must not end the job's `running` while its command runs). The command
# ignores SIGTERM: it dies 2.5 s after the request (kill_grace).
u=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('deaf') RETURNING id")
wait_until 20 "[ \"\$(status_of $u)\" = running ] && [ -s '$T/deaf.pid' ]"
ok $? "a job whose command ignores SIGTERM is running"
is "$(psql -X -At -c "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $u" 2>&1)" \
	"UPDATE 0" "UPDATE to cancelled of a running job changes no row at once"
is "$(status_of "$u"):$(psql_q "SELECT count(*) FROM pgjobd.cancel_requests WHERE job_id = $u")" \
	"running:1" "... it stays running, with a cancel request"
holds_for 1.5 "[ \"\$(status_of $u)\" = running ] && pid_alive \$(cat '$T/deaf.pid')"
ok $? "... running while its command lives (SIGTERM ignored)"
wait_until 10 "[ \"\$(status_of $u)\" = cancelled ]"
ok $? "... and ends cancelled"
is "$(job_field "$u" "attempts || ' ' || (error->>'reason')")" "1 cancelled" "... reason cancelled, attempts 1"
wait_until 5 "all_dead '$T/deaf.pid'"
ok $? "... its command is dead"

# --- a command that ignores SIGTERM gets SIGKILL after kill_grace
s=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('stubborn') RETURNING id")
wait_until 20 "[ \"\$(status_of $s)\" = running ] && [ -s '$T/stubborn.pid' ]"
ok $? "the stubborn job is running"
psql_q "SELECT pgjobd.cancel($s)" >/dev/null
wait_until 15 "[ \"\$(status_of $s)\" = cancelled ]"
ok $? "the stubborn job ends cancelled"
like "$(job_field "$s" "error->>'signal'")" '^(9|SIGKILL|KILL)$' "... killed by SIGKILL after kill_grace"
wait_until 5 "all_dead '$T/stubborn.pid'"
ok $? "... and its command is dead"
is "$(grep -c "msg=\"job cancelled; terminating its command\" job=$s " "$T/d.log")" 1 \
	"... acted on once, though the request was seen again during kill_grace"

# --- cancel of a job whose daemon died: the next claimer ends it cancelled
: >"$T/sh.pids"
: >"$T/gc.pids"
k=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
wait_until 20 "[ \"\$(status_of $k)\" = running ] && [ -s '$T/gc.pids' ]"
ok $? "another long job is running"
# Queue long's claimer has claimed since the first long job was cancelled (and its
# poll, every second, throughout the stubborn job's kill_grace).
is "$(job_field "$r" "status || ' ' || attempts")" "cancelled 1" "the cancelled job is not retried"
is "$(grep -c "msg=\"job started\".* job=$r " "$T/d.log")" 1 "... its command started once"
kill -KILL "$d"
wait "$d" 2>/dev/null
forget_daemon "$d"
wait_until 10 "all_dead '$T/gc.pids'"
ok $? "kill -9 of the daemon: its command is killed by the guard"
is "$(psql_q "SELECT pgjobd.cancel($k)")" t "cancel() of the orphaned running job returns true"
start_daemon d2 "$conf"
wait_until 20 "[ \"\$(status_of $k)\" = cancelled ]"
ok $? "the new daemon's claimer ends the orphan cancelled"
is "$(job_field "$k" "attempts || ' ' || (error->>'reason')")" "1 cancelled" "... without running it again"
is "$(wc -l <"$T/sh.pids" | tr -d ' ')" 1 "... its command ran once"

stop_daemon "$DAEMON_PID" 30
is $? 0 "the daemon stops cleanly (exit 0)"
done_testing
