#!/usr/bin/env bash
# `pgjobd status` under the queue table (pgjobd(8), "status" and "Lock modes"): the oldest
# open claim, whose transaction holds back VACUUM in the whole database, with its age, queue,
# backend pid and xid age; a warning on stderr once it is older than --claim-warn (the exit
# status stays 0); "none" once the job has ended; the number of live daemons (pgjobd.workers),
# 1 while the daemon runs and 0 once it has stopped. A role that may not see other roles'
# transactions (no pg_read_all_stats) is told the age is unknown instead of a wrong one, and
# one that may not read pgjobd.workers that the count is unknown. --json keeps its array;
# --json-object carries the new fields.
. "$(dirname "$0")/lib.sh"
require_pgjobd

shared_cluster # its sessions are its own database's; its role is test_role's
pg_start
conf=$T/status.ini
# The job runs until the test creates $T/go (a bound of 60 s keeps a failed test from
# leaving it behind): its claim stays open exactly as long as the test needs.
write_conf "$conf" <<EOF
$(conf_header shutdown_grace=1s)

[queue.long]
command = i=0; while [ ! -e '$T/go' ] && [ \$i -lt 1200 ]; do sleep 0.05; i=\$((i+1)); done
EOF
pgjobd_migrate "$conf" >/dev/null || bail_out "migrate failed"

# cli ARGS...: run pgjobd ARGS; sets $rc, $out (stdout) and $err (stderr).
cli() {
	"$PGJOBD" "$@" >"$T/out.txt" 2>"$T/err.txt"
	rc=$?
	out=$(cat "$T/out.txt")
	err=$(cat "$T/err.txt")
}

# status_line PREFIX [ARGS...]: the line of `pgjobd status ARGS` that starts with PREFIX.
status_line() {
	local prefix=$1
	shift
	"$PGJOBD" status -c "$conf" "$@" 2>/dev/null | grep "^$prefix"
}

# The seconds of an age printed as "3s", "1m 2s", ...: 0 when there is no such line.
claim_secs() {
	local line s=0 n u
	line=$(status_line 'oldest open claim: ') || {
		echo 0
		return
	}
	line=${line#oldest open claim: }
	for w in ${line%% (*}; do
		n=${w%[dhms]}
		u=${w#"$n"}
		case $u in
		d) s=$((s + n * 86400)) ;; h) s=$((s + n * 3600)) ;; m) s=$((s + n * 60)) ;; s) s=$((s + n)) ;;
		*) echo 0; return ;;
		esac
	done
	echo $s
}

# ---------------------------------------------------------------- before any daemon

cli status -c "$conf"
is "$rc:$out" "0:QUEUE  QUEUED  RUNNING  SUCCEEDED  FAILED  CANCELLED  OLDEST_QUEUED  PAUSED  FAILED_LAST_HOUR  DAEMONS

oldest open claim: none
live daemons: 0" "no daemon: the header, no open claim, no live daemon"
is "$err" "" "... and nothing on stderr"

# ---------------------------------------------------------------- a long job in a claim

start_daemon d "$conf"
d=$DAEMON_PID
wait_until 20 '[ "$(status_line "live daemons: ")" = "live daemons: 1" ]'
ok $? "live daemons: 1 while the daemon runs"

cli enqueue long -c "$conf"
id=$out
wait_until 20 "[ \"\$(job_field $id status)\" = running ]"
ok $? "the long job is running"
slot_pid=$(psql_q "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgjobd slot %'
                   AND xact_start IS NOT NULL")
like "$slot_pid" '^[0-9]+$' "its slot session (pid $slot_pid) has an open transaction"

wait_until 20 '[ "$(claim_secs)" -ge 2 ]'
ok $? "status: the oldest open claim is at least 2 s old"
cli status -c "$conf"
note "pgjobd status while the job runs:" "$out"
mapfile -t lines <<<"$out"
is "${#lines[@]}" 5 "status: header, one queue, blank line, claim, daemons"
like "${lines[1]}" '^long +0 +1 +0 +0 +0 +no +0 +1$' "status: the queue's line as before, served by one daemon"
is "${lines[2]}" "" "status: a blank line under the table"
like "${lines[3]}" "^oldest open claim: [0-9]+s \\(queue long, pid $slot_pid, xid age [0-9]+\\); it holds back VACUUM in the whole database\$" \
	"status: the claim's age, queue, backend pid and xid age, and what it costs"
is "${lines[4]}" "live daemons: 1" "status: one live daemon"
is "$rc:$err" "0:" "status: no warning below the default threshold (10m)"

cli status --claim-warn 1s -c "$conf"
is "$rc" 0 "status --claim-warn 1s: exit status 0"
like "$out" $'\noldest open claim: [0-9]+s \\(queue long' "... the same lines on stdout"
like "$err" "^pgjobd: status: warning: a claim of queue long \\(pid $slot_pid\\) has been open for [0-9]+s, more than 1s: its transaction holds back VACUUM in the whole database
pgjobd: status: hint: run jobs this long in lease mode \\(lock_mode = lease\\), which holds no transaction open; see \"Lock modes\" in pgjobd\\(8\\)\$" \
	"... and the warning with the hint on stderr"
cli status --claim-warn 0 -c "$conf"
is "$rc:$err" "0:" "status --claim-warn 0: no warning"
cli status --claim-warn 10m -c "$conf"
is "$rc:$err" "0:" "status --claim-warn 10m: no warning"

cli status --json --claim-warn 1s -c "$conf"
is "$rc" 0 "status --json --claim-warn 1s: exit status 0"
is "$(psql_q "SELECT jsonb_typeof($(sql_lit "$out")::jsonb) || ' ' ||
                     ($(sql_lit "$out")::jsonb -> 0 ->> 'queue')")" "array long" \
	"status --json: still the array of queues"
like "$err" '^pgjobd: status: warning: a claim of queue long' "... and the warning on stderr"

cli status --json-object -c "$conf"
is "$rc:$err" "0:" "status --json-object: exit status 0"
is "$(psql_q "WITH j(v) AS (SELECT $(sql_lit "$out")::jsonb)
              SELECT concat_ws(' ', jsonb_typeof(v->'queues'), v->'queues'->0->>'queue',
                     (v->'oldest_claim'->>'age')::numeric >= 2, v->'oldest_claim'->>'queue',
                     v->'oldest_claim'->>'pid', jsonb_typeof(v->'oldest_claim'->'xid_age'),
                     v->>'hidden_sessions', v->>'live_daemons') FROM j")" \
	"array long t long $slot_pid number 0 1" \
	"status --json-object: queues (the --json array), oldest_claim, hidden_sessions, live_daemons"

# ---------------------------------------------------------------- a role that may not see it

# queue_stats runs with its reader's rights: the watcher also reads the columns it reads.
watcher=$(test_role watcher)
psql_q "CREATE ROLE $watcher LOGIN; GRANT USAGE ON SCHEMA pgjobd TO $watcher;
        GRANT SELECT ON pgjobd.queue_stats TO $watcher;
        GRANT SELECT (queue, status, run_at, finished_at) ON pgjobd.jobs TO $watcher;
        GRANT SELECT (queue) ON pgjobd.paused_queues TO $watcher"
sed "s/user=postgres/user=$watcher/" "$conf" >"$T/watcher.ini"
cli status --claim-warn 1s -c "$T/watcher.ini"
is "$rc:$err" "0:" "a role without pg_read_all_stats: exit 0, no warning it cannot back"
like "$out" $'\noldest open claim: unknown \\(needs pg_read_all_stats\\); the oldest xid is held by queue long, pid '"$slot_pid"$', xid age [0-9]+; it holds back VACUUM in the whole database\nlive daemons: unknown \\(needs SELECT on pgjobd.workers\\)$' \
	"... the claim's age is unknown, its xid age is not; the live daemons are unknown"
cli status --json-object -c "$T/watcher.ini"
is "$(psql_q "WITH j(v) AS (SELECT $(sql_lit "$out")::jsonb)
              SELECT concat_ws(' ', jsonb_typeof(v->'oldest_claim'->'age'), v->'oldest_claim'->>'pid',
                     v->>'hidden_sessions', jsonb_typeof(v->'live_daemons')) FROM j")" \
	"null $slot_pid 1 null" "... --json-object: age null, hidden_sessions 1, live_daemons null"
psql_q "GRANT pg_read_all_stats TO $watcher"
wait_until 10 '"$PGJOBD" status -c "$T/watcher.ini" 2>/dev/null | grep -q "^oldest open claim: [0-9]"'
ok $? "with pg_read_all_stats the role sees the claim's age"

# ---------------------------------------------------------------- after the job

touch "$T/go"
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "the long job succeeded"
wait_until 20 '[ "$(status_line "oldest open claim: ")" = "oldest open claim: none" ]'
ok $? "status: no open claim once the job has ended"
cli status --claim-warn 1s -c "$conf"
is "$rc:$err" "0:" "... and no warning"
like "$out" $'\noldest open claim: none\nlive daemons: 1$' "... the daemon is still alive"

stop_daemon "$d" 30
is $? 0 "the daemon stops (SIGTERM)"
cli status -c "$conf"
like "$out" $'\nlive daemons: 0$' "live daemons: 0 once it has stopped" || diag "$out"
cli status --json-object -c "$conf"
is "$(psql_q "WITH j(v) AS (SELECT $(sql_lit "$out")::jsonb)
              SELECT concat_ws(' ', jsonb_typeof(v->'oldest_claim'), v->>'live_daemons') FROM j")" \
	"null 0" "status --json-object: oldest_claim null, live_daemons 0"

# ---------------------------------------------------------------- usage

cli status --claim-warn soon -c "$conf"
is "$rc:$out" "2:" "a bad --claim-warn: exit 2, nothing on stdout"
like "$err" "^pgjobd: status: bad --claim-warn 'soon'" "... the message names the option"
cli status --json --json-object -c "$conf"
is "$rc:$out:$err" "2::pgjobd: status: give --json or --json-object, not both; try 'pgjobd status --help'" \
	"--json and --json-object together: exit 2"
cli enqueue long --claim-warn 1s -c "$conf"
like "$rc:$err" "^2:pgjobd: enqueue: --claim-warn is an option of status" "--claim-warn belongs to status"

done_testing
