#!/usr/bin/env bash
# The command line (pgjobd(8)): `migrate --grant` sets up the roles (idempotent; without
# CREATEROLE it fails with PostgreSQL's message); `pause`/`resume` say what they did;
# `status` prints queue_stats as an aligned table (then the lines t_98_status.sh tests) or
# as a JSON array; `enqueue` stores every option and reports a deduplicated job instead of
# an id; `cancel` of a queued, a running, a finished and a missing job. A bad argument is
# a usage error (exit 2) whose message names it, and nothing reaches the table; a
# database error prints PostgreSQL's message (exit 1). Only the running-job cancel needs
# a daemon. Then what a new user meets: cancel of several ids, commands without a file
# (--database, PG* variables) and the hint when the file cannot be opened, connection
# errors that say why (libpq's reason for a misspelt parameter, libpq's defaults when
# `database` is unset), a bounded number of warnings while the database is down at start,
# schedule add's warning about an unserved queue, jobs' whole reason, show's numbers.
. "$(dirname "$0")/lib.sh"
require_pgjobd
# The newest migration in sql/ (e.g. 004_cheap_enqueue) and its schema version.
LAST_MIGRATION=$(cd "$REPO_ROOT/sql" && ls [0-9][0-9][0-9]_*.sql | tail -n 1)
LAST_MIGRATION=${LAST_MIGRATION%.sql}
SCHEMA_V=$((10#${LAST_MIGRATION%%_*}))

own_cluster # it creates pgjobd's roles (cluster-wide) and databases
empty_database # its first migrate --grant migrates
pg_start
conf=$T/cli.ini
write_conf "$conf" <<EOF
$(conf_header shutdown_grace=1s)

[queue.sleepy]
command = sleep 300
kill_grace = 1s

; served here, so that enqueue and pause print no warning (t_99_ops.sh)
[queue.work]
command = true

[queue.beta]
command = true

[queue.-dash]
command = true
EOF

# cli ARGS...: run pgjobd ARGS; sets $rc, $out (stdout) and $err (stderr).
cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}

# usage_error ERE ARGS...: pgjobd ARGS exits 2, prints nothing on stdout, and its first
# line on stderr matches ERE (which names the bad argument).
usage_error() {
	local re=$1
	shift
	cli "$@"
	ok "$([ "$rc" = 2 ] && [ -z "$out" ] && [[ ${err%%$'\n'*} =~ $re ]]; echo $?)" \
		"usage error, exit 2: pgjobd $*" ||
		diag "  exit status: $rc" "  stdout: $out" "  stderr: $err" "  expected: $re"
}

# ---------------------------------------------------------------- migrate --grant

# Without CREATEROLE: the migration is done, the roles are not, exit 1.
psql_q "CREATE ROLE app LOGIN" && PGDATABASE=postgres psql_q "CREATE DATABASE appdb OWNER app"
write_conf "$T/app.ini" <<EOF
[pgjobd]
database = host=$T/sock port=$PG_PORT dbname=appdb user=app
EOF
cli migrate --grant -c "$T/app.ini"
is "$rc" 1 "migrate --grant without CREATEROLE exits 1"
like "$out" 'schema pgjobd is at version [0-9]+' "... after migrating"
is "$err" "pgjobd: migrate: --grant: permission denied to create role (role app)
pgjobd: hint: run it as a role with CREATEROLE that owns schema pgjobd or is a superuser, e.g. 'sudo -u postgres pgjobd migrate --grant -c /etc/pgjobd/admin.ini'; or in psql, as such a role: SELECT pgjobd.setup_roles();" \
	"... and prints PostgreSQL's reason without PL/pgSQL's CONTEXT, and the fix"
is "$(psql_q "SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pgjobd\_%'")" 0 "... no role was created"

cli migrate --grant -c "$conf"
is "$rc" 0 "migrate --grant exits 0" || diag "$err"
like "$out" "applied $LAST_MIGRATION"$'\n(.*\n)?created role pgjobd_producer\ncreated role pgjobd_worker\nroles pgjobd_producer and pgjobd_worker are set up$' \
	"migrate --grant: migrates, then says which roles it created"
is "$(psql_q "SELECT string_agg(rolname || ':' || rolcanlogin, ' ' ORDER BY rolname) FROM pg_roles
                WHERE rolname IN ('pgjobd_producer', 'pgjobd_worker')")" \
	"pgjobd_producer:false pgjobd_worker:false" "the two NOLOGIN roles exist"
is "$(psql_q "SELECT has_function_privilege('pgjobd_worker', 'pgjobd.cancel(bigint)', 'EXECUTE')
                 AND has_column_privilege('pgjobd_producer', 'pgjobd.jobs', 'dedupe_key', 'INSERT')")" \
	t "... with their grants"
cli migrate --grant -c "$conf"
is "$rc:$out" "0:schema pgjobd is up to date (version $SCHEMA_V)
roles pgjobd_producer and pgjobd_worker are set up" "migrate --grant again: idempotent, creates nothing"
cli migrate --grant -c "$T/app.ini"
is "$rc:$out" "0:schema pgjobd is up to date (version $SCHEMA_V)
roles pgjobd_producer and pgjobd_worker are set up" \
	"once the roles exist, migrate --grant needs no CREATEROLE" || diag "$err"
cli migrate -c "$conf"
is "$rc:$out" "0:schema pgjobd is up to date (version $SCHEMA_V)" "migrate without --grant leaves the roles alone"

# ---------------------------------------------------------------- status, empty

cli status -c "$conf"
is "$rc:$out" "0:QUEUE  QUEUED  RUNNING  SUCCEEDED  FAILED  CANCELLED  OLDEST_QUEUED  PAUSED  FAILED_LAST_HOUR  DAEMONS

oldest open claim: none
live daemons: 0" \
	"status with no queue: the header only, then no open claim and no live daemon (t_98_status.sh)"
cli status --json -c "$conf"
is "$rc:$out" "0:[]" "status --json with no queue: []"

# ---------------------------------------------------------------- pause, resume

cli pause beta -c "$conf"
is "$rc:$out" "0:paused queue beta" "pause"
cli pause beta -c "$conf"
is "$rc:$out" "0:queue beta was already paused" "pause again"
is "$(psql_q "SELECT string_agg(queue, ' ') FROM pgjobd.paused_queues")" beta "pgjobd.paused_queues: beta"
cli resume beta -c "$conf"
is "$rc:$out" "0:resumed queue beta" "resume"
is "$(psql_q "SELECT count(*) FROM pgjobd.paused_queues")" 0 "pgjobd.paused_queues: empty"
cli resume beta -c "$conf"
is "$rc:$out" "0:queue beta was not paused" "resume again"
"$PGJOBD" -c "$conf" pause beta >"$T/out.txt" 2>&1
is "$?:$(cat "$T/out.txt")" "0:paused queue beta" "pause once more (-c before the subcommand)"
is "$(psql_q "SELECT string_agg(queue, ' ') FROM pgjobd.paused_queues")" beta "pgjobd.paused_queues: beta again"
usage_error "^pgjobd: pause: bad QUEUE 'no way'" pause 'no way' -c "$conf"
usage_error "^pgjobd: resume: bad QUEUE ''" resume '' -c "$conf"
usage_error "^pgjobd: pause: missing QUEUE" pause -c "$conf"

# ---------------------------------------------------------------- status with jobs

# alpha: 2 queued (the oldest due for an hour, one not due), 1 running, 1 succeeded,
# 2 failed (one in the last hour), 1 cancelled. No daemon serves alpha.
psql_q "INSERT INTO pgjobd.jobs (queue, status, run_at, finished_at) VALUES
	('alpha', 'queued', now() - interval '1 hour', NULL),
	('alpha', 'queued', now() + interval '1 hour', NULL),
	('alpha', 'running', now(), NULL),
	('alpha', 'succeeded', now(), now()),
	('alpha', 'failed', now(), now() - interval '5 minutes'),
	('alpha', 'failed', now(), now() - interval '2 hours'),
	('alpha', 'cancelled', now(), now())"
cli status -c "$conf"
is "$rc" 0 "status exits 0"
mapfile -t lines <<<"$out"
is "${#lines[@]}" 6 "status: a header, one line per queue, a blank line and two lines under the table"
is "${lines[0]}" "QUEUE  QUEUED  RUNNING  SUCCEEDED  FAILED  CANCELLED  OLDEST_QUEUED  PAUSED  FAILED_LAST_HOUR  DAEMONS" \
	"status: the header names every column"
like "${lines[1]}" '^alpha +2 +1 +1 +2 +1 +01:00:0[0-9] +no +1 +0$' "status: alpha's counts, age (in seconds), not paused, no daemon"
like "${lines[2]}" '^beta +0 +0 +0 +0 +0 +yes +0 +0$' "status: beta, paused, no jobs, no age"
ok "$([ ${#lines[1]} = ${#lines[0]} ] && [ ${#lines[2]} = ${#lines[0]} ]; echo $?)" \
	"status: the columns are aligned (right-aligned, so every line has the header's length)"
is "${lines[3]}|${lines[4]}|${lines[5]}" "|oldest open claim: none|live daemons: 0" \
	"status: under the table, no open claim (a running row without a slot session is none) and no daemon"

cli status --json -c "$conf"
is "$rc" 0 "status --json exits 0"
printf '%s' "$out" | python3 -m json.tool >/dev/null 2>&1
ok $? "status --json prints valid JSON" || diag "$out"
is "$(psql_q "SELECT string_agg(concat_ws(' ', e->>'queue', e->>'queued', e->>'running',
                e->>'succeeded', e->>'failed', e->>'cancelled', jsonb_typeof(e->'oldest_queued_age'),
                jsonb_typeof(e->'paused'), e->>'paused', e->>'failed_last_hour'), ', ' ORDER BY n)
              FROM jsonb_array_elements($(sql_lit "$out")::jsonb) WITH ORDINALITY AS a(e, n)")" \
	"alpha 2 1 1 2 1 number boolean false 1, beta 0 0 0 0 0 null boolean true 0" \
	"status --json: one object per queue in order, the counts, age a number or null, paused a boolean"
is "$(psql_q "SELECT (e->>'oldest_queued_age')::numeric BETWEEN 3600 AND 3660
              FROM jsonb_array_elements($(sql_lit "$out")::jsonb) e WHERE e->>'queue' = 'alpha'")" \
	t "status --json: oldest_queued_age in seconds"

# ---------------------------------------------------------------- enqueue

cli enqueue work --group g1 --data '{"a": [1, "x"], "s": "it'"'"'s"}' --priority -5 \
	--run-at '2030-01-02 03:04:05+00' --expires-at '2030-02-01 00:00:00+00' --max-attempts 7 \
	--timeout 1h30m --dedupe-key k1 -c "$conf"
id=$out
ok "$([ "$rc" = 0 ] && [[ $id =~ ^[0-9]+$ ]] && [ -z "$err" ]; echo $?)" \
	"enqueue with every option prints the id ($id)" || diag "$rc $out $err"
is "$(job_field "$id" "concat_ws('|', queue, group_id, data = '{\"a\": [1, \"x\"], \"s\": \"it''s\"}', priority,
        run_at = '2030-01-02 03:04:05+00', expires_at = '2030-02-01 00:00:00+00', max_attempts,
        timeout = interval '90 minutes', dedupe_key, status)")" \
	"work|g1|t|-5|t|t|7|t|k1|queued" \
	"the row has the queue, group, data, priority, run_at, expires_at, max_attempts, timeout, dedupe_key"
cli enqueue work --dedupe-key k1 --data '{"b": 2}' -c "$conf"
is "$rc:$out:${err##*$'\n'}" "3:$id:deduplicated: job $id" \
	"enqueue with the dedupe key of an unfinished job: that job's id, 'deduplicated' on stderr, exit 3"
is "$(count_jobs "queue = 'work'")" 1 "... and inserts nothing"
cli enqueue work --dedupe k1 -c "$conf" --data '{"b": 2}'
is "$rc:$out" "3:$id" \
	"options after the -c option too"

cli enqueue work -c "$conf"
id2=$out
is "$(job_field "$id2" "concat_ws('|', group_id IS NULL, data::text, priority,
        run_at BETWEEN now() - interval '1 minute' AND now(), expires_at IS NULL,
        max_attempts IS NULL, timeout IS NULL, dedupe_key IS NULL)")" \
	"t|{}|0|t|t|t|t|t" "enqueue QUEUE alone: the defaults (the queue's max_attempts, timeout)"
cli -c "$conf" --priority=3 enqueue --timeout=250ms -- -dash
id3=$out
is "$rc:$(job_field "$id3" "queue || ' ' || priority || ' ' || timeout")" "0:-dash 3 00:00:00.25" \
	"options before the subcommand, --opt=value, -- before a queue named like an option"

psql_q "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE id = $id"
cli enqueue work --dedupe-key k1 -c "$conf"
ok "$([ "$rc" = 0 ] && [[ $out =~ ^[0-9]+$ ]] && [ "$out" != "$id" ]; echo $?)" \
	"once that job finished, the same dedupe key enqueues a new job ($out)"

"$PGJOBD" enqueue work -c "$conf" >/dev/full 2>"$T/err.txt"
is "$?:$(cat "$T/err.txt")" "1:pgjobd: enqueue: cannot write to standard output: No space left on device" \
	"an id that cannot be written is a failure (exit 1)"

njobs=$(count_jobs true)
usage_error "^pgjobd: enqueue: bad --priority 'abc': not an integer" enqueue work --priority abc -c "$conf"
usage_error "^pgjobd: enqueue: bad --priority '2147483648': must be from -2147483648 to 2147483647; try 'pgjobd enqueue --help'$" \
	enqueue work --priority 2147483648 -c "$conf"
usage_error "^pgjobd: enqueue: bad --max-attempts '0': must be from 1 to 2147483647; try 'pgjobd enqueue --help'$" enqueue work --max-attempts 0 -c "$conf"
usage_error "^pgjobd: enqueue: bad --max-attempts '1x': not an integer; try 'pgjobd enqueue --help'$" enqueue work --max-attempts 1x -c "$conf"
usage_error '^pgjobd: enqueue: bad --data: invalid input syntax for type json' \
	enqueue work --data '{"a": ' -c "$conf"
usage_error "^pgjobd: enqueue: bad --run-at 'soonish': invalid input syntax for type timestamp" \
	enqueue work --run-at soonish -c "$conf"
usage_error "^pgjobd: enqueue: bad --expires-at '2030-13-45': date/time field value out of range" \
	enqueue work --expires-at 2030-13-45 -c "$conf"
usage_error "^pgjobd: enqueue: bad --timeout '90': missing unit" enqueue work --timeout 90 -c "$conf"
usage_error "^pgjobd: enqueue: bad --timeout '1.5s': fractions" enqueue work --timeout 1.5s -c "$conf"
usage_error "^pgjobd: enqueue: bad --timeout '0': must be more than 0" enqueue work --timeout 0 -c "$conf"
usage_error "^pgjobd: enqueue: bad QUEUE 'a/b'" enqueue a/b -c "$conf"
usage_error "^pgjobd: enqueue: bad QUEUE '$(printf 'q%.0s' {1..64})'" enqueue "$(printf 'q%.0s' {1..64})" -c "$conf"
usage_error "^pgjobd: enqueue: missing QUEUE" enqueue -c "$conf"
usage_error "^pgjobd: enqueue: missing QUEUE" enqueue --data '{}' -c "$conf"
usage_error "^pgjobd: enqueue: unknown option '--prio'; try 'pgjobd enqueue --help'$" enqueue work --prio 1 -c "$conf"
usage_error "^pgjobd: enqueue: option --priority needs a value" enqueue work -c "$conf" --priority
usage_error "^pgjobd: enqueue: option --priority given twice" enqueue work --priority 1 --priority 2 -c "$conf"
usage_error "^pgjobd: status: option --json takes no value" status --json=yes -c "$conf"
usage_error "^pgjobd: enqueue: unexpected argument 'more'" enqueue work more -c "$conf"
usage_error "^pgjobd: unknown command 'enqeue'; try 'pgjobd --help'$" enqeue work -c "$conf"
usage_error "^pgjobd: status: --priority is an option of enqueue; try 'pgjobd status --help'$" status --priority 1 -c "$conf"
usage_error "^pgjobd: enqueue: --json is an option of status; " enqueue work --json -c "$conf"
usage_error "^pgjobd: enqueue: --grant is an option of migrate; " enqueue work --grant -c "$conf"
usage_error "^pgjobd: cancel: --dedupe-key is an option of enqueue; " cancel 1 --dedupe-key x -c "$conf"
usage_error "^pgjobd: run: --data is an option of enqueue; " --data '{}' -c "$conf"
is "$(count_jobs true)" "$njobs" "no usage error inserted a job"
cli --help
ok "$([ "$rc" = 0 ] && [[ $out == usage:* ]] && [[ $out == *--dedupe* ]] &&
	[[ $out == *"pgjobd cancel"* ]] && [[ $out == *--grant* ]] && [[ $out == *--json* ]] &&
	[[ $out == *--json-object* ]] && [[ $out == *"--claim-warn DURATION"* ]]; echo $?)" \
	"--help shows the new subcommands and options"

# ---------------------------------------------------------------- cancel

cli enqueue work -c "$conf"
q=$out
cli cancel "$q" -c "$conf"
is "$rc:$out" "0:cancelled job $q" "cancel of a queued job"
is "$(job_field "$q" "status || ' ' || (finished_at IS NOT NULL) || ' ' || (error->>'reason')")" \
	"cancelled true cancelled" "... the job is cancelled, finished_at and error set"
cli cancel "$q" -c "$conf"
is "$rc:$out:$err" "0:job $q was already cancelled:" \
	"cancel of a cancelled job: what was asked holds, exit 0, says so"
cli cancel "$id" -c "$conf"
is "$rc:$out:$err" "1::pgjobd: cancel: job $id has already finished (status succeeded)" \
	"cancel of a succeeded job: exit 1, says so"
is "$(job_field "$id" status)" succeeded "... and leaves it alone"
cli cancel 987654321 -c "$conf"
is "$rc:$out:$err" "1::pgjobd: cancel: job 987654321 does not exist" "cancel of a missing job: exit 1"
usage_error "^pgjobd: cancel: bad ID 'abc': not an integer; try 'pgjobd cancel --help'$" cancel abc -c "$conf"
usage_error "^pgjobd: cancel: bad ID '12a'" cancel 12a -c "$conf"
usage_error "^pgjobd: cancel: missing ID" cancel -c "$conf"
cli enqueue work -c "$conf"
q1=$out
cli enqueue work -c "$conf"
q2=$out
usage_error "^pgjobd: cancel: bad ID 'x'" cancel "$q1" x -c "$conf"
is "$(job_field "$q1" status)" queued "a bad ID among several: nothing is cancelled"
cli cancel "$q1" 987654321 "$q2" -c "$conf"
is "$rc:$out:$err" "1:cancelled job $q1
cancelled job $q2:pgjobd: cancel: job 987654321 does not exist" \
	"cancel of several jobs: each one, the missing one named, exit 1"
is "$(job_field "$q1" status) $(job_field "$q2" status)" "cancelled cancelled" "... both are cancelled"

# A running job: cancel() records a request for its daemon.
start_daemon d "$conf"
d=$DAEMON_PID
cli enqueue sleepy -c "$conf"
r=$out
wait_until 20 "[ \"\$(job_field $r status)\" = running ]"
ok $? "the sleepy job is running"
cli cancel "$r" -c "$conf"
is "$rc:$out:$err" "0:cancel requested for running job $r:" "cancel of a running job: cancel requested, exit 0"
stop_daemon "$d" 30 >/dev/null

# ---------------------------------------------------------------- database errors

write_conf "$T/nodb.ini" <<EOF
[pgjobd]
database = host=$T/sock port=$PG_PORT dbname=nosuchdb user=postgres
EOF
for c in status "pause beta" "cancel 1" "enqueue work"; do
	cli $c -c "$T/nodb.ini"
	ok "$([ "$rc" = 1 ] && [ -z "$out" ] &&
		[[ $err =~ ^"pgjobd: ${c%% *}: cannot connect to the database: ".*'database "nosuchdb" does not exist' ]]; echo $?)" \
		"$c with a database that does not exist: exit 1, PostgreSQL's message" ||
		diag "  exit status: $rc" "  stdout: $out" "  stderr: $err"
done
PGDATABASE=postgres psql_q "CREATE DATABASE bare"
write_conf "$T/bare.ini" <<EOF
[pgjobd]
database = host=$T/sock port=$PG_PORT dbname=bare user=postgres
EOF
cli status -c "$T/bare.ini"
ok "$([ "$rc" = 1 ] && [ -z "$out" ] &&
	[[ $err =~ ^'pgjobd: status: ERROR:  relation "pgjobd.workers" does not exist' ]] &&
	[[ $err == *"hint: this pgjobd needs schema version $SCHEMA_V: run 'pgjobd migrate -c $T/bare.ini'"* ]]; echo $?)" \
	"status without the schema: exit 1, PostgreSQL's message and a hint" || diag "$err"
cli status -c "$T/missing.ini"
is "$rc" 2 "status with a missing file: exit 2 (configuration)"
like "$err" "hint: status: .*give -c FILE, or name the database with --database CONNINFO or PGDATABASE/PGHOST/PGSERVICE" \
	"... with a hint naming --database and the PG* variables"

# ---------------------------------------------------------------- without a file

# --database, and psql's variables when the default file cannot be opened (here it does
# not exist: the tests never touch /etc/pgjobd).
if [ ! -e /etc/pgjobd/pgjobd.ini ]; then
	cli status --database "$DB_CONNINFO"
	is "$rc" 0 "status --database CONNINFO without any file" || diag "$err"
	cli jobs --database "$DB_CONNINFO" --limit 1
	is "$rc" 0 "jobs --database CONNINFO" || diag "$err"
	cli schedule list --database "$DB_CONNINFO"
	is "$rc" 0 "schedule list --database CONNINFO" || diag "$err"
	PGHOST=$T/sock PGPORT=$PG_PORT PGDATABASE=$(sed -n 's/.*dbname=\([^ ]*\).*/\1/p' <<<"$DB_CONNINFO") PGUSER=postgres \
		cli enqueue work --data '{"via": "env"}'
	is "$rc" 0 "enqueue without a file, PGHOST/PGDATABASE/PGUSER naming the database" || diag "$err"
	[ "$rc" = 0 ] && is "$(job_field "$out" "data->>'via'")" env "... the job is there"
	env -u PGHOST -u PGDATABASE -u PGSERVICE "$PGJOBD" status >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	err=$(cat "$T/err.txt")
	ok "$([ "$rc" = 2 ] && [[ $err == *"/etc/pgjobd/pgjobd.ini: error: cannot open: No such file or directory"* ]] &&
		[[ $err == *"hint: status:"*"--database CONNINFO"* ]]; echo $?)" \
		"without a file or PG* variables: exit 2, the reason and the hint" || diag "$err"
else
	for i in 1 2 3 4 5 6; do pass "# SKIP /etc/pgjobd/pgjobd.ini exists on this machine"; done
fi
usage_error "^pgjobd: reload: --database is an option of " reload --pid 1 --database x

# ---------------------------------------------------------------- connection errors

write_conf "$T/typo.ini" <<EOF
[pgjobd]
database = postgresql://localhost/x?sslmod=disable
EOF
cli status -c "$T/typo.ini"
ok "$([ "$rc" = 2 ] && [[ $err == *"libpq knows no connection parameter \"sslmod\" (did you mean \"sslmode\"?)"* ]]; echo $?)" \
	"a misspelt URI parameter: libpq's reason and the nearest parameter" || diag "$err"
write_conf "$T/nodbkey.ini" <<EOF
[pgjobd]
log_level = info
EOF
PGHOST=$T/no-such-dir cli status -c "$T/nodbkey.ini"
ok "$([ "$rc" = 1 ] && [[ $err == *"hint: status: \`database\` is not set in $T/nodbkey.ini, so libpq's defaults were used"*"host=$T/no-such-dir"* ]]; echo $?)" \
	"database unset: the connection error says libpq's defaults were used, and which" || diag "$err"

# ---------------------------------------------------------------- the daemon, database down

# Before its first connection the daemon retries with backoff (from 100 ms); each session
# logs its reason once, then again only when it changes or every 30 s.
write_conf "$T/down.ini" <<EOF
[pgjobd]
database = host=$T/no-server-here port=$PG_PORT dbname=x
log_level = info

[queue.work]
command = true
EOF
timeout 4 "$PGJOBD" -c "$T/down.ini" >"$T/down.log" 2>&1
nwarn=$(grep -c 'level=warn msg="cannot connect to database"' "$T/down.log")
napps=$(grep 'msg="cannot connect to database"' "$T/down.log" | grep -o 'app="[^"]*"' | sort -u | wc -l)
ok "$([ "$napps" -ge 1 ] && [ "$nwarn" -eq "$napps" ]; echo $?)" \
	"4 s with the database down: one warning per session ($nwarn for $napps sessions)" ||
	diag "$(grep 'cannot connect' "$T/down.log" | head -5)"

# ---------------------------------------------------------------- schedule, jobs, show

cli schedule add nowhere '@daily' no-such-queue -c "$conf"
ok "$([ "$rc" = 0 ] && [[ $err == *"warning: queue no-such-queue is served by no live daemon and has no section in $conf"* ]]; echo $?)" \
	"schedule add warns about a queue nothing serves, as enqueue does" || diag "$rc $err"
fid=$(psql_q "INSERT INTO pgjobd.jobs (queue, status, attempts, finished_at, error)
              VALUES ('work', 'failed', 1, now(), '{\"reason\": \"exit\", \"exit_code\": 3}') RETURNING id")
cli jobs --status failed --queue work -c "$conf"
like "$out" "$fid +work +- +failed +1 .* exit 3 +-\$" "jobs shows the whole reason: exit 3 (then PROGRESS, -)" || diag "$out"
cli enqueue work -c "$conf"
cli show "$out" -c "$conf"
like "$out" $'\n  max_attempts +5 \\(the queue\'s\\)\n' "show prints the queue's max_attempts as a number" || diag "$out"
like "$out" $'\n  timeout +300s \\(the queue\'s\\)\n' "... and its timeout"

done_testing
