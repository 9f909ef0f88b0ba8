#!/usr/bin/env bash
# Group order is commit order (pgjobd(8), Guarantees: group order): a group's jobs start in
# the order they became visible, and jobs committed together in id order. Each case holds
# the group busy with a running "gate" job while producers' transactions insert and commit
# in an order that differs from id order, then opens the gate:
#   1. T1 inserts A and stays open; B is inserted and committed; T1 commits: B, then A.
#   2. three transactions commit in reverse id order: they start in reverse id order.
#   3. a transaction's jobs start in id order, after a job committed between its INSERTs.
#   4. a head placed after a later-committed job keeps its place when its first attempt
#      fails: waiting for its retry, it holds back the job committed after it.
#   5. a finished job put back to `queued` goes behind the jobs of its group already
#      visible.
#   6. the same as 1 with a REPEATABLE READ producer.
#   7. a multi-row INSERT overtaken by a later commit: the later job first, then its jobs in
#      id order; 8. not overtaken: its jobs keep their ids as their places.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
# The command logs "start GROUP ID ATTEMPT", waits while data.gate names a file that does
# not exist yet, and fails while ATTEMPT <= data.fail_attempts.
cat >"$T/job.sh" <<EOF
#!/bin/bash
echo "start \${PGJOBD_GROUP_ID:--} \$PGJOBD_JOB_ID \$PGJOBD_ATTEMPT" >>'$T/starts.log'
if [ -n "\${PGJOBD_ARG_gate:-}" ]; then
	while [ ! -e '$T'/"\$PGJOBD_ARG_gate" ]; do sleep 0.05; done
fi
[ "\${PGJOBD_ARG_fail_attempts:-0}" -ge "\$PGJOBD_ATTEMPT" ] && exit 1
echo '{"ok": true}'
EOF
chmod +x "$T/job.sh"
conf=$T/order.ini
write_conf "$conf" <<EOF
$(conf_header)

[queue.co]
command = /bin/bash '$T/job.sh'
concurrency = 4
max_attempts = 3
backoff = 1s
backoff_max = 1s
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$conf"
d=$DAEMON_PID

# ---------------------------------------------------------------- helpers

# A producer's transaction kept open in a psql session of its own, fed through a FIFO.
# Call these in the test's own shell (not in $(...)): they keep the session's state here.
declare -A TX_FD TX_LINES
tx_begin() { # NAME [ISOLATION]
	local fd
	mkfifo "$T/tx.$1"
	psql -X -qAt -v ON_ERROR_STOP=1 <"$T/tx.$1" >"$T/tx.$1.out" 2>&1 &
	echo $! >"$T/tx.$1.pid"
	exec {fd}>"$T/tx.$1"
	TX_FD[$1]=$fd
	TX_LINES[$1]=0
	echo "BEGIN${2:+ ISOLATION LEVEL $2};" >&"$fd"
}
# tx_insert VAR NAME GROUP [DATA]: inserts one job in the open transaction NAME and sets
# VAR to its id.
tx_insert() {
	local n=$((TX_LINES[$2] + 1))
	echo "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('co', '$3', '${4:-{\}}') RETURNING id;" >&"${TX_FD[$2]}"
	TX_LINES[$2]=$n
	wait_until 10 "[ \"\$(wc -l <'$T/tx.$2.out')\" -ge $n ]" || return 1
	printf -v "$1" '%s' "$(sed -n "${n}p" "$T/tx.$2.out")"
}
# tx_sql NAME SQL: runs SQL (with no output) in the open transaction NAME, and returns once
# it has run.
tx_sql() {
	local n=$((TX_LINES[$1] + 1))
	printf '%s;\nSELECT 1;\n' "$2" >&"${TX_FD[$1]}"
	TX_LINES[$1]=$n
	wait_until 10 "[ \"\$(wc -l <'$T/tx.$1.out')\" -ge $n ]"
}
tx_commit() { # NAME: commits and waits for the session to end
	local pid fd=${TX_FD[$1]}
	pid=$(cat "$T/tx.$1.pid")
	echo "COMMIT;" >&"$fd"
	exec {fd}>&-
	wait_until 10 "! pid_alive $pid"
	wait "$pid"
}
# enqueue GROUP [DATA]: one job in its own (committed) transaction; prints its id.
enqueue() { psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES ('co', '$1', '${2:-{\}}') RETURNING id"; }
# gate GROUP: a job of GROUP that runs until gate_open GROUP; returns once it runs.
gate() {
	local id
	id=$(enqueue "$1" "{\"gate\": \"go.$1\"}")
	wait_until 20 "grep -q '^start $1 $id ' '$T/starts.log' 2>/dev/null"
}
gate_open() { touch "$T/go.$1"; }
# starts GROUP: the ids of GROUP's starts after its gate job, in order, one per attempt.
starts() {
	awk -v g="$1" '$1 == "start" && $2 == g && n++ { printf "%s%s", s, $3; s = " " }' "$T/starts.log"
}
done_in() { # GROUP COUNT: COUNT jobs of GROUP have succeeded
	wait_until 30 "[ \"\$(count_jobs \"group_id = '$1' AND status = 'succeeded'\")\" = $2 ]"
}

# ---------------------------------------------------------------- 1. the failing case

gate g1
tx_begin t1
tx_insert a t1 g1
b=$(enqueue g1)
tx_commit t1
ok $? "case 1: A ($a) was inserted first and committed last, after B ($b)"
cmp_ok "$a" -lt "$b" "case 1: A has the smaller id"
gate_open g1
done_in g1 3
ok $? "case 1: all jobs succeed"
is "$(starts g1)" "$b $a" "case 1: B, committed first, starts before A"
is "$(job_field "$b" 'commit_seq IS NULL')" t "case 1: B, committed in id order, keeps its id as its place (not rewritten)"
is "$(job_field "$a" "commit_seq > $b")" t "case 1: A takes a place after B at its commit"

# ---------------------------------------------------------------- 2. reverse commits

gate g2
tx_begin t21
tx_begin t22
tx_begin t23
tx_insert x1 t21 g2
tx_insert x2 t22 g2
tx_insert x3 t23 g2
tx_commit t23 && tx_commit t22 && tx_commit t21
ok $? "case 2: three transactions committed in reverse id order ($x3, $x2, $x1)"
gate_open g2
done_in g2 4
ok $? "case 2: all jobs succeed"
is "$(starts g2)" "$x3 $x2 $x1" "case 2: they start in commit order"

# ---------------------------------------------------------------- 3. one transaction

gate g3
tx_begin t3
tx_insert c1 t3 g3
dj=$(enqueue g3)
tx_insert c2 t3 g3
tx_insert c3 t3 g3
tx_commit t3
ok $? "case 3: a transaction inserted $c1, then $dj was committed, then it inserted $c2, $c3 and committed"
gate_open g3
done_in g3 5
ok $? "case 3: all jobs succeed"
is "$(starts g3)" "$dj $c1 $c2 $c3" "case 3: the job committed first, then the transaction's jobs in id order"

# ---------------------------------------------------------------- 4. a retry holds back

gate g4
tx_begin t4
tx_insert h t4 g4 '{"fail_attempts": 1}'
k=$(enqueue g4)
tx_commit t4
l=$(enqueue g4)
ok $? "case 4: H ($h, fails once) committed after K ($k), then L ($l)"
gate_open g4
done_in g4 4
ok $? "case 4: all jobs succeed"
is "$(starts g4)" "$k $h $h $l" "case 4: K, then H twice (its retry), then L"
is "$(psql_q "SELECT (SELECT started_at FROM pgjobd.jobs WHERE id = $l) > (SELECT finished_at FROM pgjobd.jobs WHERE id = $h)")" t \
	"case 4: L started only after H's retry had finished"

# ---------------------------------------------------------------- 5. put back to queued

f=$(enqueue g5)
done_in g5 1
ok $? "case 5: F ($f) ran and succeeded"
gate g5
m=$(enqueue g5)
psql_q "UPDATE pgjobd.jobs SET status = 'queued', attempts = 0, run_at = now(), finished_at = NULL
	WHERE id = $f" >/dev/null
ok $? "case 5: M ($m) enqueued, then F put back to queued"
gate_open g5
wait_until 30 "[ \"\$(count_jobs \"id IN ($f, $m) AND status = 'succeeded'\")\" = 2 ]"
ok $? "case 5: both succeed"
is "$(starts g5 | sed 's/^[^ ]* //')" "$m $f" "case 5: M, then F, which became queued again after M was visible"

# ---------------------------------------------------------------- 6. REPEATABLE READ

gate g6
tx_begin t6 'REPEATABLE READ'
tx_insert a6 t6 g6
b6=$(enqueue g6)
tx_commit t6
ok $? "case 6: a REPEATABLE READ transaction inserted $a6 and committed after $b6"
gate_open g6
done_in g6 3
ok $? "case 6: all jobs succeed"
is "$(starts g6)" "$b6 $a6" "case 6: the job committed first starts first"

# ---------------------------------------------------------------- 7. multi-row INSERTs

# One statement inserts three jobs; a later job is committed before it commits.
gate g7
tx_begin t7
tx_sql t7 "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'co', 'g7' FROM generate_series(1, 3)"
u7=$(enqueue g7)
tx_commit t7
ok $? "case 7: a three-job INSERT committed after job $u7"
m7=$(psql_q "SELECT string_agg(id::text, ' ' ORDER BY id) FROM pgjobd.jobs
	WHERE group_id = 'g7' AND id <> $u7 AND NOT data ? 'gate'")
gate_open g7
done_in g7 5
ok $? "case 7: all jobs succeed"
is "$(starts g7)" "$u7 $m7" "case 7: the job committed first, then the three in id order"
# Nobody overtakes: the jobs keep their ids as their places, and no row is written again.
gate g8
tx_begin t8
tx_sql t8 "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'co', 'g8' FROM generate_series(1, 3)"
tx_insert n8 t8 g8
tx_commit t8
# (A row not written since its INSERT still has the inserting transaction as its xmin.)
is "$(psql_q "SELECT count(*) || ' ' || count(commit_seq) || ' ' ||
	count(*) FILTER (WHERE xmin::text = (enqueued_xact::text::bigint % 4294967296)::text)
	FROM pgjobd.jobs WHERE group_id = 'g8' AND NOT data ? 'gate'")" "4 0 4" \
	"case 8: four jobs of one transaction, nobody overtook them: none renumbered, none written again"
gate_open g8
done_in g8 5
ok $? "case 8: all jobs succeed"
is "$(starts g8)" "$(psql_q "SELECT string_agg(id::text, ' ' ORDER BY id) FROM pgjobd.jobs
	WHERE group_id = 'g8' AND NOT data ? 'gate'")" "case 8: they start in id order"

is "$(count_jobs "status <> 'succeeded'")" 0 "every job succeeded"
stop_daemon "$d"
is $? 0 "the daemon exits 0"
done_testing
