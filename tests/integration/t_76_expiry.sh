#!/usr/bin/env bash
# expires_at (pgjobd(8)): a job that has not started by expires_at never runs;
# it ends `cancelled` with error->>'reason' = 'expired', keeps its attempts, gets
# finished_at, and this happens within about a second of expires_at whether or not a
# claim looks at it (the maintenance pass of any daemon, for every queue). An expired
# head of a group does not let later jobs of the group overtake it: they start after it
# is cancelled, in order.
. "$(dirname "$0")/lib.sh"
require_pgjobd

pg_start
conf=$T/expiry.ini
write_conf "$conf" <<EOF
$(conf_header poll_interval=1s)

[queue.ex]
command = echo "\$PGJOBD_JOB_ID" >> '$T/ran'; sleep "\${PGJOBD_ARG_sleep:-0}"; exit "\${PGJOBD_ARG_exit:-0}"
concurrency = 1
max_attempts = 3
backoff = 1h

[queue.gx]
command = echo "\$PGJOBD_JOB_ID" >> '$T/gran'; sleep "\${PGJOBD_ARG_sleep:-0}"
concurrency = 2
EOF
pgjobd_migrate "$conf" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
: >"$T/ran"
: >"$T/gran"

ins() { psql_q "INSERT INTO pgjobd.jobs (queue, group_id, data, expires_at) VALUES ($1) RETURNING id"; }
ran() { grep -qx "$2" "$T/$1"; }

# Before any daemon: already expired, in a served queue and in a queue nobody serves.
e1=$(ins "'ex', NULL, '{}', now() - interval '1 second'")
e2=$(ins "'nobody', NULL, '{}', now() + interval '1 second'")
start_daemon d "$conf"

# A busy slot (concurrency 1) and a job behind it that expires while it waits.
busy=$(ins "'ex', NULL, '{\"sleep\": 4}', NULL")
wait_until 10 "ran ran $busy"
ok $? "the busy job is running"
e3=$(ins "'ex', NULL, '{}', now() + interval '1 second'")
fine=$(ins "'ex', NULL, '{}', now() + interval '1 hour'")

# A job that fails once (backoff 1h) and expires while waiting for its retry.
retry=$(psql_q "INSERT INTO pgjobd.jobs (queue, data, expires_at, priority) VALUES ('ex', '{\"exit\": 1}', now() + interval '1 hour', -1) RETURNING id")

# A group whose second job expires while the first runs.
g1=$(ins "'gx', 'g', '{\"sleep\": 3}', NULL")
wait_until 10 "ran gran $g1"
ok $? "the group's head is running"
g2=$(ins "'gx', 'g', '{}', now() + interval '1 second'")
g3=$(ins "'gx', 'g', '{}', NULL")

expired_ok() { # ID: cancelled, reason expired
	[ "$(job_field "$1" "status || ' ' || coalesce(error->>'reason', '-')")" = "cancelled expired" ]
}
wait_until 10 "expired_ok $e1"
ok $? "a job that expired before any daemon started ends cancelled/expired"
wait_until 10 "expired_ok $e2"
ok $? "a job of a queue no daemon serves ends cancelled/expired"
wait_until 10 "expired_ok $e3"
ok $? "a job that expired while waiting for a slot ends cancelled/expired"
late=$(job_field "$e3" "extract(epoch FROM finished_at - expires_at)::numeric(10,1)")
ok "$(awk -v d="$late" 'BEGIN { exit !(d >= 0 && d < 3) }'; echo $?)" \
	"... within about a second of expires_at (${late}s), not when a claim looks"
is "$(job_field "$e3" "attempts || ' ' || (started_at IS NULL) || ' ' || (finished_at IS NOT NULL)")" \
	"0 true true" "... attempts 0, never started, finished_at set"
wait_until 10 "expired_ok $g2"
ok $? "the group's expiring job ends cancelled/expired"

wait_until 20 "[ \"\$(job_field $busy status)\" = succeeded ] && [ \"\$(job_field $fine status)\" = succeeded ]"
ok $? "the busy job and the not-yet-expired job behind it succeed"
wait_until 20 "[ \"\$(job_field $g3 status)\" = succeeded ]"
ok $? "the group's third job runs after its expired predecessor"
is "$(tr '\n' ' ' <"$T/gran")" "$g1 $g3 " "the group's jobs started in order; the expired one never ran"
! grep -qx -e "$e1" -e "$e3" "$T/ran"
ok $? "no expired job ever ran"

wait_until 10 "[ \"\$(job_field $retry 'status || attempts')\" = queued1 ]"
ok $? "the failing job waits for its retry (attempts 1)"
psql_q "UPDATE pgjobd.jobs SET expires_at = now() WHERE id = $retry"
wait_until 10 "expired_ok $retry"
ok $? "a job that expires while waiting for a retry ends cancelled/expired"
is "$(job_field "$retry" attempts)" 1 "... and keeps its attempts"

stop_daemon "$DAEMON_PID" 30
is $? 0 "the daemon stops cleanly (exit 0)"
done_testing
