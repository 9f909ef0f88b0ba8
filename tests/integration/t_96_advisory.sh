#!/usr/bin/env bash
# Advisory locks (pgjobd(8), SECURITY MODEL; sql/009_row_locks.sql): any role may take any
# advisory lock, and pg_locks shows every key held, so pgjobd takes none, and no role
# without pgjobd rights, nor a producer, can delay a job by holding one.
#
#   the attack   A stranger (a role with no pgjobd grant), then a producer, holds in an
#                open session every key versions 1 to 8 used: classes 1886020100 to
#                1886020108 with every id in use (jobs, group rows) and then some, and the
#                hashes of the queue, group and dedupe key names in use. While it does,
#                200 jobs of a grouped and an ungrouped queue all run (new groups
#                included), maintenance expires a job and deletes old finished ones,
#                another producer's INSERT with a dedupe key returns at once with the
#                right effect, and `pgjobd migrate` returns at once.
#   absence      While a daemon runs a busy mix (groups, dedupe inserts, maintenance),
#                pg_locks never shows an advisory lock; no function of schema pgjobd
#                mentions one.
#   row locks    What replaces them cannot be taken by a producer or a stranger: they may
#                not lock rows of, LOCK, or reference pgjobd.maintenance_lock,
#                pgjobd.dedupe_locks, pgjobd.jobs or pgjobd.groups.
#   dedupe       8 producers insert one key at once: one row, no error; a producer that
#                keeps its transaction open makes the others wait and then insert
#                nothing (also with its constraints IMMEDIATE); a rolled-back insert
#                leaves the key free; a key held open in one queue does not delay the
#                same key in another; nothing stays in pgjobd.dedupe_locks.
#   groups       Without bridges a group stays exclusive between a claim's commit and its
#                slot's hold: a job of the group that becomes its head meanwhile (a
#                transaction that commits late with a smaller id) does not start while
#                the claimed job runs.
#   migrate      Four `pgjobd migrate` at once on a database without the schema all
#                succeed (serialised by a table lock, not an advisory lock; those that
#                lose the race to create the schema try again), three times; one whose
#                CREATE fails with another error as another session makes the table
#                tries again too; a role that may not create it is told so at once.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
# The attackers below hold up to about 13,000 advisory locks at once, more than the
# default lock table of this cluster holds.
psql_q "ALTER SYSTEM SET max_locks_per_transaction = 256" >/dev/null
pg_restart || bail_out "cannot restart PostgreSQL"
make_mark_script "$T/mark.sh" "$T/markers.log"

write_conf "$T/admin.ini" <<EOF
$(conf_header)
EOF
pgjobd_migrate "$T/admin.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
psql_q "SELECT pgjobd.setup_roles()" >/dev/null || bail_out "setup_roles failed"
psql_q "CREATE ROLE app1 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE app2 LOGIN IN ROLE pgjobd_producer;
        CREATE ROLE wrk LOGIN IN ROLE pgjobd_worker;
        CREATE ROLE stranger LOGIN" || bail_out "cannot create the roles"
for q in dd free grp; do psql_q "SELECT pgjobd.grant_queue('app1', '$q')" >/dev/null; done
for q in dd dd2 free grp; do psql_q "SELECT pgjobd.grant_queue('app2', '$q')" >/dev/null; done
# The races below are between producers over one key and one group: in queues declared
# shared, where producers share keys and groups (by default each has its own, see
# t_94_producers.sh).
for q in dd dd2 grp; do psql_q "SELECT pgjobd.share_queue('$q')" >/dev/null; done

# as USER SQL: SQL as USER; prints the output (errors with their SQLSTATE).
as() {
	psql -X -qAt -U "$1" -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c "$2" 2>&1
}

# refused USER SQL NAME: SQL as USER fails with SQLSTATE 42501.
refused() {
	local out status
	out=$(as "$1" "$2")
	status=$?
	[ "$status" != 0 ] && [[ $out =~ ERROR:\ +42501: ]]
	ok $? "$3" || diag "  as $1: $2" "  exit status: $status" "  output: $out"
}

WRK_CONNINFO="host=$T/sock port=$PGPORT dbname=pgjobd_test user=wrk"
write_conf "$T/d.ini" <<EOF
$(conf_header database="$WRK_CONNINFO")

[queue.free]
command = true
concurrency = 4

[queue.grp]
command = /bin/bash '$T/mark.sh'
concurrency = 4

[queue.keep]
command = true
retention = 1h
EOF

# ---------------------------------------------------------------- what replaces them

is "$(psql_q "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgjobd'::regnamespace
              AND prosrc ILIKE '%advisory%'")" 0 "no function of schema pgjobd mentions an advisory lock"

psql_q "CREATE SCHEMA s_app1 AUTHORIZATION app1; CREATE SCHEMA s_stranger AUTHORIZATION stranger" >/dev/null
for u in app1 stranger; do
	refused "$u" "SELECT 1 FROM pgjobd.maintenance_lock FOR UPDATE" \
		"$u may not lock the maintenance row (FOR UPDATE)"
	refused "$u" "SELECT 1 FROM pgjobd.maintenance_lock FOR KEY SHARE" "... nor FOR KEY SHARE"
	refused "$u" "BEGIN; LOCK TABLE pgjobd.maintenance_lock IN ROW SHARE MODE" \
		"... nor LOCK pgjobd.maintenance_lock"
	refused "$u" "CREATE TABLE s_$u.fk (one boolean REFERENCES pgjobd.maintenance_lock)" \
		"... nor reference it from a foreign key (whose checks lock the row)"
	refused "$u" "SELECT 1 FROM pgjobd.dedupe_locks FOR UPDATE" "$u may not lock rows of pgjobd.dedupe_locks"
	refused "$u" "INSERT INTO pgjobd.dedupe_locks VALUES ('dd', 'x')" "... nor insert a key into it"
	refused "$u" "BEGIN; LOCK TABLE pgjobd.dedupe_locks IN ACCESS SHARE MODE" "... nor LOCK it"
	refused "$u" "SELECT 1 FROM pgjobd.jobs FOR KEY SHARE" "$u may not lock rows of pgjobd.jobs"
	refused "$u" "BEGIN; LOCK TABLE pgjobd.jobs IN SHARE MODE" "... nor LOCK pgjobd.jobs"
	refused "$u" "CREATE TABLE s_$u.fkj (j bigint REFERENCES pgjobd.jobs)" "... nor reference it"
	refused "$u" "SELECT 1 FROM pgjobd.groups FOR KEY SHARE" "$u may not lock rows of pgjobd.groups"
done
like "$(as wrk "BEGIN; SELECT one FROM pgjobd.maintenance_lock FOR UPDATE SKIP LOCKED")" '^t$' \
	"the worker role may lock the maintenance row"

# ---------------------------------------------------------------- a window without bridges

# A claim commits job B `running` (nobody holds it yet: no slot here), then a transaction
# that began earlier commits job A of the same group, with the smaller id: A heads the
# group now, but B runs. A second claim must not start A.
W=$(psql_q "SELECT pgjobd.register_worker('test:1', 600000)")
claim() { # WORKER -> the claimed job ids
	psql_q "SELECT string_agg(job_id::text, ',') FROM pgjobd.claim_batch('win', $W, '{$1}',
	        5, 0, 1048576, 1000, false, '{}', '{}', '{}')"
}
mkfifo "$T/late.fifo"
psql -X -qAt -v ON_ERROR_STOP=1 <"$T/late.fifo" >"$T/late.out" 2>&1 &
late=$!
echo "$late" >"$T/late.pid"
exec 7>"$T/late.fifo"
echo "BEGIN; INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('win', 'w') RETURNING id;" >&7
wait_until 10 "[ -s '$T/late.out' ]"
A=$(head -n 1 "$T/late.out")
B=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('win', 'w') RETURNING id")
cmp_ok "${A:-0}" -lt "${B:-0}" "job A ($A) has the smaller id, job B ($B) commits first"
is "$(claim test:1:0)" "$B" "a claim starts B, the only job of group w it sees"
echo "COMMIT;" >&7
exec 7>&-
wait_until 10 "! pid_alive $late"
is "$(job_field "${A:-0}" status)" queued "A commits: queued, with the smaller id"
is "$(claim test:1:1)" "" "a second claim starts nothing of group w while B runs"
is "$(count_jobs "queue = 'win' AND status = 'running'")" 1 "one job of the group runs"
psql_q "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE id = ${B:-0}" >/dev/null
is "$(claim test:1:1)" "$A" "once B has finished, A starts"
psql_q "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE id = ${A:-0};
        SELECT pgjobd.worker_gone($W)" >/dev/null

# ---------------------------------------------------------------- dedupe under concurrency

# A gate that is not an advisory lock: the inserters read a table the gate session holds
# locked, and all start when it commits.
psql_q "CREATE TABLE gate (x int); GRANT SELECT ON gate TO app1, app2" >/dev/null
race_round() { # KEY: 8 producers, app1 and app2 in turn, insert KEY into dd at once
	local key=$1 i u
	mkfifo "$T/gate.fifo"
	psql -X -qAt -v ON_ERROR_STOP=1 <"$T/gate.fifo" >/dev/null 2>&1 &
	local gate=$!
	exec 6>"$T/gate.fifo"
	echo "BEGIN; LOCK TABLE gate IN ACCESS EXCLUSIVE MODE; SELECT 1;" >&6
	wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_locks WHERE relation = 'gate'::regclass AND mode = 'AccessExclusiveLock' AND granted\")\" = 1 ]" ||
		return 1
	: >"$T/race.pids"
	for i in 1 2 3 4 5 6 7 8; do
		u=app$((i % 2 + 1))
		psql -X -At -U "$u" -v ON_ERROR_STOP=1 \
			-c "SELECT count(*) FROM gate" \
			-c "BEGIN" \
			-c "INSERT INTO pgjobd.jobs (queue, dedupe_key, data) VALUES ('dd', '$key', '{\"n\": $i}')" \
			-c "SELECT pg_sleep(random() * 0.2)" \
			-c "COMMIT" >"$T/race.$key.$i" 2>&1 &
		echo $! >>"$T/race.pids"
	done
	wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_locks WHERE relation = 'gate'::regclass AND NOT granted\")\" = 8 ]"
	echo "COMMIT;" >&6
	exec 6>&-
	wait "$gate"
	rm -f "$T/gate.fifo"
	local failed=0 p
	for p in $(cat "$T/race.pids"); do wait "$p" || failed=1; done
	return $failed
}
for round in 1 2 3; do
	race_round "r$round"
	ok $? "round $round: 8 producers inserted key r$round at once without an error" ||
		diag "$(cat "$T"/race.r$round.*)"
	is "$(count_jobs "queue = 'dd' AND dedupe_key = 'r$round'")" 1 "round $round: exactly one job has the key"
	is "$(cat "$T"/race.r$round.* | grep -c '^INSERT 0 1$')" 1 "round $round: one producer says INSERT 0 1"
	is "$(cat "$T"/race.r$round.* | grep -c '^INSERT 0 0$')" 7 "round $round: seven say INSERT 0 0"
done

# hold_open USER SQL...: USER runs BEGIN and the statements in a session it keeps open
# until $T/hold.done exists, then commits. Sets $holder.
hold_open() {
	local u=$1 s
	shift
	rm -f "$T/hold.done" "$T/hold.ready"
	{
		echo "BEGIN;"
		for s in "$@"; do echo "$s;"; done
		echo "\\! touch '$T/hold.ready'; while [ ! -e '$T/hold.done' ]; do sleep 0.05; done"
		echo "COMMIT;"
	} >"$T/hold.sql"
	psql -X -qAt -U "$u" -v ON_ERROR_STOP=1 -f "$T/hold.sql" >"$T/hold.out" 2>&1 &
	holder=$!
	echo "$holder" >"$T/holder.pid"
	wait_until 10 "[ -e '$T/hold.ready' ]"
}
# insert_timed USER SQL: prints "ELAPSED_MS OUTPUT" (statement_timeout 10 s).
insert_timed() {
	local t0 out
	t0=$(now_ms)
	out=$(psql -X -At -U "$1" -v ON_ERROR_STOP=1 -c "SET statement_timeout = '10s'" -c "$2" 2>&1 | tail -n 1)
	echo "$(($(now_ms) - t0)) $out"
}

for mode in DEFERRED IMMEDIATE; do
	hold_open app1 "SET CONSTRAINTS ALL $mode" "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'open-$mode')"
	ok $? "constraints $mode: app1 inserts key open-$mode and keeps its transaction open"
	insert_timed app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'open-$mode')" >"$T/waiter.out" &
	waiter=$!
	wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE usename = 'app2' AND wait_event_type = 'Lock'\")\" = 1 ]"
	ok $? "constraints $mode: app2's INSERT of the same key waits for app1's transaction"
	touch "$T/hold.done"
	wait "$holder"
	wait "$waiter"
	read -r el out <"$T/waiter.out"
	is "$out" "INSERT 0 0" "constraints $mode: once app1 commits, app2's INSERT inserts nothing, without an error"
	is "$(count_jobs "dedupe_key = 'open-$mode'")" 1 "constraints $mode: one job has the key"
done

hold_open app1 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'shared-name')"
read -r el out <<<"$(insert_timed app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd2', 'shared-name')")"
is "$out" "INSERT 0 1" "app1 holding key shared-name of dd open: app2 inserts shared-name into dd2"
cmp_ok "$el" -lt 2000 "... at once (${el} ms)"
touch "$T/hold.done"
wait "$holder"

out=$(psql -X -At -U app2 -v ON_ERROR_STOP=1 -c "BEGIN" \
	-c "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'undone')" -c "ROLLBACK" 2>&1)
read -r el out <<<"$(insert_timed app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'undone')")"
is "$out" "INSERT 0 1" "a rolled-back insert leaves its key free"
is "$(psql_q "SELECT count(*) FROM pgjobd.dedupe_locks")" 0 "pgjobd.dedupe_locks is empty once the inserts have ended"

# ---------------------------------------------------------------- absence

start_daemon d "$T/d.ini"
d=$DAEMON_PID
wait_until 20 "workers_alive 1"
ok $? "the daemon runs as the worker role"

# old_rows N: N finished jobs of queue keep, 2 hours old (retention 1h deletes them).
old_rows() {
	echo "INSERT INTO pgjobd.jobs (queue, status, attempts, run_at, started_at, finished_at)
	      SELECT 'keep', 'succeeded', 1, now() - interval '3 hours', now() - interval '3 hours',
	             now() - interval '2 hours' FROM generate_series(1, $1);"
}
# work PREFIX: 100 jobs of free and 100 of grp in 20 new groups PREFIX-1..PREFIX-20, by app2.
work() {
	as app2 "INSERT INTO pgjobd.jobs (queue) SELECT 'free' FROM generate_series(1, 100);
	         INSERT INTO pgjobd.jobs (queue, group_id, data)
	         SELECT 'grp', '$1-' || (i % 20 + 1), '{\"sleep\": \"rand\"}' FROM generate_series(1, 100) i" >/dev/null
}
finished() { # PREFIX: the jobs of work PREFIX have all succeeded
	[ "$(count_jobs "queue IN ('free', 'grp') AND (group_id IS NULL OR group_id LIKE '$1-%') AND status <> 'succeeded'")" = 0 ]
}

# The sampler reads pg_locks every millisecond until every job has finished (or 60 s).
PGAPPNAME=t96-sampler psql -X -qAt -v ON_ERROR_STOP=1 >"$T/sampler.out" 2>&1 <<EOF &
DO \$\$
DECLARE
    samples int := 0;
    seen int := 0;
    n int;
    t0 timestamptz := clock_timestamp();
BEGIN
    FOR i IN 1 .. 100000000 LOOP
        SELECT count(*) INTO n FROM pg_locks
         WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database
                                                      WHERE datname = current_database());
        samples := samples + 1;
        IF n > 0 THEN seen := seen + 1; END IF;
        EXIT WHEN i % 50 = 0 AND i > 500
              AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue IN ('free', 'grp', 'keep')
                                 AND status IN ('queued', 'running'))
              AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue = 'nobody' AND status = 'queued')
              AND NOT EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue = 'keep'
                                 AND finished_at < now() - interval '1 hour')
              AND (SELECT count(*) FROM pgjobd.jobs WHERE queue = 'grp' AND dedupe_key LIKE 'p0-%') = 30;
        EXIT WHEN clock_timestamp() > t0 + interval '60 s';
        PERFORM pg_sleep(0.001);
    END LOOP;
    RAISE NOTICE 'samples=% with_advisory=%', samples, seen;
END
\$\$;
EOF
sampler=$!
echo "$sampler" >"$T/sampler.pid"
psql_q "$(old_rows 50)
        INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('nobody', now() + interval '500 ms')" >/dev/null
work p0
for i in $(seq 1 30); do
	as app$((i % 2 + 1)) "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'p0-$((i % 7))')" >/dev/null
	as app2 "INSERT INTO pgjobd.jobs (queue, group_id, dedupe_key) VALUES ('grp', 'p0-d$((i % 3))', 'p0-$i')" >/dev/null
done
wait_until 90 "! pid_alive $sampler"
ok $? "the pg_locks sampler ends once the busy mix is done"
wait "$sampler"
sampled=$(grep -o 'samples=.*' "$T/sampler.out")
note "pg_locks sampler: $sampled"
like "$sampled" '^samples=[0-9]{3,} with_advisory=0$' \
	"pg_locks showed no advisory lock while the daemon ran groups, dedupe inserts and maintenance" ||
	diag "$(cat "$T/sampler.out")"
finished p0
ok $? "the busy mix's jobs all succeeded"

# ---------------------------------------------------------------- the attack

# keys N NAME...: every key versions 1 to 8 used for ids up to N (job ids, group row ids,
# and key 0 of the maintenance and migrate locks), in classes 1886020100 to 1886020108,
# and the hashes those versions took of queue names joined to group and dedupe key names.
keys() {
	local n=$1 names
	shift
	names=$(printf "'%s'," "$@")
	echo "SELECT c, k FROM generate_series(1886020100, 1886020108) c, generate_series(0, $n) k
	      UNION SELECT c, hashtext(q || chr(10) || g)
	        FROM generate_series(1886020100, 1886020108) c, unnest(ARRAY['dd', 'dd2', 'free', 'grp', 'keep']) q,
	             unnest(ARRAY[${names%,}]) g"
}

# attack ROLE PREFIX: ROLE holds every key in use and to come, in an open session, while
# 200 jobs (work PREFIX), maintenance, a producer's dedupe inserts and a migrate run.
attack() {
	local role=$1 p=$2 n names=() i expected held el out
	n=$(psql_q "SELECT greatest((SELECT last_value FROM pgjobd.jobs_id_seq),
	                            (SELECT last_value FROM pgjobd.groups_id_seq)) + 400")
	for i in $(seq 1 20); do names+=("$p-$i"); done
	names+=("$p-k" "$p-k2")
	expected=$(psql_q "SELECT count(*) FROM ($(keys "$n" "${names[@]}")) s")
	mkfifo "$T/attack.$p.fifo"
	PGAPPNAME=t96-attacker psql -X -qAt -U "$role" -v ON_ERROR_STOP=1 <"$T/attack.$p.fifo" >"$T/attack.$p.out" 2>&1 &
	local attacker=$!
	echo "$attacker" >"$T/attacker.pid"
	exec 9>"$T/attack.$p.fifo"
	echo "SELECT count(*) FROM (SELECT pg_advisory_lock(c, k) FROM ($(keys "$n" "${names[@]}")) s) x;" >&9
	HELD="FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	      WHERE a.application_name = 't96-attacker' AND l.locktype = 'advisory' AND l.granted"
	wait_until 60 "[ \"\$(psql_q \"SELECT count(*) $HELD\")\" = $expected ]"
	ok $? "$role holds all $expected keys (ids up to $n, hashes of ${#names[@]} names)" ||
		diag "$(cat "$T/attack.$p.out")"

	psql_q "$(old_rows 50)
	        INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('nobody', now() + interval '500 ms')
	        RETURNING id" >"$T/expiring.$p"
	local expiring
	expiring=$(tail -n 1 "$T/expiring.$p")
	work "$p"

	read -r el out <<<"$(insert_timed app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', '$p-k')")"
	is "$out" "INSERT 0 1" "$role holding the keys: app2's INSERT with a new dedupe key inserts the job"
	cmp_ok "$el" -lt 2000 "... at once (${el} ms)"
	read -r el out <<<"$(insert_timed app2 "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', '$p-k')")"
	is "$out" "INSERT 0 0" "... and the same key again inserts nothing, without an error"
	cmp_ok "$el" -lt 2000 "... at once (${el} ms)"
	read -r el out <<<"$(insert_timed app2 "INSERT INTO pgjobd.jobs (queue, group_id, dedupe_key) VALUES ('grp', '$p-k2', '$p-k2')")"
	is "$out" "INSERT 0 1" "... a grouped job with a dedupe key, in a new group, at once (${el} ms)"

	local t0
	t0=$(now_ms)
	timeout 30 "$PGJOBD" migrate -c "$T/admin.ini" >"$T/migrate.$p" 2>&1
	out=$?
	el=$(($(now_ms) - t0))
	is "$out" 0 "... pgjobd migrate succeeds" || diag "$(cat "$T/migrate.$p")"
	cmp_ok "$el" -lt 10000 "... without waiting for anyone (${el} ms)"

	wait_until 60 "finished $p && [ \"\$(job_field ${expiring:-0} status)\" = cancelled ]"
	ok $? "... the 200 jobs (new groups included) all succeed, and the job that expired is cancelled" ||
		diag "$(psql_q "SELECT queue, status, count(*) FROM pgjobd.jobs GROUP BY 1, 2 ORDER BY 1, 2")"
	is "$(job_field "${expiring:-0}" "error->>'reason'")" expired "... by maintenance, reason expired"
	wait_until 20 "[ \"\$(count_jobs \"queue = 'keep' AND finished_at < now() - interval '1 hour'\")\" = 0 ]"
	ok $? "... and maintenance deletes the old finished jobs (retention)"
	local dk
	dk=$(psql_q "SELECT id FROM pgjobd.jobs WHERE dedupe_key = '$p-k2'")
	wait_until 20 "[ \"\$(job_field ${dk:-0} status)\" = succeeded ]"
	ok $? "... the grouped job with a dedupe key runs too"
	is "$(psql_q "SELECT count(*) $HELD")" "$expected" "... all while $role held every key"

	exec 9>&-
	wait_until 20 "! pid_alive $attacker"
	ok $? "$role lets go"
	wait "$attacker"
	rm -f "$T/attack.$p.fifo"
}

attack stranger pa
attack app1 pb

problems=$(check_markers "$T/markers.log")
ok $? "no two commands of a group ran at once, and each group ran in order" || diag "$problems"
is "$(grep -c 'level=error' "$T/d.log")" 0 "the daemon logged no error"
stop_daemon "$d"
is $? 0 "the daemon exits 0 on SIGTERM"

# ---------------------------------------------------------------- migrate

# Four migrations at once on a database without the schema (serialised by a lock on
# pgjobd.schema_version, not by an advisory lock), three times: all succeed, and the
# schema is made once. Those that lose the race to create the schema try again.
for round in 1 2 3; do
	PGDATABASE=postgres psql_q "CREATE DATABASE fresh$round" >/dev/null
	write_conf "$T/fresh.ini" <<EOF
$(conf_header database="host=$T/sock port=$PGPORT dbname=fresh$round user=postgres")
EOF
	pids=()
	for k in 1 2 3 4; do
		"$PGJOBD" migrate -c "$T/fresh.ini" >"$T/fresh.$k" 2>&1 &
		pids+=("$!")
	done
	statuses=""
	for p in "${pids[@]}"; do
		wait "$p"
		statuses+="$? "
	done
	is "$statuses" "0 0 0 0 " "round $round: four pgjobd migrate at once on a fresh database all succeed" ||
		diag "$(cat "$T"/fresh.[1-4])"
	is "$(cat "$T"/fresh.[1-4] | grep -c '^applied 001_init$')" 1 "... the schema was created once"
	is "$(PGDATABASE=fresh$round psql_q "SELECT count(*) FROM pgjobd.schema_version")" \
		"$(psql_q "SELECT count(*) FROM pgjobd.schema_version")" "... with every migration"
done

# The race lost with another error, made to happen: as a migration's CREATE TABLE of
# pgjobd.schema_version starts, another session makes that table and commits, and the
# CREATE fails with an error that says nothing of a table that exists (an event trigger
# does both, once, through dblink). The table was missing before the try and is there
# after it: the migration tries again and succeeds.
PGDATABASE=postgres psql_q "CREATE DATABASE raced" >/dev/null
if ! PGDATABASE=raced psql_q "CREATE EXTENSION dblink; CREATE SCHEMA pgjobd" >/dev/null 2>&1; then
	skip "no dblink in this PostgreSQL build" 3
else
	PGDATABASE=raced psql_q "
	CREATE FUNCTION public.race_once() RETURNS event_trigger LANGUAGE plpgsql AS \$\$
	BEGIN
	    IF tg_tag <> 'CREATE TABLE' OR to_regclass('public.raced_once') IS NOT NULL
	       OR current_setting('application_name') = 'racer' THEN
	        RETURN;
	    END IF;
	    PERFORM public.dblink_exec('host=$T/sock port=$PGPORT dbname=raced user=postgres
	                                application_name=racer',
	        'CREATE TABLE pgjobd.schema_version (version integer PRIMARY KEY, name text NOT NULL,
	                                             applied_at timestamptz NOT NULL DEFAULT now());
	         CREATE TABLE public.raced_once ()');
	    RAISE EXCEPTION 'made to fail by the test, the table committed meanwhile';
	END \$\$;
	CREATE EVENT TRIGGER race_once ON ddl_command_start EXECUTE FUNCTION public.race_once()" >/dev/null
	write_conf "$T/raced.ini" <<EOF
$(conf_header database="host=$T/sock port=$PGPORT dbname=raced user=postgres")
EOF
	"$PGJOBD" migrate -c "$T/raced.ini" >"$T/raced.out" 2>&1
	is "$?" 0 "a migration whose CREATE of the version table fails as another session makes it succeeds" ||
		diag "$(cat "$T/raced.out")"
	is "$(PGDATABASE=raced psql_q "SELECT to_regclass('public.raced_once') IS NOT NULL")" t \
		"... the failure was made (the other session's table is there)"
	is "$(PGDATABASE=raced psql_q "SELECT count(*) FROM pgjobd.schema_version")" \
		"$(psql_q "SELECT count(*) FROM pgjobd.schema_version")" "... with every migration"
fi

# A role that may not create the schema is told so at once: its error is not taken
# for that race (nothing else made the schema), and nothing is made.
PGDATABASE=postgres psql_q "CREATE DATABASE closed" >/dev/null
PGDATABASE=postgres psql_q "REVOKE CREATE ON DATABASE closed FROM PUBLIC" >/dev/null
write_conf "$T/closed.ini" <<EOF
$(conf_header database="host=$T/sock port=$PGPORT dbname=closed user=stranger")
EOF
t0=$(now_ms)
"$PGJOBD" migrate -c "$T/closed.ini" >"$T/closed.out" 2>&1
status=$?
el=$(($(now_ms) - t0))
is "$status" 1 "pgjobd migrate by a role that may not create the schema fails"
like "$(cat "$T/closed.out")" "permission denied for database closed" "... saying why"
cmp_ok "$el" -lt 5000 "... at once, without trying again (${el} ms)"
is "$(PGDATABASE=closed psql_q "SELECT count(*) FROM pg_namespace WHERE nspname = 'pgjobd'")" 0 \
	"... and makes nothing"

done_testing
