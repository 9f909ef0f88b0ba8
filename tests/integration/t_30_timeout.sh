#!/usr/bin/env bash
# Timeouts (pgjobd.ini(5), pgjobd(8)): SIGTERM to the whole process group at `timeout`, SIGKILL after
# `kill_grace`; a grandchild dies with the shell; the row's timeout overrides the queue's.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
make_sleeper_script "$T/sleeper.sh"
conf=$T/timeout.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.to]
command = exec /bin/sh '$T/sleeper.sh'
timeout = 1s
kill_grace = 1s
max_attempts = 2
backoff = 100ms
backoff_max = 100ms

[queue.stubborn]
command = trap '' TERM; echo \$\$ > '$T/stubborn.pid'; sleep 300
timeout = 1s
kill_grace = 1s
max_attempts = 1

[queue.rowtimeout]
command = echo \$\$ > '$T/row.pid'; sleep 300
timeout = 60s
kill_grace = 1s
max_attempts = 1
EOF

pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"

finished() { job_field "$1" "status IN ('succeeded', 'failed', 'cancelled')" | grep -qx t; }

to=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('to') RETURNING id")
st=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('stubborn') RETURNING id")
rt=$(psql_q "INSERT INTO pgjobd.jobs (queue, timeout) VALUES ('rowtimeout', '1 second') RETURNING id")

wait_until 30 "finished $to && finished $st && finished $rt"
ok $? "the jobs finish"

is "$(job_field "$to" "status || ' ' || attempts || ' ' || (error->>'reason')")" "failed 2 timeout" \
	"timeout: reason timeout, retried, failed after max_attempts"
is "$(wc -l <"$T/gc.pids" | tr -d ' ')" 2 "the command ran twice"
wait_until 5 "all_dead '$T/sh.pids'"
ok $? "the shells are dead"
wait_until 5 "all_dead '$T/gc.pids'"
ok $? "the grandchildren (sleep 300 &) are dead too: the whole process group was killed"
dur=$(job_field "$to" "extract(epoch FROM finished_at - started_at)::numeric(10,1)")
ok "$(awk -v d="$dur" 'BEGIN { exit !(d >= 0.9 && d < 10) }'; echo $?)" \
	"the last attempt lasted about the timeout (${dur}s)"

is "$(job_field "$st" "status || ' ' || (error->>'reason')")" "failed timeout" \
	"a command ignoring SIGTERM: reason timeout"
like "$(job_field "$st" "error->>'signal'")" '^(9|SIGKILL|KILL)$' "... and it was killed by SIGKILL"
dur=$(job_field "$st" "extract(epoch FROM finished_at - started_at)::numeric(10,1)")
ok "$(awk -v d="$dur" 'BEGIN { exit !(d >= 1.9 && d < 15) }'; echo $?)" \
	"... after timeout + kill_grace (${dur}s)"
wait_until 5 "all_dead '$T/stubborn.pid'"
ok $? "... and is dead"

is "$(job_field "$rt" "status || ' ' || (error->>'reason')")" "failed timeout" \
	"the row's timeout overrides the queue's 60s"
wait_until 5 "all_dead '$T/row.pid'"
ok $? "... and the command is dead"

pid_alive "$(cat "$T/d.pid")"
ok $? "the daemon is still running"
done_testing
