#!/usr/bin/env bash
# Isolation of commands (pgjobd(8)): job data never passes through a shell parser; the
# command's environment is clean (no daemon variables, no credentials, no conninfo); it
# inherits no file descriptor besides 0, 1 and 2.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
write_conf "$T/d.ini" <<EOF
$(conf_header)

[queue.arg]
command = printf '%s' "\$PGJOBD_ARG_x"
concurrency = 4

[queue.stdin]
command = cat

[queue.envdump]
command = env > '$T/env.txt'; ls -l /proc/self/fd > '$T/fd.txt'; echo done
env = FOO=bar TZ=UTC
EOF
pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# The daemon gets secrets in its environment and an extra open fd (7) that must not
# reach commands; PGHOST/PGUSER/... are exported by lib.sh as well.
exec 7<"$0"
start_daemon d "$T/d.ini" SECRET_TEST_VAR=1 PGPASSWORD=x
exec 7<&-

payloads=(
	"'; touch $T/pwned1 #"
	"\$(touch $T/pwned2)"
	"\`touch $T/pwned3\`"
	"\"; touch $T/pwned4; echo \""
	"x && touch $T/pwned5 || touch $T/pwned5"
	"\$PGPASSWORD \${SECRET_TEST_VAR} %s %n \\ \\n"
	"-n"
	"$(printf 'line1\nline2; touch %s/pwned6' "$T")"
)
ids=()
for p in "${payloads[@]}"; do
	ids+=("$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('arg', jsonb_build_object('x', $(sql_lit "$p"))) RETURNING id")")
done
all=$(
	IFS=,
	echo "${ids[*]}"
)
wait_until 30 "[ \"\$(count_jobs \"id IN ($all) AND status IN ('succeeded', 'failed')\")\" = ${#ids[@]} ]"
ok $? "the jobs with shell metacharacters in data finish"
for i in "${!ids[@]}"; do
	is "$(job_field "${ids[$i]}" "status || ':' || (result->>'stdout')")" "succeeded:${payloads[$i]}" \
		"payload $i comes back verbatim"
done
ls "$T"/pwned* >/dev/null 2>&1
isnt $? 0 "no payload was executed (no $T/pwned* file)"

id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('stdin', jsonb_build_object('a', $(sql_lit "${payloads[0]}"), 'b', $(sql_lit "${payloads[1]}"))) RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "stdin job succeeds"
is "$(job_field "$id" "result = data")" t "stdin carries the data unchanged"

id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('envdump') RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "the env/fd dump job succeeds"
env_txt=$(cat "$T/env.txt" 2>/dev/null)
unlike "$env_txt" '(^|
)(SECRET_TEST_VAR|PGPASSWORD|PGHOST|PGPORT|PGUSER|PGDATABASE|NOTIFY_SOCKET|PGJOBD)=' \
	"no daemon variable reaches the command"
grep -qF -e "$T/sock" -e "dbname=$PGDATABASE" "$T/env.txt"
isnt $? 0 "the database conninfo is nowhere in the environment"
is "$(grep '^PATH=' "$T/env.txt")" "PATH=/usr/local/bin:/usr/bin:/bin" "PATH is the fixed one"
grep -q '^HOME=' "$T/env.txt"
ok $? "HOME is set"
is "$(grep -E '^(FOO|TZ)=' "$T/env.txt" | sort | tr '\n' ' ')" "FOO=bar TZ=UTC " "the queue's env is added"
is "$(grep -c '^PGJOBD_\(JOB_ID\|QUEUE\|GROUP_ID\|ATTEMPT\|MAX_ATTEMPTS\)=' "$T/env.txt")" 5 "the PGJOBD_* variables are set"
# Everything else must be one of these (PWD, SHLVL, _ and OLDPWD come from the shell).
extra=$(sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$T/env.txt" |
	grep -vxE 'PATH|HOME|LANG|FOO|TZ|PWD|OLDPWD|SHLVL|_|PGJOBD_[A-Za-z0-9_]+' | tr '\n' ' ')
is "$extra" "" "no other variable in the environment"

# ls -l /proc/self/fd lists ls's own directory fd too; leave that one out.
fds=$(awk '/ -> / && $NF !~ /^\/proc\/[0-9]+\/fd$/ { print $(NF - 2) }' "$T/fd.txt" | sort -n | tr '\n' ' ')
is "$fds" "0 1 2 3 " "the command has only fds 0, 1 and 2, and 3 (PGJOBD_PROGRESS_FD)"
like "$(awk '/ -> / && $(NF - 2) == 3 { print $NF }' "$T/fd.txt")" '^pipe:' \
	"fd 3 is its progress pipe, none of the daemon's (the daemon's fd 7 is this file)"

pid_alive "$(cat "$T/d.pid")"
ok $? "the daemon is still running"
done_testing
