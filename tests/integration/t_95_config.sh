#!/usr/bin/env bash
# Configuration (SPEC §2, §4): errors name FILE:LINE and exit 2 without starting; `check`
# validates, connects and checks the schema; SIGHUP reloads, and a broken file is
# reported and ignored (the old config stays).
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start

# expect_config_error NAME FILE LINE [PATTERN]: both `pgjobd -c FILE` and `pgjobd check -c
# FILE` exit 2 and print "FILE:LINE: error:" (and PATTERN) on stderr.
expect_config_error() {
	local name=$1 file=$2 line=$3 pattern=${4:-} mode status err
	for mode in run check; do
		if [ $mode = run ]; then
			timeout 20 "$PGJOBD" -c "$file" >"$T/out.txt" 2>"$T/err.txt"
		else
			timeout 20 "$PGJOBD" check -c "$file" >"$T/out.txt" 2>"$T/err.txt"
		fi
		status=$?
		err=$(cat "$T/err.txt")
		is "$status" 2 "$name ($mode): exit status 2"
		like "$err" "$(basename "$file"):$line: error:" "$name ($mode): stderr names $(basename "$file"):$line" ||
			diag "stdout: $(cat "$T/out.txt")"
		if [ -n "$pattern" ]; then
			like "$err" "$pattern" "$name ($mode): stderr mentions '$pattern'"
		fi
	done
}

cat >"$T/unknown_key.ini" <<EOF
[pgjobd]
database = $DB_CONNINFO

[queue.a]
command = true
concurency = 4
EOF
expect_config_error "unknown key" "$T/unknown_key.ini" 6 concurency

cat >"$T/unknown_section.ini" <<EOF
[pgjobd]
database = $DB_CONNINFO
[nosuch]
x = 1
[queue.a]
command = true
EOF
expect_config_error "unknown section" "$T/unknown_section.ini" 3 nosuch

cat >"$T/no_command.ini" <<EOF
[pgjobd]
database = $DB_CONNINFO

[queue.ok]
command = true

[queue.nocmd]
concurrency = 2
EOF
expect_config_error "missing command" "$T/no_command.ini" '[0-9]+' command

cat >"$T/bad_duration.ini" <<EOF
[pgjobd]
database = $DB_CONNINFO
[queue.a]
command = true
timeout = 5x
EOF
expect_config_error "bad duration" "$T/bad_duration.ini" 5 timeout

cat >"$T/bad_global.ini" <<EOF
[pgjobd]
database = $DB_CONNINFO
poll_interval = soon
[queue.a]
command = true
EOF
expect_config_error "bad poll_interval" "$T/bad_global.ini" 3

# Every problem is reported, not only the first.
cat >"$T/two_errors.ini" <<EOF
[pgjobd]
database = $DB_CONNINFO
[queue.a]
command = true
concurrency = many
max_attempts = 2
kill_grace = 10 parsecs
EOF
timeout 20 "$PGJOBD" check -c "$T/two_errors.ini" >/dev/null 2>"$T/err.txt"
is $? 2 "two errors: exit 2"
err=$(cat "$T/err.txt")
like "$err" "two_errors.ini:5: error:" "two errors: line 5 reported"
like "$err" "two_errors.ini:7: error:" "two errors: line 7 reported too"

# A good file: `check` connects and verifies the schema version.
good=$T/good.ini
write_conf "$good" <<EOF
$(conf_header)

[queue.a]
command = echo a
EOF
timeout 20 "$PGJOBD" check -c "$good" >"$T/out.txt" 2>"$T/err.txt"
isnt $? 0 "check before migrate fails (no schema)" || diag "$(cat "$T/err.txt")"
pgjobd_migrate "$good" >"$T/migrate.log" 2>&1
ok $? "migrate"
timeout 20 "$PGJOBD" check -c "$good" >"$T/out.txt" 2>"$T/err.txt"
ok $? "check on a good file after migrate exits 0" || diag "$(cat "$T/err.txt")"
timeout 20 "$PGJOBD" -c "$good" check >"$T/out.txt" 2>"$T/err.txt"
ok $? "-c before the subcommand works too" || diag "$(cat "$T/err.txt")"
cat >"$T/nodb.ini" <<EOF
[pgjobd]
database = host=$T/nosuchdir port=5432 dbname=pgjobd_test user=postgres connect_timeout=5
[queue.a]
command = true
EOF
timeout 30 "$PGJOBD" check -c "$T/nodb.ini" >"$T/out.txt" 2>"$T/err.txt"
status=$?
ok "$([ $status != 0 ] && [ $status != 2 ] && [ $status != 124 ]; echo $?)" \
	"check with an unreachable database fails, not as a config error (status $status)"
timeout 20 "$PGJOBD" check -c "$T/does-not-exist.ini" >/dev/null 2>&1
isnt $? 0 "check on a missing file fails"

# SIGHUP.
conf=$T/hup.ini
cp "$good" "$conf"
start_daemon d "$conf"
d=$DAEMON_PID
run_job() { # QUEUE -> id, once finished
	local id
	id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ($(sql_lit "$1")) RETURNING id")
	wait_until 20 "job_field $id \"status IN ('succeeded', 'failed')\" | grep -qx t"
	echo "$id"
}
id=$(run_job a)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" "succeeded a" "a job runs before any reload"

{
	conf_header
	printf '\n[queue.a]\ncommand = echo broken\nbogus_key = 1\n'
} >"$conf"
kill -HUP "$d"
wait_until 20 "grep -q 'hup.ini:8' '$T/d.log'"
ok $? "the broken file is reported in the log with file:line (hup.ini:8)"
pid_alive "$d"
ok $? "the daemon keeps running after SIGHUP with a broken file"
id=$(run_job a)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" "succeeded a" "the old config stays in force"

{
	conf_header
	printf '\n[queue.a]\ncommand = echo a2\n\n[queue.b]\ncommand = echo b\n'
} >"$conf"
kill -HUP "$d"
id=$(run_job b)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" "succeeded b" "SIGHUP: a new queue is served"
id=$(run_job a)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" "succeeded a2" "SIGHUP: a changed queue takes effect"
pid_alive "$d"
ok $? "the daemon is still running"
stop_daemon "$d"
is $? 0 "SIGTERM: exit status 0"
done_testing
