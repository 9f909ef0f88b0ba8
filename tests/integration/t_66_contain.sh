#!/usr/bin/env bash
# Containment (guarantee 6; pgjobd(8), "Containment"): processes that a command starts and
# that leave its process group (`setsid sleep 300 &`, and the double fork
# `(setsid sleep 300 &)`) die with the command.
#  A. No cgroup (PGJOBD_CGROUP=no): the daemon is a child subreaper. When the job ends,
#     both escaped processes die. While a job runs, the double-forked one dies once its
#     parent has exited (it can no longer be told apart); after kill -9 of the daemon the
#     supervisor kills the one whose parent chain still leads back to the command.
#  B. A cgroup v2 directory the daemon can write (made here for it, as root): each command
#     runs in a cgroup of its own; job cgroups left by an earlier run are killed and
#     removed at startup; escaped processes die when the job ends and when the daemon is
#     killed with kill -9; a second daemon in the same cgroup does not use it.
#     Skipped where no cgroup v2 hierarchy is writable.
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

REAL_PGJOBD=$PGJOBD
CG=

# Runs before lib.sh's cleanup: everything left in the test's cgroup is killed (daemons,
# supervisors, commands) and the directories are removed.
cg_cleanup() {
	[ -n "$CG" ] && [ -d "$CG" ] || return 0
	local d
	echo 1 >"$CG/cgroup.kill" 2>/dev/null
	for _ in $(seq 1 100); do
		grep -q '^populated 0' "$CG/cgroup.events" 2>/dev/null && break
		sleep 0.05
	done
	for d in "$CG"/*/; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
	rmdir "$CG" 2>/dev/null || diag "cannot remove the test's cgroup $CG"
}
trap 'st=$?; cg_cleanup; (exit $st); cleanup' EXIT

# The command: records the shell's pid and cgroup, starts one process with setsid (its
# parent, the shell, lives on) and one through a double fork (its parent exits at once),
# then sleeps for the job's `sleep` (default 0). Pid files end in .pid: lib.sh's cleanup
# kills whatever they name.
cat >"$T/esc.sh" <<EOF
#!/bin/sh
d='$T'
id=\$PGJOBD_JOB_ID
echo \$\$ >"\$d/sh.\$id.pid"
cat /proc/self/cgroup >"\$d/cg.\$id"
setsid sleep 300 &
echo \$! >"\$d/esc1.\$id.pid"
(setsid sleep 300 & echo \$! >"\$d/esc2.\$id.pid")
sleep "\${PGJOBD_ARG_sleep:-0}"
EOF
chmod +x "$T/esc.sh"

write_esc_conf() {
	write_conf "$1" <<EOF
$(conf_header)

[queue.esc]
command = exec /bin/sh '$T/esc.sh'
max_attempts = 1
EOF
}
write_esc_conf "$T/p.ini"
write_esc_conf "$T/c.ini"
pgjobd_migrate "$T/p.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

enqueue() {
	psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('esc', '{\"sleep\": $1}') RETURNING id"
}
started() { [ -s "$T/esc1.$1.pid" ] && [ -s "$T/esc2.$1.pid" ] && [ -s "$T/sh.$1.pid" ]; }
job_cgroups() { find "$CG" -mindepth 1 -maxdepth 1 -type d -name 'job-*' | wc -l; }

# ---------------------------------------------------------------- A. no cgroup
start_daemon p "$T/p.ini" PGJOBD_CGROUP=no
p=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"containing commands\"' '$T/p.log'"
like "$(grep 'msg="containing commands"' "$T/p.log")" 'mode=process' \
	"A: PGJOBD_CGROUP=no: commands are contained as processes, not in cgroups"

j=$(enqueue 0)
wait_until 20 "[ \"\$(job_field $j status)\" = succeeded ]"
ok $? "A: a job that leaves two escaped processes behind succeeds"
started "$j"
ok $? "A: ... it started both"
wait_until 5 "all_dead '$T/esc1.$j.pid' && all_dead '$T/esc2.$j.pid'"
ok $? "A: both escaped processes are dead shortly after the job ended"

j=$(enqueue 300)
wait_until 20 "started $j"
ok $? "A: a long job started its escaped processes"
wait_until 5 "all_dead '$T/esc2.$j.pid'"
ok $? "A: the double-forked one dies while the job runs (its parent exited)"
pid_alive "$(cat "$T/esc1.$j.pid")" && pid_alive "$(cat "$T/sh.$j.pid")"
ok $? "A: the job's shell and the setsid child it still waits for live on"
kill -KILL "$p"
wait "$p" 2>/dev/null
forget_daemon "$p"
wait_until 5 "all_dead '$T/esc1.$j.pid' && all_dead '$T/sh.$j.pid'"
ok $? "A: after kill -9 of the daemon, its supervisor kills the shell and its setsid child"

# ---------------------------------------------------------------- B. a cgroup per job
cg_mnt=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") print $5; break } }' \
	/proc/self/mountinfo | head -n1)
why=
if [ -z "$cg_mnt" ]; then
	why="no cgroup v2 hierarchy is mounted"
elif ! mkdir "$cg_mnt/pgjobd-test.$$.$RANDOM" 2>/dev/null; then
	why="cannot create a cgroup under $cg_mnt (not root, or read-only)"
else
	CG=$(ls -d "$cg_mnt"/pgjobd-test.$$.* | head -n1)
	if ! sh -c "echo \$\$ >'$CG/cgroup.procs'" 2>/dev/null; then
		why="cannot move a process into a cgroup under $cg_mnt"
	elif [ ! -e "$CG/cgroup.kill" ]; then
		why="the kernel has no cgroup.kill (before 5.14); this test uses it to clean up"
	fi
fi
if [ -n "$why" ]; then
	skip "part B (a cgroup per job): $why" 12
	done_testing
	exit 0
fi
note "test cgroup: $CG"

# The daemon starts in $CG: a wrapper moves itself there, then execs pgjobd (same pid).
cat >"$T/in-cg.sh" <<EOF
#!/bin/sh
echo \$\$ >'$CG/cgroup.procs' || exit 111
exec '$REAL_PGJOBD' "\$@"
EOF
chmod +x "$T/in-cg.sh"
start_in_cg() {
	PGJOBD=$T/in-cg.sh
	start_daemon "$@"
	PGJOBD=$REAL_PGJOBD
}

# A job cgroup left by a crashed run, with a process in it.
mkdir "$CG/job-1"
(sleep 300 </dev/null >/dev/null 2>&1 & echo $! >"$T/left.pid")
cat "$T/left.pid" >"$CG/job-1/cgroup.procs"

start_in_cg c "$T/c.ini"
c=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"containing commands\"' '$T/c.log'"
like "$(grep 'msg="containing commands"' "$T/c.log")" "mode=cgroup" \
	"B: in a writable cgroup, commands get cgroups of their own"
wait_until 10 "all_dead '$T/left.pid' && [ ! -d '$CG/job-1' ]"
ok $? "B: a job cgroup left by an earlier run is killed and removed at startup"

j=$(enqueue 0)
wait_until 20 "[ \"\$(job_field $j status)\" = succeeded ]"
ok $? "B: a job that leaves two escaped processes behind succeeds"
like "$(grep "^0::" "$T/cg.$j" 2>/dev/null)" "^0::${CG#"$cg_mnt"}/job-[0-9]+\$" \
	"B: the command ran in a cgroup of its own under the daemon's"
wait_until 5 "all_dead '$T/esc1.$j.pid' && all_dead '$T/esc2.$j.pid'"
ok $? "B: both escaped processes are dead shortly after the job ended"
wait_until 5 "[ \$(job_cgroups) = 0 ]"
ok $? "B: the job's cgroup is removed"

# A second daemon in the same cgroup must not take the cgroup over (it would remove the
# first one's job cgroups at startup).
start_in_cg c2 "$T/c.ini"
c2=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"containing commands\"' '$T/c2.log'"
like "$(grep 'msg="containing commands"' "$T/c2.log")" "mode=process.*another pgjobd" \
	"B: a second daemon in the same cgroup contains its commands as processes"
# Its SIGTERM handler is in place once it logs "starting" (it decides on containment
# before that); a SIGTERM before would end it with 143.
wait_until 20 "grep -q 'msg=\"starting\"' '$T/c2.log'"
stop_daemon "$c2" 30
is $? 0 "B: the second daemon stops cleanly"

j=$(enqueue 300)
wait_until 20 "started $j"
ok $? "B: a long job started its escaped processes"
sleep 1.5 # an absence: the daemon's once-a-second sweep must not apply in cgroup mode
pid_alive "$(cat "$T/esc2.$j.pid")"
ok $? "B: the double-forked process lives while its job runs (its cgroup holds it)"
kill -KILL "$c"
wait "$c" 2>/dev/null
forget_daemon "$c"
wait_until 5 "all_dead '$T/esc1.$j.pid' && all_dead '$T/esc2.$j.pid' && all_dead '$T/sh.$j.pid'"
ok $? "B: after kill -9 of the daemon, its supervisor kills the job's whole cgroup"
wait_until 10 "[ \$(job_cgroups) = 0 ]"
ok $? "B: ... and removes it"

done_testing
