#!/usr/bin/env bash
# The harness itself: PostgreSQL starts, psql works, restart works, wait_until times out,
# the marker checker catches overlaps and order violations. Needs no pgjobd binary.
. "$(dirname "$0")/lib.sh"

plan 24

own_cluster # it restarts the server
pg_start
pass "pg_start"
is "$(psql_q 'SELECT 1')" 1 "psql works"
is "$(psql_q 'SELECT current_database()')" pgjobd_test "PGDATABASE is pgjobd_test"
is "$(psql_q 'SELECT current_user')" postgres "connected as postgres"
is "$(psql_q "SHOW listen_addresses")" "" "no TCP listener"
is "$(psql_q "SHOW unix_socket_directories")" "$T/sock" "socket in \$T/sock"
is "$(psql_q "SHOW fsync")" off "fsync is off"
is "$(psql -X -qAt -d "$DB_CONNINFO" -c 'SELECT current_database()')" pgjobd_test \
	"DB_CONNINFO connects to pgjobd_test"
psql_q 'SELECT * FROM no_such_table' >/dev/null 2>&1
isnt $? 0 "psql_q fails on an SQL error"
is "$(psql_q "SELECT $(sql_lit "it's \\ \"q\" \$x")")" "it's \\ \"q\" \$x" "sql_lit quotes"

start_time=$(psql_q 'SELECT pg_postmaster_start_time()')
psql_q 'CREATE TABLE t (x int); INSERT INTO t VALUES (42)'
ok_cmd "pg_restart" pg_restart
is "$(psql_q 'SELECT x FROM t')" 42 "data survives the restart"
isnt "$(psql_q 'SELECT pg_postmaster_start_time()')" "$start_time" "the server was restarted"

t0=$(now_ms)
wait_until 1 false 2>/dev/null
is $? 1 "wait_until returns 1 on timeout"
elapsed=$(($(now_ms) - t0))
ok "$([ "$elapsed" -ge 1000 ] && [ "$elapsed" -lt 3000 ]; echo $?)" \
	"wait_until waited about 1 s (${elapsed} ms)"
t0=$(now_ms)
wait_until 0.3 false 2>/dev/null
elapsed=$(($(now_ms) - t0))
ok "$([ "$elapsed" -ge 300 ] && [ "$elapsed" -lt 2000 ]; echo $?)" \
	"wait_until takes fractional seconds (${elapsed} ms)"
(sleep 0.3 && touch "$T/flag") &
wait_until 10 '[ -e "$T/flag" ]'
ok $? "wait_until sees a condition become true"

sleep 300 &
p=$!
pid_alive $p
ok $? "pid_alive: a running process"
kill -KILL $p
wait $p 2>/dev/null
pid_alive $p
isnt $? 0 "pid_alive: a dead process"

printf '%s\n' 'start g 1 1 10' 'end g 1 1 10' 'start h 2 1 11' 'start g 3 1 12' 'end h 2 1 11' \
	'end g 3 1 12' 'start g 3 2 13' 'end g 3 2 13' 'start - 4 1 14' 'start - 5 1 15' \
	'end - 4 1 14' 'end - 5 1 15' >"$T/good.log"
ok_cmd "check_markers accepts a good log" check_markers "$T/good.log"
printf '%s\n' 'start g 1 1 10' 'start g 2 1 11' 'end g 1 1 10' 'end g 2 1 11' >"$T/overlap.log"
check_markers "$T/overlap.log" >/dev/null
isnt $? 0 "check_markers rejects an overlap"
printf '%s\n' 'start g 2 1 10' 'end g 2 1 10' 'start g 1 1 11' 'end g 1 1 11' >"$T/order.log"
check_markers "$T/order.log" >/dev/null
isnt $? 0 "check_markers rejects a group out of id order"
printf '%s\n' 'start g 1 1 10' 'end g 1 1 10' 'start g 2 1 11' 'end g 2 1 11' \
	'start g 1 2 12' 'end g 1 2 12' >"$T/again.log"
check_markers "$T/again.log" >/dev/null
isnt $? 0 "check_markers rejects a retry that ran after a later job"
is "$(max_parallel "$T/good.log")" 2 "max_parallel"
