#!/usr/bin/env bash
# Groups held back by a retry (pgjobd(8), Guarantees: group order): a group whose head waits out a
# backoff holds back its later jobs, and must cost a claim nothing. With 20,000 such
# groups, each with a ready second job that comes first in start order, a claim costs
# about what it costs with none (buffers), writes no WAL for them, and claims the ready
# ungrouped and grouped jobs behind them in start order; a claim that finds nothing
# costs what it costs on an empty queue. With a daemon: a group's second job starts only
# after its head's retry, and when a waiting head is cancelled, at once.
. "$(dirname "$0")/lib.sh"
require_pgjobd

own_cluster # it measures WAL, which the server writes for every database
pg_start
make_mark_script "$T/mark.sh" "$T/markers.log"
conf=$T/held.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.ord]
command = /bin/bash '$T/mark.sh'
concurrency = 4
max_attempts = 3
backoff = 2s
backoff_max = 2s

[queue.stuck]
command = /bin/bash '$T/mark.sh'
max_attempts = 3
backoff = 1h
backoff_max = 1h
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate"

# ---------------------------------------------------------------- cost of a claim

G=20000  # held groups
SCAN=1000 # the claim's scan bound, as the daemon passes it (src/claim.c)
WARM=$((G / SCAN + 5))
N=12 # measured claims per phase; the median of the last 9 counts
# Queue `held`: G groups whose head (attempts 1) waits out a backoff of an hour, each
# with a second job that became ready an hour ago; then the work, ready for half an
# hour: WARM + N jobs, alternately ungrouped and in a group of their own, each a
# second later than the one before, so start order is id order. Queue `none`: N jobs
# of the same work alone. No daemon serves these queues; the claims are made here.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, run_at, attempts)
	SELECT 'held', 'h' || i, now() + interval '1 hour', 1 FROM generate_series(1, $G) i"
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, run_at)
	SELECT 'held', 'h' || i, now() - interval '1 hour' FROM generate_series(1, $G) i"
work() { # QUEUE COUNT
	psql_q "INSERT INTO pgjobd.jobs (queue, group_id, run_at)
		SELECT '$1', CASE WHEN i % 2 = 0 THEN 'w' || i END,
		       now() - interval '30 minutes' + i * interval '1 second'
		  FROM generate_series(1, $2) i ORDER BY i"
}
work held $((WARM + N))
work none $N
# Autovacuum would write WAL of its own while WAL is measured: VACUUM runs where this
# test says, as autovacuum would after the same changes.
psql_q "ALTER TABLE pgjobd.jobs SET (autovacuum_enabled = false)" >/dev/null
psql_q "VACUUM ANALYZE pgjobd.jobs" >/dev/null

W=$(psql_q "SELECT pgjobd.register_worker('test:1', 600000)")
# claims QUEUE COUNT: COUNT claims for one slot in one warm session (a new session's
# first call compiles the function and reads the catalogs), each followed by the
# claimed job's finish. Appends to $T/claims.QUEUE one line per claim:
# "buffers B wal W ms M got ID" (ID empty: nothing claimed). W is the WAL
# the claim's own transaction wrote (the finish is not counted).
claims() {
	local i sql=""
	for i in $(seq "$2"); do
		sql+="SELECT pg_current_wal_insert_lsn() AS lsn \\gset
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM pgjobd.claim_batch('$1', $W, '{test}', 5, 0, 1048576, $SCAN, false, '{}', '{}', '{}');
SELECT 'wal ' || pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'lsn');
SELECT 'got ' || coalesce(string_agg(id::text, ','), '') FROM pgjobd.jobs WHERE worker = 'test' AND status = 'running';
UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE worker = 'test' AND status = 'running';
"
	done
	psql -X -qAt -v ON_ERROR_STOP=1 <<<"$sql" >"$T/raw.$1" 2>&1 || diag "$(tail -n 5 "$T/raw.$1")"
	awk '/Buffers: shared/ && !b { n = 0; for (f = 1; f <= NF; f++) { split($f, kv, "=");
			if (kv[1] == "hit" || kv[1] == "read") n += kv[2] } b = n }
		/Execution Time/ { ms = $3 }
		/^wal / { w = $2 }
		/^got / { print "buffers " b " wal " w " ms " ms " got " $2; b = "" }' "$T/raw.$1" >>"$T/claims.$1"
}
# median FIELD QUEUE FROM: the median of FIELD over the last 9 claims of lines FROM.. of
# $T/claims.QUEUE.
median() {
	tail -n +"$3" "$T/claims.$2" | head -n "$N" | tail -n 9 |
		awk -v f="$1" '{ for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' |
		sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'
}

t0=$(now_ms)
claims held "$WARM"
warm_ms=$(($(now_ms) - t0))
warm_wal=$(awk '{ s += $4 } END { print s }' "$T/claims.held")
note "$WARM claims over $G held groups (the first ones take the groups out of the scan): $warm_ms ms, $((warm_wal / 1024)) KB of WAL in all"
# The marks replaced index entries and row versions: VACUUM, as autovacuum would.
psql_q "VACUUM pgjobd.jobs" >/dev/null
claims held "$N"          # work left
claims held "$N"          # nothing left
claims none "$N"
claims none "$N"

s=$((WARM + 1))
e=$((WARM + N + 1))
for f in buffers wal ms; do
	eval "held_work_$f=\$(median $f held $s); held_idle_$f=\$(median $f held $e)"
	eval "none_work_$f=\$(median $f none 1); none_idle_$f=\$(median $f none $((N + 1)))"
done
note "per claim (median): buffers, WAL bytes, ms
  claiming a job:  $G held groups: $held_work_buffers, $held_work_wal, $held_work_ms; none: $none_work_buffers, $none_work_wal, $none_work_ms
  nothing to take: $G held groups: $held_idle_buffers, $held_idle_wal, $held_idle_ms; none: $none_idle_buffers, $none_idle_wal, $none_idle_ms"
cmp_ok "${none_work_buffers:-0}" -gt 0 "the claims' buffers are measured"
cmp_ok "${held_work_buffers:-999999}" -le $((none_work_buffers * 2)) \
	"claiming a job: $G held groups cost at most twice the buffers of none"
cmp_ok "${held_idle_buffers:-999999}" -le $((none_idle_buffers * 2)) \
	"claiming nothing: $G held groups cost at most twice the buffers of an empty queue"
# The same claim writes the same WAL (its job's update) whatever waits in the queue; a
# few bytes of slack for a record's alignment.
cmp_ok "${held_work_wal:-999999}" -le $((${none_work_wal:-0} + 64)) \
	"claiming a job: no WAL for the held groups"
cmp_ok "${held_idle_wal:-999999}" -le $((${none_idle_wal:-0} + 64)) \
	"claiming nothing: no WAL for the held groups"

# What was claimed: one work job per claim while work was left, each once, never a job
# of a held group. While the first claims take the groups out of their scan (p_scan of
# them per call), a claim may take a job that comes later in start order than a grouped
# job its bounded scan did not reach, as any claim whose scan is cut (see
# sql/README, "The claim protocol"); from then on, start order.
claimed() { awk -v from="$2" -v n="$3" 'NR >= from && NR < from + n && $NF != "got" { print $NF }' "$T/claims.$1" | tr '\n' ' '; }
work_ids() { # QUEUE ORDER-BY
	psql_q "SELECT string_agg(id::text, ' ' ORDER BY $2) || ' ' FROM pgjobd.jobs
		WHERE queue = '$1' AND (group_id IS NULL OR group_id LIKE 'w%')"
}
is "$(claimed held 1 $((WARM + N)) | tr ' ' '\n' | sort -n | tr '\n' ' ')" "$(work_ids held id)" \
	"the claims took every ready ungrouped and grouped job behind the held groups, once each"
is "$(claimed held $((WARM + N + 1)) "$N" | tr -d ' ')" "" "and then found nothing"
is "$(count_jobs "queue = 'held' AND group_id LIKE 'h%' AND status <> 'queued'")" 0 \
	"no job of a held group was started"
is "$(claimed held "$s" "$N")" "$(psql_q "SELECT string_agg(id::text, ' ' ORDER BY run_at, id) || ' ' FROM (
	SELECT id, run_at FROM pgjobd.jobs WHERE queue = 'held' AND (group_id IS NULL OR group_id LIKE 'w%')
	ORDER BY started_at DESC LIMIT $N) l")" "once the groups were out of the scan, the claims took the work in start order"
is "$(claimed none 1 $((2 * N)))" "$(work_ids none 'run_at, id')" "without held groups: the same work, in start order"
psql_q "ALTER TABLE pgjobd.jobs RESET (autovacuum_enabled)" >/dev/null

# ---------------------------------------------------------------- marked by the outcome

# A head's failed attempt with a backoff marks its group at once, in the outcome's
# transaction (trigger jobs_backed_off), so that no claim has to meet the group first.
# Queue `side` has no daemon: the claim and the outcome are made here, as a daemon's. A
# backoff under a second is left to the claims.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'side', g FROM (VALUES ('x'), ('x'), ('x'), ('y'), ('y')) v(g)"
backoff() { # GROUP DELAY: claim the group's head and write a failed attempt due after DELAY
	psql_q "UPDATE pgjobd.jobs SET status = 'running', attempts = 1, worker = 'test', started_at = now()
		WHERE id = (SELECT min(id) FROM pgjobd.jobs WHERE queue = 'side' AND group_id = '$1');
		UPDATE pgjobd.jobs SET status = 'queued', run_at = clock_timestamp() + interval '$2',
		       error = '{\"reason\": \"exit\"}'
		 WHERE queue = 'side' AND group_id = '$1' AND status = 'running'"
}
backoff x '1 hour'
is "$(psql_q "SELECT string_agg(coalesce((held_until = (SELECT run_at FROM pgjobd.jobs h WHERE h.queue = 'side'
	AND h.group_id = 'x' AND h.attempts = 1))::text, 'unmarked'), ',' ORDER BY id) FROM pgjobd.jobs
	WHERE queue = 'side' AND group_id = 'x'")" "true,true,true" \
	"a head backed off for an hour: it and its group's later jobs are marked held until its run_at"
backoff y '200 milliseconds'
is "$(count_jobs "queue = 'side' AND group_id = 'y' AND held_until IS NOT NULL")" 0 \
	"a backoff under a second: no mark (the claims would clear it at once)"

# ---------------------------------------------------------------- order, with a daemon

start_daemon d "$conf"
d=$DAEMON_PID
# Queue ord: five groups whose first job fails once (backoff 1-2 s), each with two jobs
# behind it, and ungrouped jobs. Queue stuck: a group whose first job fails once and
# then waits an hour, with a job behind it.
psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
	SELECT 'ord', 'o' || g, CASE WHEN k = 1 THEN '{\"fail_attempts\": 1}'::jsonb ELSE '{}' END
	  FROM generate_series(1, 3) k, generate_series(1, 5) g ORDER BY k, g"
psql_q "INSERT INTO pgjobd.jobs (queue, data) SELECT 'ord', '{}' FROM generate_series(1, 5)"
s1=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data)
	VALUES ('stuck', 's', '{\"fail_attempts\": 1}') RETURNING id")
s2=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('stuck', 's') RETURNING id")

wait_until 60 "[ \"\$(count_jobs \"queue = 'ord' AND status <> 'succeeded'\")\" = 0 ]"
ok $? "queue ord: all 20 jobs succeed"
is "$(count_jobs "queue = 'ord' AND group_id IS NOT NULL AND data ? 'fail_attempts' AND attempts <> 2")" 0 \
	"each group's first job ran twice"
problems=$(check_markers "$T/markers.log")
ok $? "no overlap within a group, id order kept" || diag "$problems"
is "$(psql_q "SELECT count(*) FROM pgjobd.jobs h JOIN pgjobd.jobs l
	ON l.queue = h.queue AND l.group_id = h.group_id AND l.id > h.id
	WHERE h.queue = 'ord' AND h.data ? 'fail_attempts' AND l.started_at < h.finished_at")" 0 \
	"no later job of a group started before its first job's retry had finished"

wait_until 20 "[ \"\$(job_field $s1 \"status || '/' || attempts || '/' || (run_at > now() + interval '10 minutes')\")\" = queued/1/true ]"
ok $? "queue stuck: the group's first job failed and waits out its backoff"
is "$(job_field $s2 'held_until IS NOT NULL')" t "its failed attempt took the job behind it out of the claims' scan"
is "$(job_field $s2 status)" queued "that job has not started"
psql_q "SELECT pgjobd.cancel($s1)" >/dev/null
wait_until 20 "[ \"\$(job_field $s2 status)\" = succeeded ]"
ok $? "the waiting head cancelled, the job behind it runs at once"
is "$(job_field $s2 'held_until IS NULL')" t "and keeps no mark"

stop_daemon "$d"
is $? 0 "the daemon exits 0"
done_testing
