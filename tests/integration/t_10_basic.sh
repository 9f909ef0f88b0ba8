#!/usr/bin/env bash
# Basic runs (pgjobd(8)): a job's life queued -> running -> succeeded, results from JSON,
# YAML and plain-text stdout, data on stdin, PGJOBD_* environment, 50 jobs in a row.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/basic.ini
# Jobs start on NOTIFY and retries on their own timer: a slow fallback poll (1 s)
# costs nothing here but spares the CPU the other test files share.
write_conf "$conf" <<EOF
$(conf_header poll_interval=1s)

[queue.slow]
command = echo started; while [ ! -e '$T/go' ]; do sleep 0.05; done; echo done

[queue.echo]
command = echo "\$PGJOBD_ARG_n"
concurrency = 8

[queue.json]
command = printf '{"a":1}'

[queue.yaml]
command = printf 'a: 1\nb: [x, true]\n'

[queue.text]
command = echo hello

[queue.stdin]
command = cat

[queue.env]
command = /bin/sh '$T/env.sh'
max_attempts = 4
EOF

# Kept in a file: an INI line must stay under inih's 200 bytes.
cat >"$T/env.sh" <<'EOF'
printf '%s|' "$PGJOBD_JOB_ID" "$PGJOBD_QUEUE" "$PGJOBD_ATTEMPT" "$PGJOBD_MAX_ATTEMPTS" \
	"$PGJOBD_GROUP_ID" "$PGJOBD_ARG_name" "$PGJOBD_ARG_num" "$PGJOBD_ARG_flag" \
	"${PGJOBD_ARG_obj-unset}"
env | grep -c '^PGJOBD_ARG_' || true
EOF

pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate"
is "$(psql_q "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgjobd'")" 1 "schema pgjobd exists"
pgjobd_migrate "$conf" >>"$T/migrate.log" 2>&1
ok $? "pgjobd migrate again (idempotent)"

# Enqueued before any daemon runs: it must stay queued.
slow=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('slow') RETURNING id")
like "$slow" '^[0-9]+$' "INSERT returns an id"
is "$(job_field "$slow" "status || ' ' || attempts || ' ' || (started_at IS NULL) || ' ' || (finished_at IS NULL) || ' ' || data::text")" \
	"queued 0 true true {}" "a new job is queued, attempts 0, data defaults to {}"

start_daemon d "$conf"
d=$DAEMON_PID

wait_until 20 "[ \"\$(job_field $slow status)\" = running ]"
ok $? "the job goes to running"
is "$(job_field "$slow" "attempts || ' ' || (started_at IS NOT NULL) || ' ' || (finished_at IS NULL)")" \
	"1 true true" "running: attempts counted at start, started_at set, finished_at not"
worker=$(job_field "$slow" worker)
like "$worker" "^[^:]+:$d:[^:]+\$" "worker is host:pid:slot with the daemon's pid ($worker)"
touch "$T/go"
wait_until 20 "[ \"\$(job_field $slow status)\" = succeeded ]"
ok $? "the job goes to succeeded"
is "$(job_field "$slow" "result::text")" '{"stdout": "started\ndone"}' "text result, one trailing newline removed"
is "$(job_field "$slow" "attempts || ' ' || (finished_at >= started_at) || ' ' || (error IS NULL)")" \
	"1 true true" "succeeded: attempts 1, finished_at >= started_at, no error"

psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'echo', jsonb_build_object('n', g) FROM generate_series(1, 50) g"
wait_until 30 "[ \"\$(count_jobs \"queue = 'echo' AND status = 'succeeded'\")\" = 50 ]"
ok $? "50 echo jobs succeed"
is "$(count_jobs "queue = 'echo' AND (result->>'stdout' IS DISTINCT FROM data->>'n' OR attempts <> 1 OR finished_at IS NULL)")" \
	0 "each echo job printed its own PGJOBD_ARG_n, in one attempt"

run_one() { # QUEUE [DATA [GROUP [MAX_ATTEMPTS]]] -> prints the id once the job finished
	local data=${2:-'{}'} group=NULL max=NULL id
	[ -n "${3:-}" ] && group=$(sql_lit "$3")
	[ -n "${4:-}" ] && max=$4
	id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data, group_id, max_attempts) VALUES ($(sql_lit "$1"), $(sql_lit "$data"), $group, $max) RETURNING id")
	wait_until 20 "job_field $id \"status IN ('succeeded', 'failed', 'cancelled')\" | grep -qx t"
	echo "$id"
}

id=$(run_one json)
is "$(job_field "$id" "status || ' ' || (result = '{\"a\": 1}'::jsonb) || ' ' || jsonb_typeof(result->'a')")" \
	"succeeded true number" "JSON stdout becomes result"
id=$(run_one yaml)
is "$(job_field "$id" "status || ' ' || (result = '{\"a\": 1, \"b\": [\"x\", true]}'::jsonb) || ' ' || jsonb_typeof(result->'b'->1)")" \
	"succeeded true boolean" "YAML stdout becomes result (typed scalars)"
id=$(run_one text)
is "$(job_field "$id" "status || ' ' || result::text")" 'succeeded {"stdout": "hello"}' "text stdout becomes {\"stdout\": ...}"
id=$(run_one stdin '{"k": "v", "n": [1, 2.5, null], "s": "é \"q\""}')
is "$(job_field "$id" "status || ' ' || (result = data)")" "succeeded true" "stdin carries data as JSON"
id=$(run_one env '{"name": "world", "num": 42, "flag": true, "obj": {"x": 1}, "bad-key": "x"}' grp 3)
is "$(job_field "$id" "status || ' ' || (result->>'stdout')")" \
	"succeeded $id|env|1|3|grp|world|42|true|unset|3" \
	"PGJOBD_JOB_ID/QUEUE/ATTEMPT/MAX_ATTEMPTS/GROUP_ID and PGJOBD_ARG_ (scalars, valid keys only)"
id=$(run_one env '{}')
like "$(job_field "$id" "result->>'stdout'")" "^$id\\|env\\|1\\|4\\|\\|" "queue max_attempts, empty group id"
id=$(run_one env '{}' grp2 9)
like "$(job_field "$id" "result->>'stdout'")" "^$id\\|env\\|1\\|4\\|" \
	"a job's max_attempts cannot raise the queue's (a ceiling)"

pid_alive "$d"
ok $? "the daemon is still running"
stop_daemon "$d"
is $? 0 "SIGTERM: the daemon exits 0"
is "$(count_jobs "status NOT IN ('succeeded')")" 0 "every job succeeded"

done_testing
