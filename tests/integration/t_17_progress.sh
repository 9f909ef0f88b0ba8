#!/usr/bin/env bash
# Progress (pgjobd(8), "Progress"): a command writes lines to the fd PGJOBD_PROGRESS_FD
# names, and its latest value is seen while it runs, in both lock modes: in jobs.progress
# under a lease, in the view pgjobd.job_progress in lock mode transaction (whose row is
# locked by its slot until the outcome), and in `pgjobd show` and `jobs --json`; the last
# value stays in jobs.progress once the job has finished; a line that is no progress value
# is ignored with a warning; a retry starts with no progress; a flood of lines (and a line
# of a megabyte) costs the daemon neither memory nor more than one statement per 500 ms;
# the progress pipe is the only fd the command gets beyond 0-2.
. "$(dirname "$0")/lib.sh"
require_pgjobd
command -v jq >/dev/null || skip_all "jq is not installed"

pg_start

plan 46

# prog.sh: 10, then 50, then a line that is no progress value, then a JSON object, each
# step after the test's gate file for it ($T/gate.ID.N).
cat >"$T/prog.sh" <<EOF
#!/bin/sh
fd=\$PGJOBD_PROGRESS_FD
g='$T/gate.'\$PGJOBD_JOB_ID
wait_gate() { i=0; while [ ! -e "\$g.\$1" ]; do sleep 0.05; i=\$((i+1)); [ \$i -lt 2400 ] || exit 9; done; }
echo 10 >&\$fd
wait_gate 1
echo 50 >&\$fd
wait_gate 2
echo 'not a progress value' >&\$fd
wait_gate 3
printf '%s\n' '{"step":"upload","pct":80}' >&\$fd
wait_gate 4
EOF
# retry.sh: attempt 1 reports 40 and fails once the test has seen it; attempt 2 says it
# runs, waits for its gate, reports 70 and succeeds.
cat >"$T/retry.sh" <<EOF
#!/bin/sh
fd=\$PGJOBD_PROGRESS_FD
g='$T/gate.'\$PGJOBD_JOB_ID
wait_gate() { i=0; while [ ! -e "\$g.\$1" ]; do sleep 0.05; i=\$((i+1)); [ \$i -lt 2400 ] || exit 9; done; }
if [ "\$PGJOBD_ATTEMPT" = 1 ]; then
	echo 40 >&\$fd
	wait_gate 1
	exit 1
fi
touch "\$g.second"
wait_gate 2
echo 70 >&\$fd
EOF
# flood.sh: lines as fast as awk writes them for 2 s (millions), a line of a megabyte
# (ended apart from what follows: of the lines one read completes only the last one is
# looked at), then the last value.
cat >"$T/flood.sh" <<EOF
#!/bin/sh
fd=\$PGJOBD_PROGRESS_FD
timeout 2 awk 'BEGIN { for (;;) print i++ % 101 }' >&\$fd
head -c 1048576 /dev/zero | tr '\\0' 7 >&\$fd
echo >&\$fd
sleep 0.3
echo '{"done": true}' >&\$fd
sleep 0.3
EOF
chmod +x "$T/prog.sh" "$T/retry.sh" "$T/flood.sh"

conf=$T/p.ini
write_conf "$conf" <<EOF
$(conf_header poll_interval=1s)

[queue.ptx]
command = exec '$T/prog.sh'
lock_mode = transaction

[queue.plz]
command = exec '$T/prog.sh'
lock_mode = lease
lease = 3s

[queue.rtx]
command = exec '$T/retry.sh'
lock_mode = transaction
max_attempts = 2
backoff = 100ms
backoff_max = 100ms

[queue.rlz]
command = exec '$T/retry.sh'
lock_mode = lease
lease = 3s
max_attempts = 2
backoff = 100ms
backoff_max = 100ms

[queue.flood]
command = exec '$T/flood.sh'
lock_mode = lease
lease = 3s

[queue.fds]
command = ls /proc/\$\$/fd; readlink /proc/\$\$/fd/3; echo "fd=\$PGJOBD_PROGRESS_FD"
EOF
write_conf "$T/cli.ini" <<EOF
$(conf_header)
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"
D=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"

# view_progress ID: the job's progress as pgjobd.job_progress has it ('' for NULL).
view_progress() { psql_q "SELECT progress FROM pgjobd.job_progress WHERE job_id = $1"; }

# ---------------------------------------------------------------- the fd
f=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('fds') RETURNING id")
wait_until 20 "[ \"\$(job_field $f status)\" = succeeded ]" || fail "the fd job succeeds"
# Listed from the shell's own fds (a redirection would add the shell's saved copy).
out=$(job_field "$f" "result->>'stdout'")
is "$(head -n 4 <<<"$out" | tr '\n' ' ')" "0 1 2 3 " "the command has fds 0-2 and the progress fd, nothing else" ||
	diag "$out"
like "$(sed -n 5p <<<"$out")" '^pipe:' "fd 3 is a pipe"
is "$(sed -n 6p <<<"$out")" fd=3 "PGJOBD_PROGRESS_FD=3"
is "$(job_field "$f" "coalesce(progress::text, 'none')")" none "a command that reports nothing has no progress"

# ---------------------------------------------------------------- both lock modes
for q in ptx plz; do
	mode=transaction
	[ $q = plz ] && mode=lease
	j=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('$q') RETURNING id")
	wait_until 20 "[ \"\$(view_progress $j)\" = 10 ]"
	ok $? "$mode: the first value (10) is seen while the job runs"
	if [ $q = ptx ]; then
		is "$(job_field "$j" "coalesce(progress::text, 'none') || ' ' || status")" "none running" \
			"transaction: jobs.progress stays empty while the slot holds the row (the view has it)"
	else
		is "$(job_field "$j" "progress::text || ' ' || status")" "10 running" \
			"lease: jobs.progress has it while the job runs"
	fi
	touch "$T/gate.$j.1"
	wait_until 20 "[ \"\$(view_progress $j)\" = 50 ]"
	ok $? "$mode: the next value (50) replaces it"
	touch "$T/gate.$j.2"
	wait_until 20 "grep -q 'progress line ignored.*job=$j ' '$T/d.log'"
	ok $? "$mode: a line that is no progress value is logged as ignored"
	holds_for 0.7 "[ \"\$(view_progress $j)\" = 50 ]"
	ok $? "$mode: ... and the value stays"
	touch "$T/gate.$j.3"
	want='{"pct": 80, "step": "upload"}'
	wait_until 20 "[ \"\$(view_progress $j)\" = '$want' ]"
	ok $? "$mode: a JSON object is stored as it is"
	"$PGJOBD" show "$j" -c "$T/cli.ini" >"$T/show.txt" 2>&1
	like "$(cat "$T/show.txt")" "progress +\\{\"pct\": 80, \"step\": \"upload\"\\}" "$mode: pgjobd show shows it"
	is "$("$PGJOBD" show "$j" --json -c "$T/cli.ini" | jq -c .progress)" '{"pct":80,"step":"upload"}' \
		"$mode: pgjobd show --json has it"
	is "$("$PGJOBD" jobs --json --queue $q -c "$T/cli.ini" | jq -c '.[0].progress')" '{"pct":80,"step":"upload"}' \
		"$mode: pgjobd jobs --json has it"
	touch "$T/gate.$j.4"
	wait_until 20 "[ \"\$(job_field $j \"status || ' ' || coalesce(progress::text, 'none')\")\" = 'succeeded $want' ]"
	ok $? "$mode: the last value stays in jobs.progress once the job has succeeded"
	wait_until 5 "[ \"\$(psql_q 'SELECT count(*) FROM pgjobd.running_progress WHERE job_id = $j')\" = 0 ]"
	ok $? "$mode: nothing of it is left in pgjobd.running_progress"
	is "$(view_progress "$j")" "$want" "$mode: the view shows the finished job's last value"
done

# ---------------------------------------------------------------- a retry
for q in rtx rlz; do
	j=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('$q') RETURNING id")
	wait_until 20 "[ \"\$(view_progress $j)\" = 40 ]"
	ok $? "$q: attempt 1 reports 40"
	touch "$T/gate.$j.1"
	wait_until 20 "[ -e '$T/gate.$j.second' ]"
	ok $? "$q: attempt 2 runs"
	is "$(job_field "$j" "attempts || ' ' || status || ' ' || coalesce(progress::text, 'none')")" "2 running none" \
		"$q: attempt 2 starts with no progress in jobs.progress"
	is "$(view_progress "$j")" "" "$q: ... nor in the view"
	touch "$T/gate.$j.2"
	wait_until 20 "[ \"\$(job_field $j \"status || ' ' || coalesce(progress::text, 'none')\")\" = 'succeeded 70' ]"
	ok $? "$q: attempt 2's value stays once it succeeded"
done

# ---------------------------------------------------------------- a locked row
# report_progress never waits for a row another session holds (a lease's extension,
# an outcome): it skips it and returns its id, for the daemon to send again.
k=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('nobody') RETURNING id")
psql_q "UPDATE pgjobd.jobs SET status = 'running', fence = 424242,
               lease_until = now() + interval '1 hour', lease_ms = 3600000 WHERE id = $k" >/dev/null
psql -X -qAt -v ON_ERROR_STOP=1 >"$T/locker.out" 2>&1 <<SQL &
BEGIN;
SELECT 'locked ' || pg_backend_pid() FROM pgjobd.jobs WHERE id = $k FOR UPDATE;
SELECT pg_sleep(30);
SQL
locker=$!
wait_until 10 "grep -q locked '$T/locker.out'" || bail_out "the row was not locked"
report="[{\"id\": $k, \"fence\": 424242, \"final\": false, \"progress\": 5}]"
t0=$(now_ms)
got=$(psql_q "SET lock_timeout = '5s'; SELECT * FROM pgjobd.report_progress('$report')")
is "$got:$(job_field "$k" "coalesce(progress::text, 'none')")" "$k:none" \
	"report_progress skips a locked row and returns its id"
cmp_ok "$(($(now_ms) - t0))" -lt 2000 "... without waiting for the lock"
psql_q "SELECT pg_terminate_backend($(awk '/^locked/ { print $2 }' "$T/locker.out"))" >/dev/null
wait "$locker" 2>/dev/null
# (as the daemon does: sent again until written; the ended session may take a moment to
# release its lock)
wait_until 10 "[ -z \"\$(psql_q \"SELECT * FROM pgjobd.report_progress('\$report')\")\" ]"
is "$?:$(job_field "$k" "progress::text")" "0:5" "once the row is free, the value is written"

# ---------------------------------------------------------------- a flood
rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$D/status"; }
before=$(rss)
lines_before=$(grep -c 'msg="progress sent"' "$T/d.log")
t0=$(now_ms)
j=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('flood') RETURNING id")
wait_until 60 "[ \"\$(job_field $j status)\" = succeeded ]" || fail "the flood job succeeds"
t1=$(now_ms)
after=$(rss)
wait_until 10 "[ \"\$(job_field $j \"coalesce(progress::text, 'none')\")\" = '{\"done\": true}' ]"
ok $? "flood: the last line is the job's progress"
grew=$((after - before))
cmp_ok "$grew" -lt 2048 "flood: the daemon's RSS grew by ${grew} KiB (millions of lines and a 1 MiB line were written)"
sent=$(($(grep -c 'msg="progress sent"' "$T/d.log") - lines_before))
bound=$(((t1 - t0) / 500 + 3))
cmp_ok "$sent" -le "$bound" "flood: $sent progress statements in $((t1 - t0)) ms (at most one per 500 ms, and the final)"
like "$(grep "progress line ignored.*job=$j " "$T/d.log" | head -n 1)" "longer than 4096 bytes" \
	"flood: the line of a megabyte is ignored"

stop_daemon "$D"
is $? 0 "the daemon exits 0"
