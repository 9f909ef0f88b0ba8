#!/usr/bin/env bash
# The server turns read-only (ALTER SYSTEM SET default_transaction_read_only = on and a
# reload: what a demoted primary or a hot standby answers too, SQLSTATE 25006) for 10 s.
#  1. lock mode lease, a job whose command ends meanwhile: its outcome is written once
#     the server takes writes again (not given up), in one attempt with one history
#     entry, the command ran once;
#  2. the same in lock mode transaction;
#  3. jobs of both modes queued while the server is read-only: claimed once it is not.
# And in each window nothing spins: the daemon's statements at the server (counted in
# the server's log, log_statement = all, by application name) stay under 50 a second,
# its log under 1.5 lines a second, and the read-only server is named once.
. "$(dirname "$0")/lib.sh"
own_cluster
require_pgjobd
pg_start

WINDOW=10
psql_q "ALTER SYSTEM SET log_line_prefix = '%m [%a] '" >/dev/null
psql_q "SELECT pg_reload_conf()" >/dev/null

# read_only on|off: the server's default_transaction_read_only, with every statement
# logged while it is on.
read_only() {
	local stmt=none
	[ "$1" = on ] && stmt=all
	PGOPTIONS="-c default_transaction_read_only=off" psql -X -qAt -v ON_ERROR_STOP=1 \
		-c "ALTER SYSTEM SET default_transaction_read_only = $1" \
		-c "ALTER SYSTEM SET log_statement = '$stmt'" \
		-c "SELECT pg_reload_conf()" >/dev/null || bail_out "cannot turn read_only $1"
}

# window NAME LOG: the server read-only for WINDOW seconds; NAME's statements in that time
# (the daemon's sessions are "pgjobd ...") into $STMTS, the lines of LOG into $LINES.
window() {
	local pg0 log0 pg1 log1
	read_only on
	pg0=$(stat -c %s "$T/pg.log")
	log0=$(wc -l <"$2")
	sleep "$WINDOW"
	pg1=$(stat -c %s "$T/pg.log")
	log1=$(wc -l <"$2")
	read_only off
	STMTS=$(head -c "$pg1" "$T/pg.log" | tail -c +"$((pg0 + 1))" |
		grep -E '\[pgjobd[^]]*\] LOG:  (statement|execute)' | wc -l)
	LINES=$((log1 - log0))
	note "$1: $STMTS statements at the server and $LINES log lines in ${WINDOW}s read-only"
	sed -n "$((log0 + 1)),${log1}p" "$2" | head -n 60 | sed 's/^/# /'
}

bounded() {
	cmp_ok "$STMTS" -lt $((50 * WINDOW)) "$1: statements at the server under 50/s while read-only"
	cmp_ok "$LINES" -lt $((3 * WINDOW / 2)) "$1: daemon log under 1.5 lines/s while read-only"
}

# ran_once LOG ID: the command of job ID started exactly once.
ran_once() { [ "$(grep -c "^start [^ ]* $2 " "$1")" = 1 ]; }

make_mark_script "$T/mark.sh" "$T/runs.log"

# ---- 1. lease: the command ends while the server is read-only
write_conf "$T/l.ini" <<EOF2
$(conf_header log_level=info)

[queue.l]
command = '$T/mark.sh'
lock_mode = lease
lease = 20s
EOF2
start_daemon l "$T/l.ini"
L=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the lease daemon did not register"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('l', '{\"sleep\": 3}') RETURNING id")
wait_until 10 "mark_started '$T/runs.log' $id 1" || bail_out "the lease job did not start"
window "lease" "$T/l.log"
bounded "lease"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "lease: the job succeeded once the server took writes again"
is "$(job_field "$id" "attempts || ' ' || jsonb_array_length(history) || ' ' || (history->0->>'reason')")" \
	"1 1 none" "lease: one attempt, one history entry, a success"
ran_once "$T/runs.log" "$id"
ok $? "lease: the command ran once"
is "$(grep -c 'the server is read-only' "$T/l.log")" 1 "lease: the read-only server is named once"
unlike "$(cat "$T/l.log")" "giving up" "lease: no outcome given up"
wait_until 10 "grep -q 'the server takes writes again' '$T/l.log'"
ok $? "lease: and that it takes writes again"
stop_daemon "$L"
is $? 0 "lease: the daemon exits 0"

# ---- 2. transaction: the same
write_conf "$T/t.ini" <<EOF2
$(conf_header log_level=info)

[queue.t]
command = '$T/mark.sh'
EOF2
start_daemon t "$T/t.ini"
D=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('t', '{\"sleep\": 3}') RETURNING id")
wait_until 10 "mark_started '$T/runs.log' $id 1" || bail_out "the job did not start"
window "transaction" "$T/t.log"
bounded "transaction"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "transaction: the job succeeded"
is "$(job_field "$id" "attempts || ' ' || jsonb_array_length(history) || ' ' || (history->0->>'reason')")" \
	"1 1 none" "transaction: one attempt, one history entry, a success"
ran_once "$T/runs.log" "$id"
ok $? "transaction: the command ran once"
is "$(grep -c 'the server is read-only' "$T/t.log")" 1 "transaction: the read-only server is named once"
stop_daemon "$D"
is $? 0 "transaction: the daemon exits 0"

# ---- 3. claims while the server is read-only (jobs of both modes queued meanwhile)
write_conf "$T/c.ini" <<EOF2
$(conf_header log_level=info)

[queue.t]
command = '$T/mark.sh'
concurrency = 2

[queue.l]
command = '$T/mark.sh'
lock_mode = lease
lease = 20s
concurrency = 2
EOF2
start_daemon c "$T/c.ini"
C=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "the daemon did not register"
wait_until 10 "queues_waiting t l" || bail_out "the queues did not wait"
(sleep 1 && PGOPTIONS="-c default_transaction_read_only=off" psql -X -qAt -c \
	"INSERT INTO pgjobd.jobs (queue) SELECT q FROM unnest('{t,t,l,l}'::text[]) q" >/dev/null) &
window "claims" "$T/c.log"
bounded "claims"
wait_until 30 "[ \"\$(count_jobs \"id > $id AND status = 'succeeded'\")\" = 4 ]"
ok $? "claims: the jobs queued meanwhile ran once the server took writes again"
is "$(count_jobs "attempts <> 1 OR jsonb_array_length(history) <> 1")" 0 \
	"claims: every job in one attempt with one history entry"
is "$(awk '$1 == "start" { n[$3]++ } END { for (i in n) if (n[i] > 1) print i }' "$T/runs.log")" "" \
	"no command ran twice"
stop_daemon "$C"
is $? 0 "claims: the daemon exits 0"
done_testing
