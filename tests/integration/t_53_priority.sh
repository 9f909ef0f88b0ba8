#!/usr/bin/env bash
# Priority (pgjobd(8), "Priority"): the daemon runs 5 nice levels above its commands when
# it may (root, CAP_SYS_NICE, or the unit's LimitNICE=-5), and so does its supervisor; every
# command, in both lock modes and whatever user it runs as, runs at the nice value the
# daemon was started with. A daemon that may not raise itself runs where it was started,
# says so, and its commands run there too.
. "$(dirname "$0")/lib.sh"
require_pgjobd
[ "$(id -u)" = 0 ] || skip_all "needs root to start the daemon with and without CAP_SYS_NICE"
command -v setpriv >/dev/null 2>&1 || skip_all "setpriv (util-linux) is not installed"
pg_start

# Each command reports its own nice value and its RLIMIT_NICE (soft hard).
cmd="awk '{print \$19}' /proc/self/stat; awk '/^Max nice/ {print \$4, \$5}' /proc/self/limits"
write_conf "$T/a.ini" <<EOF
$(conf_header)

[queue.tx]
command = $cmd

[queue.ls]
command = $cmd
lock_mode = lease

[queue.other]
command = $cmd
user = nobody
EOF
pgjobd_migrate "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
lim=$(awk '/^Max nice/ {print $4, $5}' /proc/self/limits)
real=$PGJOBD

nice_of() { ps -o ni= -p "$1" | tr -d ' '; }
guard_of() { pgrep -P "$1" -x pgjobd | head -1; }

# run_case LABEL BASE WRAPPER...: start the daemon under WRAPPER (a command prefix), run
# one job in each queue, and check that every command ran at BASE.
run_case() {
	local label=$1 base=$2 q id out
	shift 2
	printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$*" "$real" >"$T/wrap-$label"
	chmod +x "$T/wrap-$label"
	PGJOBD=$T/wrap-$label
	start_daemon "$label" "$T/a.ini"
	PGJOBD=$real
	D=$DAEMON_PID
	wait_until 10 "workers_alive 1" || bail_out "daemon $label did not register"
	for q in tx ls other; do
		id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('$q') RETURNING id")
		wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
		out=$(job_field "$id" "result->>'stdout'")
		is "$out" "$base"$'\n'"$lim" "$label: a command of queue $q runs at nice $base, RLIMIT_NICE $lim"
	done
}

run_case root 0 env
is "$(nice_of "$D")" -5 "root: the daemon runs at nice -5"
G=$(guard_of "$D")
ok "$([ -n "$G" ]; echo $?)" "root: the supervisor found (pid $G)"
is "$(nice_of "$G")" -5 "root: the supervisor runs at nice -5 too"
stop_daemon "$D"
is "$?" 0 "root: the daemon stops cleanly"

run_case niced 3 nice -n 3
is "$(nice_of "$D")" -2 "started at nice 3: the daemon runs at -2, its commands at 3"
stop_daemon "$D"

run_case nocap 0 setpriv --bounding-set -sys_nice
is "$(nice_of "$D")" 0 "without CAP_SYS_NICE: the daemon runs where it was started"
wait_until 5 "grep -q 'running at the commands.* priority.*nice=0' '$T/nocap.log'"
ok $? "without CAP_SYS_NICE: the daemon says it runs at the commands' priority"
stop_daemon "$D"

done_testing
