#!/usr/bin/env bash
# Lock mode lease when the network stops carrying the daemon's connections without a
# word (a router or firewall that lost its state drops their packets; new connections
# pass): the relay black-holes every connection it carries (SIGUSR2). The lease
# session's next batch never gets an answer, and TCP would not say so for minutes (here
# never: the relay's side accepts everything). The daemon gives a batch up after a third
# of the shortest lease and the fence session's after fence_timeout, counts the session
# as lost and connects again (src/db.c, db_set_reply_timeout): the long command runs on,
# extended from the new session, its job ends once in attempt 1, and a job queued after
# the black hole runs.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start_relayed

make_mark_script "$T/mark.sh" "$T/marks.log"
write_conf "$T/a.ini" <<EOF
$(conf_header fence_timeout=2s "database=host=127.0.0.1 port=$RELAY_PORT dbname=$PGDATABASE user=postgres")

[queue.p]
command = exec '$T/mark.sh'
concurrency = 2
lock_mode = lease
lease = 9s
max_attempts = 3
kill_grace = 1s
EOF
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"

long=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('p', '{\"gate\": \"long\"}') RETURNING id")
wait_until 15 "mark_started $T/marks.log $long 1" || bail_out "the long job did not start"
pid=$(mark_pid "$T/marks.log" "$long" 1)
# The lease is 9 s, extended every 3 s: past 12 s, a command whose extensions stayed
# stuck would have been killed (lost_lock).
kill -USR2 "$RELAY"
hole_at=$(now_ms)
while [ $(($(now_ms) - hole_at)) -lt 12000 ]; do sleep 0.1; done
pid_alive "$pid"
ok $? "the long command runs 12 s after the black hole, longer than its lease (9 s)"
grep -q 'msg="database connection lost" app=pgjobd lease err="no answer within 3000 ms"' "$T/a.log"
ok $? "the lease session's batch was given up after a third of the lease"
grep -q 'msg="database connection lost" app=pgjobd fence err="no answer within 2000 ms"' "$T/a.log"
ok $? "the fence session's heartbeat was given up after fence_timeout"

short=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('p', '{\"sleep\": 0.2}') RETURNING id")
wait_until 20 "[ \"\$(job_field $short status)\" = succeeded ]"
ok $? "a job queued after the black hole runs"
touch "$T/gate.long"
wait_until 20 "[ \"\$(job_field $long status)\" = succeeded ]"
ok $? "the long job succeeds"
lease_kept "$T/marks.log" "$T/a.log" 2
stop_daemon "$A"
is "$?" 0 "the daemon exits 0"
done_testing
