#!/usr/bin/env bash
# Roles (pgjobd(8), sql/003_job_control.sql): pgjobd.setup_roles() creates pgjobd_producer
# and pgjobd_worker. A producer may INSERT a job's input columns and read jobs (outcome
# included) and queue_stats, and nothing else: updating status or result, deleting,
# setting pgjobd's own columns, TRUNCATE, the operator functions, the side tables, DDL
# are refused. A daemon whose database user is only a worker runs the protocol (claims,
# groups, cancel, pause/resume, maintenance) but cannot drop, alter or create anything.
# Nothing a producer writes can name a command or reach the command's environment other
# than as PGJOBD_ARG_*. SELECT * as a producer works on pgjobd.my_jobs (not on the table).
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # it creates pgjobd's roles and others (cluster-wide)
pg_start

# Migrated as the superuser; the daemon below connects as the worker role.
write_conf "$T/admin.ini" <<EOF
$(conf_header)

[queue.hello]
command = true
EOF
pgjobd_migrate "$T/admin.ini" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate (as the superuser)"

psql_q "SELECT pgjobd.setup_roles()" >"$T/setup.log" 2>&1
ok $? "SELECT pgjobd.setup_roles()" || diag "$(cat "$T/setup.log")"
is "$(psql_q "SELECT string_agg(rolname || ':' || rolcanlogin || ':' || rolsuper, ' ' ORDER BY rolname)
                FROM pg_roles WHERE rolname IN ('pgjobd_producer', 'pgjobd_worker')")" \
	"pgjobd_producer:false:false pgjobd_worker:false:false" \
	"setup_roles created the two NOLOGIN, non-superuser group roles"
psql_q "CREATE ROLE app LOGIN IN ROLE pgjobd_producer; CREATE ROLE wrk LOGIN IN ROLE pgjobd_worker"
ok $? "login roles app (producer) and wrk (worker)"
# A new installation grants producers no queue (t_94_attacks.sh tests per-queue grants);
# here every producer may use every queue, the single-team choice.
is "$(psql_q "SELECT pgjobd.grant_queue('pgjobd_producer', '*')")" t \
	"SELECT pgjobd.grant_queue('pgjobd_producer', '*'): every producer, every queue"

# as USER SQL: run SQL as USER; prints output (errors with their SQLSTATE) and returns
# psql's exit status.
as() {
	local user=$1
	shift
	psql -X -qAt -U "$user" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$1" 2>&1
}

# refused USER SQL NAME: SQL as USER fails with SQLSTATE 42501 (insufficient_privilege:
# "permission denied for ..." or "must be owner of ..."), not with any other error.
refused() {
	local user=$1 sql=$2 name=$3 out status
	out=$(as "$user" "$sql")
	status=$?
	[ "$status" != 0 ] && [[ $out =~ ERROR:\ +42501:\ +(permission\ denied|must\ be\ owner) ]]
	ok $? "$name" || diag "  as $user: $sql" "  exit status: $status" "  output: $out"
}

# ---------------------------------------------------------------- producer, no daemon yet

is "$(as app "SELECT current_user || ' ' || pg_has_role('app', 'pgjobd_producer', 'MEMBER') || ' ' || rolsuper FROM pg_roles WHERE rolname = current_user")" \
	"app true false" "psql -U app connects as app, a non-superuser member of pgjobd_producer"

# A queue no daemon serves keeps these jobs queued.
pj=$(as app "INSERT INTO pgjobd.jobs (queue, group_id, data, priority, run_at, expires_at,
                  max_attempts, timeout, dedupe_key)
              VALUES ('nobody', 'pg', '{\"a\": 1}', 5, now(), now() + interval '1 day', 3,
                  interval '1 minute', 'pk') RETURNING id")
like "$pj" '^[0-9]+$' "producer: INSERT of every input column with RETURNING id works" || diag "$pj"
is "$(psql_q "SELECT queue || ' ' || group_id || ' ' || data::text || ' ' || priority || ' ' ||
                     max_attempts || ' ' || timeout || ' ' || dedupe_key || ' ' || status || ' ' || attempts
                FROM pgjobd.jobs WHERE id = ${pj:-0}")" \
	'nobody pg {"a": 1} 5 3 00:01:00 pk queued 0' "the producer's row holds what it inserted, queued"
is "$(as app "SELECT status || ' ' || attempts || ' ' || (result IS NULL) || ' ' || (error IS NULL) || ' ' ||
                     (started_at IS NULL) FROM pgjobd.jobs WHERE id = ${pj:-0}")" \
	"queued 0 true true true" "producer: reads status, attempts, result, error, started_at"
# SELECT * on the table is refused (the daemons' columns are not a producer's);
# pgjobd.my_jobs has every column a producer may read, and only its own rows.
refused app "SELECT * FROM pgjobd.jobs" "producer: SELECT * FROM pgjobd.jobs is refused (the worker column)"
is "$(as app "SELECT count(*) FILTER (WHERE id = ${pj:-0}) || ' ' || count(*) FILTER (WHERE created_by <> 'app')
                FROM (SELECT * FROM pgjobd.my_jobs) j")" "1 0" \
	"producer: SELECT * FROM pgjobd.my_jobs works, its own jobs only"
is "$(psql_q "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
                WHERE attrelid = 'pgjobd.jobs'::regclass AND attnum > 0 AND NOT attisdropped
                  AND has_column_privilege('pgjobd_producer', 'pgjobd.jobs', attname, 'SELECT')")" \
	"$(psql_q "SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
                 WHERE attrelid = 'pgjobd.my_jobs'::regclass AND attnum > 0")" \
	"pgjobd.my_jobs has exactly the columns a producer may read"
like "$(as app "SELECT queue || ':' || queued FROM pgjobd.queue_stats WHERE queue = 'nobody'")" \
	'^nobody:[0-9]+$' "producer: SELECT from pgjobd.queue_stats works"
is "$(psql_q "SELECT count(*) FROM pgjobd.groups WHERE queue = 'nobody' AND group_id = 'pg'")" 0 \
	"producer's grouped insert writes no pgjobd.groups row (the group's first claim does)"

d1=$(as app "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('nobody', 'dk') RETURNING id")
like "$d1" '^[0-9]+$' "producer: a first insert with dedupe_key 'dk' inserts" || diag "$d1"
d2=$(as app "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('nobody', 'dk') RETURNING id")
s=$?
is "$s:$d2" "0:" "producer: a second insert with the same key inserts nothing and raises no error"
is "$(count_jobs "queue = 'nobody' AND dedupe_key = 'dk'")" 1 "exactly one job with dedupe_key 'dk'"

# A producer reads its own jobs only (row-level security on created_by).
psql_q "CREATE ROLE app2 LOGIN IN ROLE pgjobd_producer"
is "$(job_field "$pj" created_by)" app "created_by records the inserting role"
o2=$(as app2 "INSERT INTO pgjobd.jobs (queue, data) VALUES ('nobody', '{\"secret\": 2}') RETURNING id")
like "$o2" '^[0-9]+$' "a second producer inserts a job" || diag "$o2"
is "$(as app2 "SELECT count(*) FROM pgjobd.jobs WHERE id = ${pj:-0}")" 0 "... and cannot see the first producer's job"
is "$(as app2 "SELECT string_agg(id::text, ' ') FROM pgjobd.jobs")" "$o2" "... it sees exactly its own job"
is "$(as app "SELECT count(*) FROM pgjobd.jobs WHERE id = ${o2:-0}")" 0 "the first producer cannot see the second's job"
is "$(as app2 "SELECT status FROM pgjobd.jobs WHERE id = ${o2:-0}")" queued "a producer reads its own job's status"
refused app "INSERT INTO pgjobd.jobs (queue, created_by) VALUES ('nobody', 'app2')" \
	"producer: INSERT setting created_by (posing as another producer) is refused"
# Dedupe keys are each producer's own unless the queue is declared shared
# (t_94_producers.sh has the attacks).
d3=$(as app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('nobody', 'dk') RETURNING id")
like "$d3" '^[0-9]+$' "dedupe keys are the producer's own: another producer's unfinished job with the key does not swallow the INSERT"
psql_q "DELETE FROM pgjobd.jobs WHERE id = ${d3:-0}; SELECT pgjobd.share_queue('nobody')" >/dev/null
d3=$(as app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('nobody', 'dk') RETURNING id")
is "$?:$d3" "0:" "in a queue declared shared, dedupe holds across producers (another producer's unfinished job has the key)"
psql_q "SELECT pgjobd.share_queue('nobody', false)" >/dev/null
psql_q "DELETE FROM pgjobd.jobs WHERE id = ${o2:-0}" >/dev/null

njobs=$(count_jobs true)
refused app "UPDATE pgjobd.jobs SET status = 'succeeded' WHERE id = $pj" "producer: UPDATE status is refused"
refused app "UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id = $pj" "producer: UPDATE status to cancelled is refused"
refused app "UPDATE pgjobd.jobs SET result = '{\"forged\": true}' WHERE id = $pj" "producer: UPDATE result is refused"
refused app "UPDATE pgjobd.jobs SET data = '{}' WHERE id = $pj" "producer: UPDATE data is refused"
refused app "DELETE FROM pgjobd.jobs WHERE id = $pj" "producer: DELETE is refused"
for col in "status:'succeeded'" "result:'{\"forged\": true}'" "error:'{\"reason\": \"x\"}'" \
	"attempts:7" "worker:'evil:1:1'" "started_at:now()" "finished_at:now()"; do
	refused app "INSERT INTO pgjobd.jobs (queue, ${col%%:*}) VALUES ('nobody', ${col#*:})" \
		"producer: INSERT setting ${col%%:*} is refused"
done
refused app "TRUNCATE pgjobd.jobs" "producer: TRUNCATE is refused"
refused app "SELECT pgjobd.cancel($pj)" "producer: SELECT pgjobd.cancel(id) is refused"
refused app "SELECT pgjobd.pause('nobody')" "producer: SELECT pgjobd.pause(queue) is refused"
refused app "SELECT pgjobd.resume('nobody')" "producer: SELECT pgjobd.resume(queue) is refused"
refused app "SELECT * FROM pgjobd.maintain('{nobody}', '{1}', 500)" "producer: pgjobd.maintain() is refused"
refused app "SELECT * FROM pgjobd.claim_batch('nobody', 1, '{x:1:0}', 1, 0, 1024, 10, false, '{}', '{}', '{}')" \
	"producer: pgjobd.claim_batch() is refused"
refused app "INSERT INTO pgjobd.groups (queue, group_id) VALUES ('nobody', 'forged')" \
	"producer: INSERT into pgjobd.groups is refused"
refused app "SELECT * FROM pgjobd.cancel_requests" "producer: SELECT from pgjobd.cancel_requests is refused"
refused app "INSERT INTO pgjobd.paused_queues (queue) VALUES ('nobody')" \
	"producer: INSERT into pgjobd.paused_queues is refused"
refused app "SELECT worker FROM pgjobd.jobs" "producer: reading worker (host:pid:slot) is refused"
refused app "DROP TABLE pgjobd.jobs" "producer: DROP TABLE is refused"
refused app "ALTER TABLE pgjobd.jobs ADD COLUMN command text" "producer: ALTER TABLE is refused"
refused app "CREATE TABLE pgjobd.x (y int)" "producer: CREATE TABLE in schema pgjobd is refused"
refused app "SELECT pgjobd.setup_roles()" "producer: SELECT pgjobd.setup_roles() is refused"
is "$(count_jobs true)" "$njobs" "after the refusals: no job was added or deleted"
is "$(job_field "$pj" "status || ' ' || (result IS NULL) || ' ' || data::text")" 'queued true {"a": 1}' \
	"after the refusals: the job is unchanged"
is "$(psql_q "SELECT (SELECT count(*) FROM pgjobd.paused_queues) || ' ' ||
                     (SELECT count(*) FROM pgjobd.groups WHERE group_id = 'forged')")" "0 0" \
	"after the refusals: nothing paused, no forged group row"

# Nothing in a row can name a command: the table's columns are exactly these.
is "$(psql_q "SELECT string_agg(column_name, ' ' ORDER BY ordinal_position) FROM information_schema.columns
               WHERE table_schema = 'pgjobd' AND table_name = 'jobs'")" \
	"id queue group_id data priority run_at expires_at max_attempts timeout dedupe_key status attempts result error worker created_at started_at finished_at updated_at created_by worker_id fence held_until schedule scheduled_for commit_seq enqueued_xact history lease_until lease_ms group_key progress" \
	"pgjobd.jobs has exactly the documented columns (none names a command or environment)"
# The columns a producer may write are exactly the documented input columns.
is "$(psql_q "SELECT string_agg(column_name, ' ' ORDER BY column_name) FROM information_schema.column_privileges
               WHERE table_schema = 'pgjobd' AND table_name = 'jobs' AND grantee = 'pgjobd_producer'
                 AND privilege_type = 'INSERT'")" \
	"data dedupe_key expires_at group_id max_attempts priority queue run_at timeout" \
	"pgjobd_producer may INSERT exactly the input columns"
is "$(psql_q "SELECT coalesce(string_agg(privilege_type, ' ' ORDER BY privilege_type), '-')
                FROM information_schema.table_privileges
               WHERE table_schema = 'pgjobd' AND table_name = 'jobs' AND grantee = 'pgjobd_producer'")" \
	"-" "pgjobd_producer has no table-wide privilege on pgjobd.jobs"

# The INSERT trigger runs as its owner (SECURITY DEFINER): a producer's search_path
# must not lend it a function or an operator. app puts a schema of its own first, with a pg_notify(text, text) and a text = operator
# that record who calls them, and inserts while a daemon is registered as waiting for
# the queue, so that the trigger takes its full path (the NOTIFY lookup).
psql_q "CREATE SCHEMA evil AUTHORIZATION app" >/dev/null
as app "CREATE TABLE evil.calls (who text);
	CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE sql
	    AS 'INSERT INTO evil.calls VALUES (current_user)';
	CREATE FUNCTION evil.eq(text, text) RETURNS boolean LANGUAGE plpgsql
	    AS 'BEGIN INSERT INTO evil.calls VALUES (current_user); RETURN \$1 OPERATOR(pg_catalog.=) \$2; END';
	CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.eq)" >"$T/evil.log" 2>&1
ok $? "app creates schema evil with pg_notify() and = for text" || diag "$(cat "$T/evil.log")"
is "$(as app "SET search_path = evil, pg_catalog; SELECT pg_notify('a', 'b'), 'a' = 'a';
              SELECT string_agg(who, ' ') FROM evil.calls; TRUNCATE evil.calls")" "|t
app app" "with that search_path, unqualified pg_notify() and = are app's"
psql_q "INSERT INTO pgjobd.waiting (queue, pid) VALUES ('nobody', 1)" >/dev/null
ev=$(as app "SET search_path = evil, pg_catalog;
             INSERT INTO pgjobd.jobs (queue) VALUES ('nobody'), ('nobody') RETURNING id" | tr '\n' ' ')
like "$ev" '^[0-9]+ [0-9]+ $' "app inserts two jobs with that search_path" || diag "$ev"
is "$(psql_q "SELECT count(*) FROM evil.calls")" 0 "the INSERT trigger called none of app's functions"
psql_q "SET client_min_messages = warning; DELETE FROM pgjobd.waiting WHERE queue = 'nobody' AND pid = 1;
        UPDATE pgjobd.jobs SET status = 'cancelled' WHERE id IN ($(echo $ev | tr ' ' ',')); DROP SCHEMA evil CASCADE" >/dev/null
ok $? "cleaned up"

# ---------------------------------------------------------------- a daemon as the worker role

cat >"$T/env.sh" <<EOF
/usr/bin/env >'$T/env.'"\$PGJOBD_JOB_ID.tmp"
mv '$T/env.'"\$PGJOBD_JOB_ID.tmp" '$T/env.'"\$PGJOBD_JOB_ID"
EOF
printf 'touch %q\n' "$T/pwned-bash-env" >"$T/bashenv.sh"

WRK_CONNINFO="host=$T/sock port=$PGPORT dbname=$PGDATABASE user=wrk"
write_conf "$T/wrk.ini" <<EOF
$(conf_header database="$WRK_CONNINFO")

[queue.hello]
command = echo "hello from \$PGJOBD_QUEUE \$PGJOBD_ARG_who"
concurrency = 2

[queue.grp]
command = echo "group \$PGJOBD_GROUP_ID"

[queue.long]
command = echo \$\$ > '$T/long.pid'; exec sleep 300
kill_grace = 5s

[queue.pq]
command = echo resumed

[queue.exp]
command = touch '$T/exp-ran'

[queue.envq]
command = /bin/bash '$T/env.sh'

[queue.tmp]
command = echo short-lived
retention = 1s
EOF
start_daemon d "$T/wrk.ini" SECRET_DAEMON_VAR=leak PGPASSWORD=secret
d=$DAEMON_PID

wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgjobd maintenance'\")\" = 1 ]"
ok $? "the daemon's maintenance session is connected"
is "$(psql_q "SELECT coalesce(string_agg(DISTINCT usename, ' '), '-') FROM pg_stat_activity
               WHERE application_name LIKE 'pgjobd%' OR pid IN (SELECT pid FROM pgjobd.waiting)")" \
	"wrk" "every session of the daemon is the worker role wrk"

h=$(as app "INSERT INTO pgjobd.jobs (queue, data) VALUES ('hello', '{\"who\": \"app\"}') RETURNING id")
g1=$(as app "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('grp', 'g-1') RETURNING id")
g2=$(as app "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('grp', 'g-1') RETURNING id")
wait_until 20 "[ \"\$(count_jobs \"id IN (${h:-0}, ${g1:-0}, ${g2:-0}) AND status IN ('succeeded', 'failed', 'cancelled')\")\" = 3 ]"
ok $? "the producer's jobs (one ungrouped, two of one group) finish under a worker-role daemon"
is "$(as app "SELECT status || ' ' || attempts || ' ' || (error IS NULL) || ' ' || (result->>'stdout') FROM pgjobd.jobs WHERE id = ${h:-0}")" \
	"succeeded 1 true hello from hello app" "producer reads the outcome: succeeded, result from stdout"
is "$(as app "SELECT string_agg(status || ':' || (result->>'stdout'), ',' ORDER BY id) FROM pgjobd.jobs WHERE id IN (${g1:-0}, ${g2:-0})")" \
	"succeeded:group g-1,succeeded:group g-1" "the grouped jobs succeeded"
is "$(psql_q "SELECT (SELECT started_at FROM pgjobd.jobs WHERE id = ${g2:-0}) >= (SELECT finished_at FROM pgjobd.jobs WHERE id = ${g1:-0})")" \
	t "the group's second job started after the first finished"

# cancel() of a running job, as the worker role.
L=$(as app "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
wait_until 20 "[ \"\$(job_field ${L:-0} status)\" = running ] && [ -s '$T/long.pid' ]"
ok $? "the long job runs"
lpid=$(cat "$T/long.pid" 2>/dev/null)
pid_alive "$lpid"
ok $? "its command (sleep 300, pid $lpid) is alive"
is "$(as wrk "SELECT pgjobd.cancel(${L:-0})")" t "worker: SELECT pgjobd.cancel(id) of the running job returns true"
wait_until 15 "[ \"\$(job_field ${L:-0} status)\" = cancelled ]"
ok $? "the running job ends cancelled"
is "$(job_field "${L:-0}" "error->>'reason'")" cancelled "error->>'reason' = 'cancelled'"
wait_until 10 "! pid_alive $lpid"
ok $? "its command was terminated"

# pause/resume, as the worker role. A job of another queue, inserted after the paused
# one, finishing shows that the daemon was claiming meanwhile.
is "$(as wrk "SELECT pgjobd.pause('pq')")" t "worker: SELECT pgjobd.pause('pq') returns true"
is "$(as wrk "SELECT paused FROM pgjobd.queue_stats WHERE queue = 'pq'")" t "queue_stats (read by the worker) says pq is paused"
P=$(as app "INSERT INTO pgjobd.jobs (queue) VALUES ('pq') RETURNING id")
H2=$(as app "INSERT INTO pgjobd.jobs (queue, data) VALUES ('hello', '{\"who\": \"x\"}') RETURNING id")
wait_until 20 "[ \"\$(job_field ${H2:-0} status)\" = succeeded ]"
ok $? "a job of an unpaused queue, inserted later, succeeds"
wait_until 1.5 "[ \"\$(job_field ${P:-0} status)\" != queued ]" 2>/dev/null
is "$(job_field "${P:-0}" "status || ' ' || attempts")" "queued 0" "the job of the paused queue stays queued"
is "$(as wrk "SELECT pgjobd.resume('pq')")" t "worker: SELECT pgjobd.resume('pq') returns true"
wait_until 20 "[ \"\$(job_field ${P:-0} status)\" = succeeded ]"
ok $? "after resume the job runs and succeeds"

# Maintenance as the worker role: expiry and retention.
E=$(as app "INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('exp', now() - interval '1 second') RETURNING id")
wait_until 20 "[ \"\$(job_field ${E:-0} status)\" = cancelled ]"
ok $? "an expired job ends cancelled (maintenance runs as the worker)"
is "$(job_field "${E:-0}" "(error->>'reason') || ' ' || attempts || ' ' || (finished_at IS NOT NULL)")" \
	"expired 0 true" "reason expired, attempts 0, finished_at set"
[ ! -e "$T/exp-ran" ]
ok $? "the expired job's command never ran"
R=$(as app "INSERT INTO pgjobd.jobs (queue) VALUES ('tmp') RETURNING id")
wait_until 20 "[ \"\$(job_field ${R:-0} status)\" = succeeded ] || [ \"\$(count_jobs \"id = ${R:-0}\")\" = 0 ]"
ok $? "a job of the queue with retention = 1s ran"
wait_until 20 "[ \"\$(count_jobs \"id = ${R:-0}\")\" = 0 ]"
ok $? "and is deleted after its retention (maintenance deletes as the worker)"

# The data reaches the command only as PGJOBD_ARG_*.
evil=$(printf '{"PATH": "/nonexistent", "LD_PRELOAD": "/tmp/x.so", "PGJOBD_QUEUE": "evil", "PGJOBD_JOB_ID": "0", "HOME": "/evil", "command": "touch %s/pwned", "BASH_ENV": "%s/bashenv.sh"}' "$T" "$T")
V=$(as app "INSERT INTO pgjobd.jobs (queue, data) VALUES ('envq', $(sql_lit "$evil")) RETURNING id")
wait_until 20 "[ -s '$T/env.${V:-0}' ] && [ \"\$(job_field ${V:-0} status)\" = succeeded ]"
ok $? "the env-dumping job succeeded"
envout=$(cat "$T/env.${V:-0}" 2>/dev/null)
envline() { grep -E "^$1=" <<<"$envout"; }
is "$(envline PATH)" "PATH=/usr/local/bin:/usr/bin:/bin" "PATH is the daemon's clean one"
is "$(envline LD_PRELOAD)" "" "no LD_PRELOAD"
is "$(envline BASH_ENV)" "" "no BASH_ENV"
isnt "$(envline HOME)" "HOME=/evil" "HOME is not the data's"
is "$(envline PGJOBD_QUEUE)" "PGJOBD_QUEUE=envq" "PGJOBD_QUEUE is the real queue"
is "$(envline PGJOBD_JOB_ID)" "PGJOBD_JOB_ID=$V" "PGJOBD_JOB_ID is the real id"
is "$(envline PGJOBD_ARG_PATH)" "PGJOBD_ARG_PATH=/nonexistent" "data's PATH arrives as PGJOBD_ARG_PATH"
is "$(envline PGJOBD_ARG_LD_PRELOAD)" "PGJOBD_ARG_LD_PRELOAD=/tmp/x.so" "data's LD_PRELOAD arrives as PGJOBD_ARG_LD_PRELOAD"
is "$(envline PGJOBD_ARG_command)" "PGJOBD_ARG_command=touch $T/pwned" "data's command arrives as PGJOBD_ARG_command"
is "$(envline PGJOBD_ARG_BASH_ENV)" "PGJOBD_ARG_BASH_ENV=$T/bashenv.sh" "data's BASH_ENV arrives as PGJOBD_ARG_BASH_ENV"
is "$(envline PGJOBD_ARG_PGJOBD_QUEUE)" "PGJOBD_ARG_PGJOBD_QUEUE=evil" "data's PGJOBD_QUEUE arrives as PGJOBD_ARG_PGJOBD_QUEUE"
is "$(grep -E '^(SECRET_DAEMON_VAR|PG[A-Z]*)=' <<<"$envout" | grep -v '^PGJOBD_')" "" \
	"none of the daemon's variables (SECRET_DAEMON_VAR, PGPASSWORD, PGHOST, ...) reach the command"
[ ! -e "$T/pwned" ] && [ ! -e "$T/pwned-bash-env" ]
ok $? "nothing in the data was executed (\$T/pwned and \$T/pwned-bash-env do not exist)"

# ---------------------------------------------------------------- the worker role's limits

ntables=$(psql_q "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgjobd'")
ntriggers=$(psql_q "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgjobd.jobs'::regclass AND NOT tgisinternal")
refused wrk "DROP TABLE pgjobd.jobs" "worker: DROP TABLE is refused"
refused wrk "DROP TABLE pgjobd.groups" "worker: DROP TABLE pgjobd.groups is refused"
refused wrk "ALTER TABLE pgjobd.jobs ADD COLUMN command text" "worker: ALTER TABLE is refused"
refused wrk "ALTER TABLE pgjobd.jobs DISABLE TRIGGER USER" "worker: ALTER TABLE ... DISABLE TRIGGER is refused"
refused wrk "TRUNCATE pgjobd.jobs" "worker: TRUNCATE is refused"
refused wrk "CREATE TABLE pgjobd.x (y int)" "worker: CREATE TABLE in schema pgjobd is refused"
refused wrk "CREATE OR REPLACE FUNCTION pgjobd.pause(p_queue text) RETURNS boolean LANGUAGE sql AS 'SELECT true'" \
	"worker: replacing a pgjobd function is refused"
refused wrk "DROP SCHEMA pgjobd CASCADE" "worker: DROP SCHEMA is refused"
refused wrk "UPDATE pgjobd.schema_version SET version = 1" "worker: UPDATE schema_version is refused"
is "$(psql_q "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgjobd'")" \
	"$ntables" "after the refusals: schema pgjobd has the same relations"
is "$(psql_q "SELECT count(*) FILTER (WHERE tgenabled = 'O') || ' of ' || count(*) FROM pg_trigger
               WHERE tgrelid = 'pgjobd.jobs'::regclass AND NOT tgisinternal")" \
	"$ntriggers of $ntriggers" "every pgjobd.jobs trigger is still enabled ($ntriggers)"

# ---------------------------------------------------------------- idempotence

psql_q "SELECT pgjobd.setup_roles()" >"$T/setup2.log" 2>&1
ok $? "SELECT pgjobd.setup_roles() again: no error" || diag "$(cat "$T/setup2.log")"
psql_q "SELECT pgjobd.setup_roles()" >>"$T/setup2.log" 2>&1
ok $? "and a third time" || diag "$(cat "$T/setup2.log")"
h3=$(as app "INSERT INTO pgjobd.jobs (queue, data) VALUES ('hello', '{\"who\": \"again\"}') RETURNING id")
wait_until 20 "[ \"\$(job_field ${h3:-0} status)\" = succeeded ]"
ok $? "afterwards a producer's job still runs under the worker-role daemon"
refused app "UPDATE pgjobd.jobs SET status = 'queued' WHERE id = ${h3:-0}" "afterwards the producer still cannot UPDATE status"

# `pgjobd jobs` and `show` as a producer: the worker column is not the producer's to read,
# so it shows as none; the rest is there.
write_conf "$T/app.ini" <<EOF
[pgjobd]
database = host=$T/sock port=$PGPORT dbname=$PGDATABASE user=app
EOF
out=$("$PGJOBD" jobs --queue hello -c "$T/app.ini" 2>&1)
is "$?:$(echo "$out" | awk -v id="${h3:-0}" '$1 == id { print $2, $4, $7 }')" "0:hello succeeded -" \
	"pgjobd jobs as a producer: its job, with no worker"
out=$("$PGJOBD" jobs --json --queue hello -c "$T/app.ini" 2>&1)
is "$?:$(echo "$out" | jq -r --argjson id "${h3:-0}" '.[] | select(.id == $id) | "\(.status) \(.worker)"')" \
	"0:succeeded null" "pgjobd jobs --json as a producer: worker null"
out=$("$PGJOBD" show "${h3:-0}" -c "$T/app.ini" 2>&1)
is "$?:$(echo "$out" | awk '$1 == "status" && !s { s = $2 } $1 == "worker" && !w { w = $2 }
	END { print "status=" s, "worker=" w }')" \
	"0:status=succeeded worker=-" "pgjobd show as a producer: the job, worker -"
out=$("$PGJOBD" show --json "${h3:-0}" -c "$T/app.ini" 2>&1)
is "$?:$(echo "$out" | jq -r '"\(.status) \(.worker) \(.history | length)"')" "0:succeeded null 1" \
	"pgjobd show --json as a producer: worker null, the history there"
out=$("$PGJOBD" show "${h3:-0}" -c "$T/wrk.ini" 2>&1)
like "$(echo "$out" | awk '$1 == "worker" { print $2; exit }')" ':hello[.][0-9]+$' "pgjobd show as the worker role: the worker"

is "$(grep -c 'level=error\|maintenance pass failed\|permission denied' "$T/d.log")" 0 \
	"the daemon logged no error, no failed maintenance pass, no permission problem"
pid_alive "$d"
ok $? "the daemon is still running"
stop_daemon "$d"
is $? 0 "SIGTERM: the daemon exits 0"

done_testing
