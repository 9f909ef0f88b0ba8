#!/usr/bin/env bash
# pgjobd(8) output rules through the daemon: max_output keeps the head of
# stdout and the tail of stderr with "truncated": true, the daemon's memory
# does not grow with output size, invalid UTF-8 and NUL become U+FFFD, and
# the queue's env reaches the command.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/output.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.big_out]
command = head -c 50000000 /dev/zero | tr '\\0' a; echo
max_output = 1KiB

[queue.big_err]
command = head -c 50000000 /dev/zero | tr '\\0' b >&2; echo ' tail-marker' >&2; exit 1
max_output = 1KiB
max_attempts = 1

[queue.bytes]
command = printf 'a\\377b\\000c'

[queue.env]
command = printf '%s|%s|%s' "\$FOO" "\$BAZ" "\$LANG"
env = FOO=bar BAZ="a b"
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate"
start_daemon d "$conf" LANG=C.UTF-8
d=$DAEMON_PID

o=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('big_out') RETURNING id")
e=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('big_err') RETURNING id")
b=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('bytes') RETURNING id")
v=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('env') RETURNING id")
wait_until 60 "[ \"\$(count_jobs \"status IN ('succeeded', 'failed')\")\" = 4 ]"
ok $? "the four jobs finish"

is "$(job_field "$o" "status || ' ' || length(result->>'stdout') || ' ' || (result->>'truncated') || ' ' || (result->>'stdout' ~ '^a+\$')")" \
	"succeeded 1024 true true" "50 MB of stdout: the first 1 KiB kept, truncated: true"
is "$(job_field "$e" "status || ' ' || (error->>'reason') || ' ' || (error->>'exit_code') || ' ' || (error->>'truncated') || ' ' || (length(error->>'stderr') <= 1024)")" \
	"failed exit 1 true true" "50 MB of stderr: at most 1 KiB kept, truncated: true"
like "$(job_field "$e" "error->>'stderr'")" "b tail-marker\$" "the kept part of stderr is its tail"
hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$d/status")
note "daemon peak RSS after 100 MB of output: ${hwm} KiB"
cmp_ok "$hwm" -lt 65536 "the daemon's peak memory stays small (under 64 MiB) after 100 MB of output"
is "$(job_field "$b" "result->>'stdout'")" "a�b�c" "invalid UTF-8 and NUL bytes become U+FFFD"
is "$(job_field "$v" "result->>'stdout'")" "bar|a b|C.UTF-8" "the queue's env and the daemon's LANG reach the command"

stop_daemon "$d"
is $? 0 "the daemon exits 0"
done_testing
