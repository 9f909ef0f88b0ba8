#!/usr/bin/env bash
# The claim statement has two paths (sql/claim.sql, sent by src/claim.c): when
# no orphan pass is asked for, the queue is not paused and no grouped job of it
# could start, it claims the best ready ungrouped jobs itself; otherwise it
# calls pgjobd.claim_batch (sql/functions/claim.sql), which does everything. Both must give the same
# answer. Each case below sets a queue up, then claims twice on the same state,
# each in a transaction that is rolled back: once with the daemon's statement
# (as the helper claim-sql prints it, prepared and planned as the daemon's
# sessions prepare and plan it) and once with claim_batch alone. The rows
# returned (the group row and the fencing token only as present: they are new
# sequence values each time), the jobs' rows, the group rows and the session's
# waiting row must be the same, and the path taken must be the one the case
# expects (pg_stat_xact_user_functions counts the transaction's calls of
# claim_batch). Then a daemon: an ungrouped queue's jobs run without a call of
# claim_batch, a grouped one's with.
. "$(dirname "$0")/lib.sh"
require_pgjobd
prep=$(claim_prepared) || bail_out "the claim statement is not available"

pg_start
W=$(psql_q "SELECT pgjobd.register_worker('test:1', 600000)")
D=$(psql_q "SELECT pgjobd.register_worker('test:2', 600000)")
psql_q "SELECT pgjobd.worker_gone($D)" >/dev/null

# claim_run OUT PREFIX CALL: in one session and a rolled-back transaction, PREFIX
# (SQL), then CALL (its rows to OUT.rows), then the state to OUT.state and the
# count of claim_batch calls to OUT.calls.
claim_run() {
	psql -X -qAt -v ON_ERROR_STOP=1 >"$1.log" 2>&1 <<EOF
SET track_functions = 'pl';
$prep
BEGIN;
$2
$3 \g $1.rows
SELECT 'job', id, status, attempts, worker, worker_id, error->>'reason', lease_ms,
       lease_until IS NOT NULL, fence IS NOT NULL, held_until IS NOT NULL, finished_at IS NOT NULL
  FROM pgjobd.jobs ORDER BY id \g $1.state
SELECT 'group', queue, group_id FROM pgjobd.groups ORDER BY queue, group_id \g $1.groups
SELECT 'waiting', queue FROM pgjobd.waiting WHERE pid = pg_backend_pid() ORDER BY queue \g $1.waiting
SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions WHERE funcname = 'claim_batch' \g $1.calls
ROLLBACK;
EOF
}

# same NAME PATH WORKERS [ARGS...]: claim for WORKERS (a text[] literal) both ways
# and compare; PATH is quick (the statement's own) or full (claim_batch's). ARGS:
# max_data=, timeout=, orphans=, lease=, prefix= (SQL run first in the transaction).
# $ROWS: the rows the claim returned.
same() {
	local name=$1 path=$2 workers=$3 max_data=1048576 timeout=0 orphans=false lease=30000 prefix=""
	shift 3
	local a
	for a in "$@"; do
		case $a in
		max_data=*) max_data=${a#*=} ;;
		timeout=*) timeout=${a#*=} ;;
		orphans=*) orphans=${a#*=} ;;
		lease=*) lease=${a#*=} ;;
		prefix=*) prefix=${a#*=} ;;
		esac
	done
	local args="'cq', $W, '$workers', 5, $timeout, $max_data, 1000, $orphans, '{}', $lease"
	claim_run "$T/$name.stmt" "$prefix" "EXECUTE qc($args)"
	claim_run "$T/$name.batch" "$prefix" "SELECT * FROM pgjobd.claim_batch('cq', $W, '$workers', 5,
		$timeout, $max_data, 1000, $orphans, '{}', $lease)"
	local f ok=0
	for f in stmt batch; do
		[ -s "$T/$name.$f.log" ] && { diag "$name ($f): $(cat "$T/$name.$f.log")"; ok=1; }
		# the group row (3rd column) and the fencing token (8th) only as present: both
		# are new sequence values in each run
		awk -F'|' -v OFS='|' '{ $3 = ($3 == "" ? "" : "row"); $8 = ($8 == "" ? "" : "fence") } 1' \
			"$T/$name.$f.rows" >"$T/$name.$f.cmp"
		cat "$T/$name.$f.state" "$T/$name.$f.groups" "$T/$name.$f.waiting" >>"$T/$name.$f.cmp"
	done
	if ! diff "$T/$name.stmt.cmp" "$T/$name.batch.cmp" >"$T/$name.diff"; then
		diag "$(cat "$T/$name.diff")"
		ok=1
	fi
	ok $ok "$name: the claim statement answers as claim_batch does"
	local want=0
	[ "$path" = full ] && want=1
	is "$(cat "$T/$name.stmt.calls")" "$want" "$name: ... by the $path path"
	ROWS=$(wc -l <"$T/$name.stmt.rows")
}

# reset SQL...: an empty queue cq, then SQL.
reset() {
	psql_q "DELETE FROM pgjobd.jobs; DELETE FROM pgjobd.groups; DELETE FROM pgjobd.waiting;
		DELETE FROM pgjobd.paused_queues; $*" >/dev/null
}
register="prefix=INSERT INTO pgjobd.waiting (queue, pid) VALUES ('cq', pg_backend_pid());"

# Quick path.
reset "INSERT INTO pgjobd.jobs (queue, data) SELECT 'cq', jsonb_build_object('n', i) FROM generate_series(1, 3) i"
same fill quick '{a,b}' "$register"
is "$ROWS" 2 "fill: two jobs for two slots (and the waiting row goes)"
same fewer quick '{a,b,c,d}'
is "$ROWS" 3 "fewer: three jobs for four slots (and the session registers as waiting)"
reset "INSERT INTO pgjobd.jobs (queue, priority, data) VALUES ('cq', 5, '{\"p\": 5}'), ('cq', 1, '{\"p\": 1}'),
	('cq', 3, '{\"p\": 3, \"s\": \"x y\", \"b\": true, \"o\": {\"k\": 1}, \"z\": null}');
	INSERT INTO pgjobd.jobs (queue, run_at) VALUES ('cq', now() + interval '1 hour');
	INSERT INTO pgjobd.jobs (queue, expires_at) VALUES ('cq', now() + interval '1 hour');
	INSERT INTO pgjobd.jobs (queue, max_attempts, timeout, data) VALUES ('cq', 9, '2.5 s', '[1, 2]');
	UPDATE pgjobd.jobs SET expires_at = now() - interval '1 s' WHERE expires_at IS NOT NULL"
same order quick '{a,b,c,d,e,f}'
is "$ROWS" 4 "order: the four ready jobs, by priority, run_at and id (not the future or expired one)"
same order-timeout quick '{a,b,c,d,e,f}' timeout=1000
same order-transaction quick '{a,b}' lease=NULL
reset "INSERT INTO pgjobd.jobs (queue, data) VALUES ('cq', '{\"n\": 1}'),
	('cq', jsonb_build_object('big', repeat('x', 500))), ('cq', '{\"n\": 3}');
	INSERT INTO pgjobd.jobs (queue, data) VALUES ('cq', jsonb_build_object('big', repeat('y', 200000)))"
same too-large quick '{a,b,c,d}' max_data=300
is "$ROWS" 2 "too large: both large jobs fail unloaded, slots 1 and 3 start"
is "$(grep -c '|data_too_large|' "$T/too-large.stmt.state")" 2 "too large: ... failed as data_too_large"
reset ""
same none quick '{a}'
is "$ROWS" 0 "none: an empty queue starts nothing"
# Grouped jobs that cannot start now leave the quick path open: one marked held
# (its mark not due), one not due yet. (A queued job of a group whose head runs is
# ready and unmarked: such a queue's claims take the full path.)
reset "INSERT INTO pgjobd.jobs (queue, group_id, run_at) VALUES ('cq', 'later', now() + interval '1 hour');
	INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('cq', 'held');
	UPDATE pgjobd.jobs SET held_until = now() + interval '1 hour' WHERE group_id = 'held';
	INSERT INTO pgjobd.jobs (queue) VALUES ('cq'), ('cq')"
same grouped-idle quick '{a,b,c}'
is "$ROWS" 2 "grouped jobs that cannot start: the ungrouped ones start"

# Full path.
reset "INSERT INTO pgjobd.jobs (queue, priority, group_id) VALUES ('cq', 1, 'g1'), ('cq', 1, 'g1'), ('cq', 1, 'g2');
	INSERT INTO pgjobd.jobs (queue, priority) VALUES ('cq', 0), ('cq', 2), ('cq', 2)"
same mixed full '{a,b,c,d,e}'
is "$ROWS" 5 "mixed: one job of each group, in start order among the ungrouped"
same mixed-fill full '{a,b}' "$register"
is "$ROWS" 2 "mixed, fewer slots than ready jobs"
reset "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('cq', 'due'); INSERT INTO pgjobd.jobs (queue) VALUES ('cq');
	UPDATE pgjobd.jobs SET held_until = now() - interval '1 s' WHERE group_id = 'due'"
same held-due full '{a,b}'
is "$ROWS" 2 "a held mark that is due: cleared, and its job starts"
reset "INSERT INTO pgjobd.jobs (queue) VALUES ('cq'); INSERT INTO pgjobd.paused_queues (queue) VALUES ('cq')"
same paused full '{a}' "$register"
is "$ROWS" 0 "paused: nothing starts (and the waiting row goes)"
reset "INSERT INTO pgjobd.jobs (queue) VALUES ('cq'), ('cq');
	UPDATE pgjobd.jobs SET status = 'running', attempts = 1, worker = 'x', worker_id = $W,
	       fence = nextval('pgjobd.fence_seq'), started_at = now(), lease_until = now() + interval '1 min',
	       lease_ms = 60000
	 WHERE id = (SELECT min(id) FROM pgjobd.jobs)"
same orphans full '{a,b}' orphans=true
is "$ROWS" 2 "orphan pass: our own unheld job is given back and started again with the other"
reset "INSERT INTO pgjobd.jobs (queue) VALUES ('cq')"
same no-slots full '{}' "$register"
is "$ROWS" 0 "no slots: nothing, the waiting row left as it was"
W_SAVE=$W
W=$D
same dead full '{a}'
is "$ROWS" 0 "an instance declared dead starts nothing"
W=$W_SAVE

# The daemon takes both paths: an ungrouped queue's jobs without claim_batch, a
# grouped queue's with it (the database's sessions count function calls).
reset ""
psql_q "ALTER DATABASE $(psql_q 'SELECT current_database()') SET track_functions = 'pl'" >/dev/null
write_conf "$T/d.ini" <<EOF
$(conf_header poll_interval=1h)

[queue.free]
command = true
concurrency = 4

[queue.grp]
command = true
concurrency = 4

[queue.lfree]
command = true
concurrency = 4
lock_mode = lease
EOF
# A session's function statistics reach the shared counters when it ends (an idle
# one may keep them for up to 10 s): each run counts the calls of a daemon that has
# stopped, whose sessions are gone.
calls() {
	psql_q "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'claim_batch'"
}
# daemon_run NAME [INSERT DONE]: a daemon's run until its claimers wait, then INSERT
# (SQL) and until DONE (a condition) holds, then its stop; its sessions' calls of
# claim_batch in $CALLS.
daemon_run() {
	local c0
	c0=$(calls)
	start_daemon "$1" "$T/d.ini"
	wait_until 20 "grep -q 'msg=\"ready\"' '$T/$1.log'" || bail_out "daemon $1 not ready"
	wait_until 20 "queues_waiting free grp lfree" || bail_out "daemon $1: claimers not waiting"
	if [ -n "${2:-}" ]; then
		psql_q "$2" >/dev/null
		wait_until 30 "$3"
		ok $? "$1: its jobs succeed"
	fi
	stop_daemon "$DAEMON_PID" 30
	wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgjobd %'\")\" = 0 ]" ||
		bail_out "daemon $1: its sessions did not end"
	CALLS=$(($(calls) - c0))
}
daemon_run idle
idle=$CALLS
note "an idle daemon's claim_batch calls: $idle (the first claim of each claimer, with the orphan pass)"
daemon_run ungrouped "INSERT INTO pgjobd.jobs (queue) SELECT q FROM generate_series(1, 20), unnest('{free,lfree}'::text[]) q" \
	"[ \"\$(count_jobs \"status = 'succeeded'\")\" = 40 ]"
is "$CALLS" "$idle" "40 ungrouped jobs of both lock modes: no call of claim_batch beyond the idle daemon's"
daemon_run grouped "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'grp', 'g' || (i % 3) FROM generate_series(1, 12) i" \
	"[ \"\$(count_jobs \"queue = 'grp' AND status = 'succeeded'\")\" = 12 ]"
cmp_ok "$CALLS" -gt "$idle" "12 grouped jobs: their claims call claim_batch"

done_testing
