#!/usr/bin/env bash
# Configuration (pgjobd.ini(5), pgjobd(8)): errors name FILE:LINE and exit 2 without starting; `check`
# validates, connects and checks the schema; SIGHUP reloads, and a broken file is
# reported and ignored (the old config stays).
. "$(dirname "$0")/lib.sh"
require_pgjobd

empty_database # it runs check before migrate
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

# Only a regular file of at most 1 MiB is read (a device can be endless or random, a FIFO
# blocks): refused at once, exit 2, naming the file.
# expect_file_error NAME FILE PATTERN: run and check both exit 2, quickly, with
# "FILE: error: ...PATTERN" on stderr.
expect_file_error() {
	local name=$1 file=$2 pattern=$3 mode status
	for mode in run check; do
		if [ $mode = run ]; then
			timeout 5 "$PGJOBD" -c "$file" >"$T/out.txt" 2>"$T/err.txt"
		else
			timeout 5 "$PGJOBD" check -c "$file" >"$T/out.txt" 2>"$T/err.txt"
		fi
		status=$?
		is "$status" 2 "$name ($mode): exit status 2 at once"
		like "$(head -c 2000 "$T/err.txt")" "^$file: error: .*$pattern" "$name ($mode): stderr says why"
	done
}
expect_file_error "/dev/urandom" /dev/urandom "is a device; the configuration must be a regular file"
expect_file_error "/dev/zero" /dev/zero "is a device"
mkfifo "$T/fifo.ini"
expect_file_error "a FIFO" "$T/fifo.ini" "is a FIFO"
{
	printf '[pgjobd]\ndatabase = %s\n[queue.a]\ncommand = true\n' "$DB_CONNINFO"
	head -c 1100000 /dev/zero | tr '\0' '\n' | sed 's/^/;/'
} >"$T/big.ini"
expect_file_error "a 1.1 MB file" "$T/big.ini" "larger than 1 MiB"

# A database string libpq cannot parse is a configuration error, and no part of the
# password reaches the output (libpq's own message quotes the token it stopped at).
# expect_secret_kept NAME FILE: exit 2 naming FILE:2 and 'database', no "Secret" anywhere.
expect_secret_kept() {
	local name=$1 file=$2 mode status
	for mode in run check; do
		if [ $mode = run ]; then
			timeout 10 "$PGJOBD" -c "$file" >"$T/out.txt" 2>"$T/err.txt"
		else
			timeout 10 "$PGJOBD" check -c "$file" >"$T/out.txt" 2>"$T/err.txt"
		fi
		status=$?
		is "$status" 2 "$name ($mode): exit status 2"
		like "$(cat "$T/err.txt")" "$(basename "$file"):2: error: bad value for 'database'" \
			"$name ($mode): names the file, line and key"
		is "$(cat "$T/out.txt" "$T/err.txt" | grep -ac -e Secret -e 'Pw%' -e 'password=my')" 0 \
			"$name ($mode): no part of the password is printed" || diag "$(cat "$T/err.txt")"
	done
}
printf '[pgjobd]\ndatabase = postgresql://u:Pw%%zzSecret@/%s?host=%s\n[queue.a]\ncommand = true\n' \
	"$PGDATABASE" "$T/sock" >"$T/pw_uri.ini"
expect_secret_kept "a URI with a bad %-escape in the password" "$T/pw_uri.ini"
printf '[pgjobd]\ndatabase = host=%s password=my SecretTail dbname=%s user=postgres\n[queue.a]\ncommand = true\n' \
	"$T/sock" "$PGDATABASE" >"$T/pw_space.ini"
expect_secret_kept "an unquoted password with a space" "$T/pw_space.ini"

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
database = host=$T/nosuchdir port=5432 dbname=$PGDATABASE user=postgres connect_timeout=5
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

# The file replaced by a FIFO: the reload must neither block nor read it.
mv "$conf" "$conf.saved"
mkfifo "$conf"
kill -HUP "$d"
wait_until 10 "grep -q 'hup.ini: error: is a FIFO' '$T/d.log'"
ok $? "SIGHUP with a FIFO in place of the file: refused, and said why"
id=$(run_job a)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" "succeeded a" \
	"... without blocking the daemon; the old config stays" ||
	timeout 2 sh -c "exec 3>'$conf'" # unblock a daemon stuck in open(2), for the tests below
rm -f "$conf"
mv "$conf.saved" "$conf"

# A database string libpq cannot parse: refused at reload, the secret never logged.
refused=$(grep -c 'configuration not reloaded' "$T/d.log")
{
	conf_header database="postgresql://u:Pw%zzSecret@/$PGDATABASE?host=$T/sock"
	printf '\n[queue.a]\ncommand = echo a3\n'
} >"$conf"
kill -HUP "$d"
wait_until 10 "[ \"\$(grep -c 'configuration not reloaded' '$T/d.log')\" -gt $refused ]"
ok $? "SIGHUP with a database libpq cannot parse: the file is refused"
grep -q "hup.ini:2: error: bad value for 'database'" "$T/d.log"
ok $? "... naming hup.ini:2 and the key"
is "$(grep -ac -e Secret -e 'Pw%' "$T/d.log")" 0 "... and no part of the password is logged"
id=$(run_job a)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" "succeeded a" "... the old config stays"

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
