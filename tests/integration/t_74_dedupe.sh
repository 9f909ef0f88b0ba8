#!/usr/bin/env bash
# dedupe_key (pgjobd(8)): while a job of the same (queue, dedupe_key) is unfinished,
# a plain INSERT with that key inserts nothing and raises no error (INSERT 0 0), also when
# 8 sessions insert the same key at the same instant; once the job has finished
# (succeeded, failed or cancelled) the key can be used again.
. "$(dirname "$0")/lib.sh"
require_pgjobd

shared_cluster # the advisory lock it waits for is its own database's
pg_start
conf=$T/dedupe.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.dq]
command = sleep "\${PGJOBD_ARG_sleep:-0}"; exit "\${PGJOBD_ARG_exit:-0}"
max_attempts = 2
backoff = 1h
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# --- 8 sessions at once, no daemon: the jobs stay queued.
# Each session blocks on a shared advisory lock that a gate session holds exclusively
# until $T/open.KEY exists; once all 8 wait for it, the gate opens and the 8 INSERTs
# start together; each then keeps its transaction open a little while before
# committing, to widen the race.
advisory_4242() { # GRANTED: this database's sessions holding (t) or waiting for (f) lock 4242
	psql_q "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND granted = '$1'
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
}
race_round() { # KEY
	local key=$1 i
	psql -X -qAt -c "SELECT pg_advisory_lock(4242)" \
		-c "\\! for i in \$(seq 1200); do [ -e '$T/open.$key' ] && break; sleep 0.05; done" >/dev/null &
	local gate=$!
	wait_until 20 '[ "$(advisory_4242 t)" = 1 ]' || return 1
	for i in 1 2 3 4 5 6 7 8; do
		psql -X -At -v ON_ERROR_STOP=1 \
			-c "SELECT pg_advisory_lock_shared(4242)" \
			-c "BEGIN" \
			-c "INSERT INTO pgjobd.jobs (queue, dedupe_key, data) VALUES ('dd', '$key', '{\"n\": $i}')" \
			-c "SELECT pg_sleep(random() * 0.2)" \
			-c "COMMIT" >"$T/race.$key.$i" 2>&1 &
		echo $! >>"$T/race.pids"
	done
	wait_until 30 '[ "$(advisory_4242 f)" = 8 ]'
	local failed=$?
	touch "$T/open.$key"
	wait "$gate"
	local p
	for p in $(cat "$T/race.pids"); do wait "$p" || failed=1; done
	: >"$T/race.pids"
	return $failed
}

for round in 1 2 3 4 5; do
	race_round "k$round"
	ok $? "round $round: 8 concurrent sessions inserted key k$round without an error"
	is "$(count_jobs "queue = 'dd' AND dedupe_key = 'k$round'")" 1 "round $round: exactly one job has the key"
	is "$(cat "$T"/race.k$round.* | grep -c '^INSERT 0 1$')" 1 "round $round: one session says INSERT 0 1"
	is "$(cat "$T"/race.k$round.* | grep -c '^INSERT 0 0$')" 7 "round $round: seven say INSERT 0 0"
done

# --- one statement with the key twice, and other queues/keys are independent
out=$(psql -X -At -c "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'multi'), ('dd', 'multi'), ('dd2', 'multi'), ('dd', NULL), ('dd', NULL)" 2>&1)
is "$out" "INSERT 0 4" "one statement: the repeated key is inserted once; other queue and NULL keys are not deduplicated"
is "$(psql -X -At -c "INSERT INTO pgjobd.jobs (queue, dedupe_key) VALUES ('dd', 'k1') RETURNING id" 2>&1)" \
	"INSERT 0 0" "INSERT ... RETURNING id of a duplicate: no row, no error"

# --- with a daemon: running and retrying jobs keep the key; finished ones free it
start_daemon d "$conf"
ins() { psql -X -At -c "INSERT INTO pgjobd.jobs (queue, dedupe_key, data) VALUES ('dq', '$1', '$2')" 2>&1; }
status_of() { psql_q "SELECT string_agg(status, ',' ORDER BY id) FROM pgjobd.jobs WHERE queue = 'dq' AND dedupe_key = '$1'"; }

is "$(ins run '{"sleep": 2}')" "INSERT 0 1" "key 'run': first insert"
wait_until 10 "[ \"\$(status_of run)\" = running ]"
ok $? "... its job is running"
is "$(ins run '{}')" "INSERT 0 0" "a running job keeps its key"
wait_until 15 "[ \"\$(status_of run)\" = succeeded ]"
ok $? "... the job succeeds"
is "$(ins run '{}')" "INSERT 0 1" "after success the key can be used again"
wait_until 15 "[ \"\$(status_of run)\" = succeeded,succeeded ]"
ok $? "... and the new job runs"

is "$(ins retry '{"exit": 1}')" "INSERT 0 1" "key 'retry': first insert (fails, backoff 1h)"
wait_until 10 "[ \"\$(psql_q \"SELECT attempts FROM pgjobd.jobs WHERE dedupe_key = 'retry'\")\" = 1 ] && [ \"\$(status_of retry)\" = queued ]"
ok $? "... it failed once and waits for its retry"
is "$(ins retry '{}')" "INSERT 0 0" "a job waiting for a retry keeps its key"
id=$(psql_q "SELECT id FROM pgjobd.jobs WHERE dedupe_key = 'retry'")
psql_q "SELECT pgjobd.cancel($id)" >/dev/null
is "$(ins retry '{}')" "INSERT 0 1" "after cancel the key can be used again"

is "$(psql -X -At -c "INSERT INTO pgjobd.jobs (queue, dedupe_key, data, max_attempts) VALUES ('dq', 'fail', '{\"exit\": 3}', 1)" 2>&1)" \
	"INSERT 0 1" "key 'fail': a job with max_attempts 1"
wait_until 10 "[ \"\$(status_of fail)\" = failed ]"
ok $? "... it fails"
is "$(ins fail '{}')" "INSERT 0 1" "after failure the key can be used again"

stop_daemon "$DAEMON_PID" 30
is $? 0 "the daemon stops cleanly (exit 0)"
done_testing
