#!/usr/bin/env bash
# pg_terminate_backend of the daemon's sessions (guarantee 5): the daemon keeps running,
# reconnects, terminates the command whose lock it lost (reason lost_lock), and the job is
# retried and succeeds; never two commands of the group at once; later jobs still run.
. "$(dirname "$0")/lib.sh"
require_pgjobd

shared_cluster # the sessions it counts and ends are its own database's
pg_start
make_sleeper_script "$T/sleeper.sh"
cat >"$T/t.sh" <<EOF
#!/bin/bash
dir='$T'
id=\$PGJOBD_JOB_ID att=\$PGJOBD_ATTEMPT g=\$PGJOBD_GROUP_ID
exec 9>>"\$dir/lock.\$g"
if ! flock -n 9; then echo "overlap \$g \$id \$att" >>"\$dir/t.log"; exit 1; fi
echo "start \$g \$id \$att \$\$" >>"\$dir/t.log"
[ "\$att" = 1 ] && exec /bin/sh "\$dir/sleeper.sh" # the group's lock (fd 9) stays held
echo "end \$g \$id \$att \$\$" >>"\$dir/t.log"
echo '{"attempt": '\$att'}'
EOF

write_conf "$T/d.ini" <<EOF
$(conf_header)

[queue.t]
command = /bin/bash '$T/t.sh'
concurrency = 2
max_attempts = 5
kill_grace = 1s
backoff = 100ms
backoff_max = 100ms

[queue.after]
command = echo after
EOF
pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
start_daemon d "$T/d.ini"
d=$DAEMON_PID

id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('t', 'grp') RETURNING id")
wait_until 20 "[ -s '$T/gc.$id.pid' ]"
ok $? "the job runs"
sh_pid=$(cat "$T/sh.$id.pid")
gc_pid=$(cat "$T/gc.$id.pid")
sessions=$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
	AND application_name LIKE 'pgjobd%'")
cmp_ok "$sessions" -ge 1 "the daemon's sessions carry application_name pgjobd* ($sessions)"

killed=$(psql_q "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE datname = current_database() AND application_name LIKE 'pgjobd%' AND pid <> pg_backend_pid()) s")
cmp_ok "$killed" -ge 1 "terminated $killed session(s)"

wait_until 20 "! pid_alive $sh_pid && ! pid_alive $gc_pid"
ok $? "the command whose lock was lost is terminated, grandchild included"
wait_until 30 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "the job is retried and succeeds"
is "$(job_field "$id" "attempts || ' ' || (result->>'attempt')")" "2 2" "attempts = 2, the result is attempt 2's"
if grep -q lost_lock "$T/d.log" || [ "$(job_field "$id" "error->>'reason'")" = lost_lock ]; then
	pass "the lost attempt is reported as lost_lock"
else
	fail "the lost attempt is reported as lost_lock (daemon log or error->>'reason')"
fi
problems=$(check_markers --lenient "$T/t.log")
ok $? "never two commands of the group at once" || diag "$problems"

pid_alive "$d"
ok $? "the daemon is still running"
wait_until 20 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgjobd%'\")\" -ge 1 ]"
ok $? "the daemon reconnected"
after=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('after') RETURNING id")
wait_until 20 "[ \"\$(job_field $after status)\" = succeeded ]"
ok $? "a job enqueued afterwards runs"

# Once more, while idle: only the listening session is cut, no job is affected.
psql_q "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE datname = current_database() AND application_name LIKE 'pgjobd%'" >/dev/null
after2=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('after') RETURNING id")
wait_until 20 "[ \"\$(job_field $after2 status)\" = succeeded ]"
ok $? "after its idle sessions are terminated, the daemon still runs new jobs"
is "$(job_field "$after2" attempts)" 1 "in one attempt"
pid_alive "$d"
ok $? "the daemon is still running"
stop_daemon "$d"
is $? 0 "SIGTERM: exit status 0"
done_testing
