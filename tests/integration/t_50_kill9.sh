#!/usr/bin/env bash
# kill -9 of a daemon (guarantees 1, 3, 4, 6): its running command and the command's
# grandchild die at once; the other daemon runs the job again (attempt 2) only after
# that, and the job succeeds. Repeated ROUNDS times, the killed daemon being replaced.
. "$(dirname "$0")/lib.sh"
require_pgjobd

ROUNDS=${ROUNDS:-3}
pg_start
make_sleeper_script "$T/sleeper.sh"

# The job script: attempt 1 starts a grandchild and waits forever (make_sleeper_script);
# later attempts check that every process of attempt 1 is gone, then succeed. Markers go to k.log; flock on
# lock.GROUP detects two commands of the group at once.
cat >"$T/k.sh" <<EOF
#!/bin/bash
dir='$T'
id=\$PGJOBD_JOB_ID att=\$PGJOBD_ATTEMPT g=\$PGJOBD_GROUP_ID
alive() { local l s; IFS= read -r l </proc/\$1/stat 2>/dev/null || return 1; s=\${l##*) }; s=\${s%% *}; [ "\$s" != Z ]; }
exec 9>>"\$dir/lock.\$g"
if ! flock -n 9; then echo "overlap \$g \$id \$att" >>"\$dir/k.log"; exit 1; fi
echo "start \$g \$id \$att \$\$" >>"\$dir/k.log"
[ "\$att" = 1 ] && exec /bin/sh "\$dir/sleeper.sh" # the group's lock (fd 9) stays held
for p in \$(cat "\$dir/sh.\$id.pid" "\$dir/gc.\$id.pid"); do
	alive "\$p" && echo "overlap \$g \$id \$att attempt-1-pid-\$p-alive" >>"\$dir/k.log"
done
sleep 0.2
echo "end \$g \$id \$att \$\$" >>"\$dir/k.log"
EOF

start_daemons a b <<EOF
[queue.k]
command = echo \$PPID > '$T/ppid.'\$PGJOBD_JOB_ID; exec /bin/bash '$T/k.sh'
concurrency = 2
max_attempts = 5
backoff = 100ms
backoff_max = 100ms
EOF
declare -A daemon=([a]=${DAEMONS[a]} [b]=${DAEMONS[b]})
declare -A conf=([a]=$T/a.ini [b]=$T/b.ini)

for round in $(seq 1 "$ROUNDS"); do
	note "round $round"
	id=$(psql_q "INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('k', 'x$round') RETURNING id")
	wait_until 20 "[ -s '$T/gc.$id.pid' ] && [ -s '$T/ppid.$id' ]"
	ok $? "round $round: job $id runs"
	owner_pid=$(cat "$T/ppid.$id")
	victim=
	for n in a b; do [ "${daemon[$n]}" = "$owner_pid" ] && victim=$n; done
	other=b
	[ "$victim" = b ] && other=a
	ok "$([ -n "$victim" ]; echo $?)" "round $round: the command's parent is daemon ${victim:-?} (pid $owner_pid)"
	[ -n "$victim" ] || break
	is "$(job_field "$id" "status || ' ' || attempts")" "running 1" "round $round: running, attempt 1"

	sh_pid=$(cat "$T/sh.$id.pid")
	gc_pid=$(cat "$T/gc.$id.pid")
	kill -KILL "${daemon[$victim]}"
	wait "${daemon[$victim]}" 2>/dev/null
	forget_daemon "${daemon[$victim]}"
	wait_until 5 "! pid_alive $sh_pid && ! pid_alive $gc_pid"
	ok $? "round $round: the command and its grandchild die with daemon $victim"
	wait_until 10 "! pgrep -f -- '${conf[$victim]}' >/dev/null"
	ok $? "round $round: no process of daemon $victim is left (its helper exits too)"

	wait_until 30 "[ \"\$(job_field $id status)\" = succeeded ]"
	ok $? "round $round: daemon $other runs the job again and it succeeds"
	is "$(job_field "$id" attempts)" 2 "round $round: attempts = 2"
	like "$(job_field "$id" worker)" "^[^:]+:${daemon[$other]}:[^:]+\$" "round $round: worker is daemon $other"
	problems=$(check_markers --lenient "$T/k.log")
	ok $? "round $round: never two commands of the group at once" || diag "$problems"
	is "$(awk -v id="$id" '$3 == id { printf "%s%s ", $1, $4 }' "$T/k.log")" "start1 start2 end2 " \
		"round $round: markers: attempt 1 started, attempt 2 started and ended"

	# Replace the killed daemon for the next round.
	start_daemon "$victim" "${conf[$victim]}"
	daemon[$victim]=$DAEMON_PID
done

pid_alive "${daemon[a]}" && pid_alive "${daemon[b]}"
ok $? "both daemons are running at the end"
done_testing
