#!/usr/bin/env bash
# Wake-ups (pgjobd(8): an INSERT wakes idle daemons through NOTIFY; nobody polls
# faster than poll_interval). With poll_interval = 1h every start below comes
# from a NOTIFY or from a slot that finished. Producers notify only queues
# with a waiting claimer (pgjobd.waiting), so this also checks that a daemon
# registers when it goes idle (after being busy) and leaves when it is busy, and that a
# job inserted while it registers is not left to the poll.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
write_conf "$T/w.ini" <<EOF
$(conf_header poll_interval=1h)

[queue.w]
command = if [ -n "\$PGJOBD_ARG_wait" ]; then while [ ! -e "$T/\$PGJOBD_ARG_wait" ]; do sleep 0.05; done; fi; echo ok
concurrency = 1
EOF
pgjobd_migrate "$T/w.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$T/w.ini"
waiting() { psql_q "SELECT count(*) FROM pgjobd.waiting WHERE queue = 'w'"; }
wait_until 10 '[ "$(waiting)" = 1 ]'
ok $? "the idle daemon is registered as waiting"

a=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('w', '{\"wait\": \"go-a\"}') RETURNING id")
wait_until 5 "[ \"\$(job_field $a status)\" = running ]"
ok $? "a job inserted into an idle daemon starts at once (NOTIFY)"
is "$(waiting)" 0 "with its only slot busy the daemon is not waiting"
# The pickup's steps at log level debug (tests/bench/README, "Pickup, step by step").
like "$(grep "msg=\"pickup\".* job=$a " "$T/d.log")" \
	'notify_ms=[0-9]+\.[0-9]{3} claim_ms=[0-9]+\.[0-9]{3} hold_ms=[0-9]+\.[0-9]{3} spawn_ms=[0-9]+\.[0-9]{3}' \
	"its pickup is logged step by step, from the NOTIFY on"
b=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('w') RETURNING id")
sleep 0.5
is "$(job_field "$b" status)" queued "a job inserted while the slot is busy waits"
touch "$T/go-a"
wait_until 5 "[ \"\$(job_field $b status)\" = succeeded ]"
ok $? "and starts when the slot finishes, without a poll"
like "$(grep "msg=\"pickup\".* job=$b " "$T/d.log")" 'notify_ms=none claim_ms=[0-9.]+ ' \
	"a job started for a slot that became free: no NOTIFY in its pickup"
wait_until 5 '[ "$(waiting)" = 1 ]'
ok $? "idle again: registered as waiting"
c=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('w') RETURNING id")
wait_until 5 "[ \"\$(job_field $c status)\" = succeeded ]"
ok $? "after being busy, an idle daemon is woken by the next INSERT"

n=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('nobody') RETURNING id")
is "$(job_field "$n" status)" queued "a job of a queue nobody serves waits"

# A producer's INSERT while the claim that registers the daemon as waiting is in flight:
# the trigger sees no registration (no NOTIFY), the claim does not see the job. The test
# holds the claim at its registration with a lock on pgjobd.waiting (the claimer session
# has no lock_timeout), inserts, then lets it go: the daemon claims once more right after
# registering and finds the job, without the hour's poll.
d=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('w', '{\"wait\": \"go-d\"}') RETURNING id")
wait_until 5 "[ \"\$(job_field $d status)\" = running ]"
ok $? "a job holds the only slot (the daemon is not waiting)"
is "$(waiting)" 0 "not registered while busy"
psql -X -qAt -c "BEGIN; LOCK pgjobd.waiting IN SHARE MODE; SELECT pg_sleep(2); COMMIT" >/dev/null 2>&1 &
locker=$!
wait_until 5 "[ \"\$(psql_q \"SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 'waiting' AND l.mode = 'ShareLock' AND l.granted\")\" = 1 ]"
ok $? "the test holds pgjobd.waiting"
touch "$T/go-d"
wait_until 5 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobd claimer %' AND wait_event_type = 'Lock'\")\" = 1 ]"
ok $? "the claim after the job waits to register"
e=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('w') RETURNING id")
wait "$locker"
wait_until 10 "[ \"\$(job_field $e status)\" = succeeded ]"
ok $? "the job inserted meanwhile runs (the claim after the registration found it)"

stop_daemon "$DAEMON_PID"
is $? 0 "the daemon exits 0"
done_testing
