#!/usr/bin/env bash
# A batch whose answer came while the daemon was stopped is not given up. The lease and
# fence sessions count a batch unanswered for their reply timeout as a lost connection
# (src/db.c, db_set_reply_timeout; t_67_lease_blackhole). When the daemon itself was
# stopped (SIGSTOP) past that timeout, its loop, continued, meets the expired timer before
# the socket's event: the answer is there, unread, and must be read, not thrown away with
# the session. Here the relay holds the answers back (stopped) while the daemon sends its
# heartbeats, then the daemon is stopped and the relay let go, so the answers wait in the
# daemon's sockets; 11.5 s later (the timeouts are 10 s) the daemon continues.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start_relayed

write_conf "$T/a.ini" <<EOF2
$(conf_header fence_timeout=10s shutdown_grace=1s "database=host=127.0.0.1 port=$RELAY_PORT dbname=$PGDATABASE user=postgres")

[queue.p]
command = sleep 60
concurrency = 1
lock_mode = lease
lease = 30s
EOF2
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon a "$T/a.ini"
A=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon a did not register"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('p') RETURNING id")
wait_until 10 "[ \"\$(job_field $id status)\" = running ]" || bail_out "the job did not start"

# A heartbeat goes out every 2 s (a fifth of fence_timeout): one is held by the relay.
kill -STOP "$RELAY"
sleep 2.5
kill -STOP "$A"
kill -CONT "$RELAY"
sleep 11.5
kill -CONT "$A"
sleep 2
n=$(grep -c "no answer within" "$T/a.log")
is "$n" 0 "no batch was given up whose answer had come"
[ "$n" = 0 ] || diag "$(grep "no answer within" "$T/a.log")"
is "$(job_field "$id" "status || ' ' || attempts")" "running 1" "the lease job runs on, attempt 1"
stop_daemon "$A"
is "$?" 0 "the daemon exits 0"
done_testing
