#!/usr/bin/env bash
# Resources per queue and admission by host pressure (pgjobd.ini(5), RESOURCES):
#  A. Values: bad cpu_max, memory_max, limit_nofile and max_pressure values are errors
#     naming file:line (exit 2).
#  B. Refusal: a queue asking for a cgroup limit where commands get no cgroup with that
#     controller is refused at start (exit 2, one error per key naming queue, key, why),
#     by `pgjobd check`, and at SIGHUP (the old configuration stays and keeps running jobs).
#     max_pressure without PSI files is refused the same way.
#  C. rlimits (work everywhere): limit_nofile and limit_core are what the command sees
#     (`ulimit -n`, `ulimit -c`), soft and hard; one the new process cannot set (above
#     the daemon's hard limit, without CAP_SYS_RESOURCE) fails the attempt with reason
#     spawn naming the key, and the command does not run.
#  D. Admission by pressure, driven through PGJOBD_PSI_DIR (fake PSI files): a daemon above
#     its bound claims nothing (NOTIFYs included) while a second daemon without bounds
#     drains the queue; when the file drops, the first resumes within the check interval;
#     entering and leaving are logged once each; the metrics show it.
#  E. Real PSI smoke: busy loops on every CPU raise /proc/pressure/cpu's some avg10 above
#     a bound set just over the machine's current level, then the daemon pauses, and
#     resumes once they are killed. Skipped without /proc/pressure or on a machine already
#     too busy to tell.
#  F. Enforcement where the daemon can have a cgroup v2 with memory, pids and cpu (made
#     here for it, as root): memory_max -> reason oom with memory_peak_kb; tasks_max ->
#     tasks_max_hit; cpu_max 20% -> 20 +- 4 % of a CPU over 10 s. Skipped, saying what is
#     missing, elsewhere (tests/systemd/run.sh covers it in its container when it has them).
. "$(dirname "$0")/lib.sh"
require_pgjobd
pg_start

REAL_PGJOBD=$PGJOBD
CG=
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
BURN=()
burn_stop() {
	local p
	for p in "${BURN[@]}"; do kill "$p" 2>/dev/null; done
	BURN=()
}
trap 'st=$?; burn_stop; cg_cleanup; (exit $st); cleanup' EXIT

write_conf "$T/base.ini" <<EOF
$(conf_header)

[queue.plain]
command = echo plain
EOF
pgjobd_migrate "$T/base.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# ---------------------------------------------------------------- A. values
bad_value() { # bad_value KEY VALUE SECTION(pgjobd|queue) PATTERN
	local f=$T/bad.$RANDOM.ini
	if [ "$3" = pgjobd ]; then
		printf '%s\n%s = %s\n\n[queue.q]\ncommand = true\n' "$(conf_header)" "$1" "$2" >"$f"
	else
		printf '%s\n\n[queue.q]\ncommand = true\n%s = %s\n' "$(conf_header)" "$1" "$2" >"$f"
	fi
	"$PGJOBD" check -c "$f" >"$f.out" 2>&1
	local rc=$?
	[ $rc = 2 ] && grep -q "$(basename "$f"):[0-9]*: error: bad value '$2' for '$1'.*$4" "$f.out"
	ok $? "A: $1 = $2 is refused: ${4:-bad value} (exit $rc)" || diag "$(cat "$f.out")"
}
bad_value cpu_max 0% queue "between 1% and"
bad_value cpu_max 12.5% queue "whole number"
bad_value memory_max 100KiB queue "at least 1MiB"
bad_value tasks_max 0 queue "between 1 and"
bad_value io_weight 20000 queue "between 1 and 10000"
bad_value limit_nofile lots queue "not an integer"
bad_value max_pressure "gpu 40" pgjobd "expected cpu, memory or io"
bad_value max_pressure "cpu 140" pgjobd "at most 100"
bad_value max_pressure "cpu 40 cpu 50" pgjobd "named twice"

# ---------------------------------------------------------------- B. refusal
write_conf "$T/limits.ini" <<EOF
$(conf_header)

[queue.plain]
command = echo plain

[queue.capped]
command = echo capped
memory_max = 64MiB
tasks_max = 16
EOF
# PGJOBD_CGROUP=no: commands get no cgroup of their own, on any host.
env PGJOBD_CGROUP=no "$PGJOBD" -c "$T/limits.ini" >"$T/b_start2.log" 2>&1 </dev/null
is $? 2 "B: a queue with memory_max and tasks_max where commands get no cgroup: the daemon refuses to start (exit 2)"
grep 'cannot enforce a resource limit' "$T/b_start2.log" >"$T/b_errors"
is "$(wc -l <"$T/b_errors")" 2 "B: one error per key that cannot be enforced" || diag "$(cat "$T/b_start2.log")"
like "$(grep 'key=memory_max' "$T/b_errors")" 'queue=capped key=memory_max why="commands get no cgroup of their own here \(PGJOBD_CGROUP=no\)"' \
	"B: the error names the queue, the key and why"
like "$(grep 'key=tasks_max' "$T/b_errors")" 'queue=capped key=tasks_max' "B: ... and tasks_max too"
env PGJOBD_CGROUP=no "$PGJOBD" check -c "$T/limits.ini" >"$T/b_check.log" 2>&1
rc=$?
is "$rc" 2 "B: pgjobd check says the daemon would refuse the file (exit 2)"
like "$(cat "$T/b_check.log")" "key=memory_max.*would refuse" "B: ... naming the key" || diag "$(cat "$T/b_check.log")"

# max_pressure without the PSI files
mkdir -p "$T/nopsi"
write_conf "$T/psi_missing.ini" <<EOF
$(conf_header max_pressure="cpu 40")

[queue.plain]
command = echo plain
EOF
env PGJOBD_PSI_DIR="$T/nopsi" "$PGJOBD" -c "$T/psi_missing.ini" >"$T/b_psi.log" 2>&1 </dev/null
is $? 2 "B: max_pressure without PSI files: the daemon refuses to start (exit 2)"
like "$(cat "$T/b_psi.log")" "key=max_pressure why=\"cannot open $T/nopsi/cpu" "B: ... saying which file is missing"
env PGJOBD_PSI_DIR="$T/nopsi" "$PGJOBD" check -c "$T/psi_missing.ini" >"$T/b_psi_check.log" 2>&1
is $? 2 "B: ... and pgjobd check says so (exit 2)"

# at SIGHUP: the old file stays
cp "$T/base.ini" "$T/reload.ini"
start_daemon r "$T/reload.ini" PGJOBD_CGROUP=no
r=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"ready\"' '$T/r.log'" || bail_out "daemon r did not get ready"
printf 'memory_max = 64MiB\n' >>"$T/reload.ini"
kill -HUP "$r"
wait_until 10 "grep -q 'configuration not reloaded' '$T/r.log'"
ok $? "B: SIGHUP with a queue asking for memory_max: the configuration is not reloaded"
like "$(grep 'cannot enforce' "$T/r.log")" 'queue=plain key=memory_max' "B: ... the log says which queue and key"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('plain') RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "B: the daemon runs on with its former configuration"
stop_daemon "$r" >/dev/null

# ---------------------------------------------------------------- C. rlimits
write_conf "$T/rl.ini" <<EOF
$(conf_header)

[queue.rl]
command = echo "\$(ulimit -Sn) \$(ulimit -Hn) \$(ulimit -c)"
limit_nofile = 77
limit_core = 0

[queue.rl_default]
command = echo "\$(ulimit -Sn)"
EOF
start_daemon c "$T/rl.ini"
c=$DAEMON_PID
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('rl') RETURNING id")
id2=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('rl_default') RETURNING id")
wait_until 20 "[ \"\$(count_jobs \"id IN ($id, $id2) AND status = 'succeeded'\")\" = 2 ]"
ok $? "C: both jobs succeed"
is "$(job_field "$id" "result->>'stdout'")" "77 77 0" "C: limit_nofile = 77 (soft and hard), limit_core = 0, as the command sees them"
isnt "$(job_field "$id2" "result->>'stdout'")" "77" "C: a queue without them keeps the daemon's own"
stop_daemon "$c" >/dev/null
is $? 0 "C: the daemon exits 0"

# A limit the new process cannot set (above the daemon's hard limit, without
# CAP_SYS_RESOURCE): the command does not run; the attempt fails with reason spawn,
# naming the key.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null 2>&1; then
	write_conf "$T/rl_high.ini" <<EOF
$(conf_header)

[queue.rl_high]
command = echo ran
limit_nofile = 100000
max_attempts = 1
EOF
	bash -c 'ulimit -n 4096 && exec setpriv --bounding-set=-sys_resource --inh-caps=-sys_resource -- "$0" -c "$1"' \
		"$PGJOBD" "$T/rl_high.ini" >>"$T/rl_high.log" 2>&1 </dev/null &
	h=$!
	DAEMON_PIDS+=("$h")
	id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('rl_high') RETURNING id")
	wait_until 20 "[ \"\$(job_field $id status)\" = failed ]"
	is "$(job_field "$id" "(error->>'reason') || ': ' || (error->>'message') || ' ' || coalesce(result::text, 'no result')")" \
		"spawn: cannot set limit_nofile: Operation not permitted no result" \
		"C: limit_nofile above a hard limit the daemon cannot raise: reason spawn, naming the key; the command did not run" ||
		diag "$(job_field "$id" "status || ' ' || error::text"; tail -n 8 "$T/rl_high.log")"
	stop_daemon "$h" >/dev/null
else
	skip "C: a limit that cannot be set: needs root and setpriv" 1
fi

# ---------------------------------------------------------------- D. admission by pressure
PSI=$T/psi
mkdir -p "$PSI"
psi_set() { # psi_set FILE AVG10: written in place (the daemon keeps the file open)
	printf 'some avg10=%s avg60=0.00 avg300=0.00 total=1\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n' "$2" >"$PSI/$1"
}
psi_set cpu 80.00
psi_set memory 0.00
psi_set io 0.00
prom=$T/a.prom
for n in a b; do
	extra=
	[ $n = a ] && extra="max_pressure = cpu 40 memory 10"
	write_conf "$T/$n.ini" <<EOF
$(conf_header metrics_file="$T/$n.prom")
$extra

[queue.adm]
command = echo $n
concurrency = 2
EOF
done
start_daemon a "$T/a.ini" PGJOBD_PSI_DIR="$PSI"
a=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"ready\"' '$T/a.log'" || bail_out "daemon a did not get ready"
like "$(grep 'under pressure' "$T/a.log")" 'resource=cpu avg10=80.00 bound=40' \
	"D: a daemon started above max_pressure says so"
wait_until 10 "grep -q '^pgjobd_pressure_paused 1\$' '$prom'"
ok $? "D: metric pgjobd_pressure_paused 1" || diag "$(grep -s pressure "$prom")"
like "$(grep -s 'pgjobd_pressure_some_avg10{resource="cpu"}' "$prom")" ' 80.00$' "D: metric pgjobd_pressure_some_avg10 for cpu"
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'adm' FROM generate_series(1, 6)" >/dev/null
psql_q "NOTIFY pgjobd" >/dev/null
holds_for 3 "[ \"\$(count_jobs \"queue = 'adm' AND status = 'queued'\")\" = 6 ]"
ok $? "D: above its bound, it claims nothing for 3 s (enqueue NOTIFYs and poll included)"
start_daemon b "$T/b.ini"
b=$DAEMON_PID
wait_until 30 "[ \"\$(count_jobs \"queue = 'adm' AND status = 'succeeded'\")\" = 6 ]"
ok $? "D: a daemon without pressure drains the queue meanwhile"
is "$(psql_q "SELECT string_agg(DISTINCT result->>'stdout', ',') FROM pgjobd.jobs WHERE queue = 'adm'")" b \
	"D: every job ran on the daemon without pressure"
stop_daemon "$b" >/dev/null
# memory above its bound too: both must drop
psi_set memory 30.00
sleep 1.5
psi_set cpu 12.00
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'adm' FROM generate_series(1, 2)" >/dev/null
holds_for 2.5 "[ \"\$(count_jobs \"queue = 'adm' AND status = 'queued'\")\" = 2 ]"
ok $? "D: cpu below but memory above its bound: still no claims"
t0=$(now_ms)
psi_set memory 5.00
wait_until 10 "[ \"\$(count_jobs \"queue = 'adm' AND status = 'succeeded'\")\" = 8 ]"
ok $? "D: below every bound, the daemon claims again"
resume_ms=$(($(now_ms) - t0))
note "D: from the file dropping below the bound to both jobs done: $resume_ms ms (checks every 1 s)"
cmp_ok "$resume_ms" -le 3000 "D: ... within 3 s (one check interval, then a claim)"
is "$(psql_q "SELECT string_agg(DISTINCT result->>'stdout', ',') FROM pgjobd.jobs WHERE queue = 'adm' AND id > (SELECT max(id) - 2 FROM pgjobd.jobs)")" a \
	"D: ... on the daemon that had paused"
is "$(grep -c 'under pressure' "$T/a.log")" 1 "D: entering the pause is logged once (not per check)"
is "$(grep -c 'claims resume' "$T/a.log")" 1 "D: leaving it is logged once"
wait_until 10 "grep -q '^pgjobd_pressure_paused 0\$' '$prom'"
ok $? "D: metric pgjobd_pressure_paused back to 0"
like "$(grep -s '^pgjobd_pressure_pauses_total' "$prom")" ' 1$' "D: metric pgjobd_pressure_pauses_total 1"
# a reload that removes the bound while paused resumes at once
psi_set cpu 90.00
wait_until 5 "[ \"\$(grep -c 'under pressure' '$T/a.log')\" = 2 ]"
ok $? "D: pressure again: paused again"
sed -i '/^max_pressure/d' "$T/a.ini"
kill -HUP "$a"
wait_until 10 "[ \"\$(grep -c 'claims resume' '$T/a.log')\" = 2 ]"
ok $? "D: a reload without max_pressure ends the pause"
stop_daemon "$a" >/dev/null
is $? 0 "D: the daemon exits 0 (its pressure files closed, nothing leaked)"

# ---------------------------------------------------------------- E. real PSI smoke
cpu_avg10() { awk '/^some/ { sub("avg10=", "", $2); print int($2) }' /proc/pressure/cpu; }
why=
if [ ! -r /proc/pressure/cpu ]; then
	why="no /proc/pressure/cpu (a kernel without PSI)"
else
	base=$(cpu_avg10)
	if [ "$base" -gt 40 ]; then
		why="the machine is already busy (cpu some avg10 = $base%): a bound above it cannot be crossed reliably"
	fi
fi
if [ -n "$why" ]; then
	skip "E: real PSI: $why" 4
else
	bound=$((base + 15))
	write_conf "$T/e.ini" <<EOF
$(conf_header max_pressure="cpu $bound")

[queue.e]
command = echo e
EOF
	start_daemon e "$T/e.ini"
	e=$DAEMON_PID
	wait_until 20 "grep -q 'msg=\"ready\"' '$T/e.log'" || bail_out "daemon e did not get ready"
	ncpu=$(nproc)
	for _ in $(seq 1 $((ncpu * 3))); do
		nice -n 19 sh -c 'while :; do :; done' &
		BURN+=($!)
	done
	t0=$(now_ms)
	wait_until 40 "grep -q 'under pressure' '$T/e.log'"
	ok $? "E: $((ncpu * 3)) busy loops on $ncpu CPUs raise cpu some avg10 over $bound%: the daemon pauses" ||
		diag "cpu: $(head -1 /proc/pressure/cpu)"
	note "E: paused $(($(now_ms) - t0)) ms after the busy loops started ($(grep 'under pressure' "$T/e.log" | sed 's/.*resource=/resource=/'))"
	id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('e') RETURNING id")
	holds_for 2 "[ \"\$(job_field $id status)\" = queued ]"
	ok $? "E: ... and claims nothing meanwhile"
	burn_stop
	t0=$(now_ms)
	wait_until 90 "[ \"\$(job_field $id status)\" = succeeded ]"
	ok $? "E: once the loops are killed, the pressure decays below the bound and the job runs"
	note "E: resumed $(($(now_ms) - t0)) ms after the loops were killed (avg10 decays over ~10 s)"
	is "$(grep -c 'claims resume' "$T/e.log")" 1 "E: the resume is logged once"
	stop_daemon "$e" >/dev/null
fi

# ---------------------------------------------------------------- F. enforcement
cg_mnt=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i + 1) == "cgroup2") print $5; break } }' \
	/proc/self/mountinfo | head -n1)
why=
if [ -z "$cg_mnt" ]; then
	why="no cgroup v2 hierarchy is mounted"
elif ! mkdir "$cg_mnt/pgjobd-res.$$" 2>/dev/null; then
	why="cannot create a cgroup under $cg_mnt (not root, or read-only)"
else
	CG=$cg_mnt/pgjobd-res.$$
	if ! sh -c "echo \$\$ >'$CG/cgroup.procs'" 2>/dev/null; then
		why="cannot move a process into a cgroup under $cg_mnt"
	fi
fi
if [ -n "$why" ]; then
	skip "F: $why" 11
	done_testing
	exit 0
fi
# The daemon starts in $CG: a wrapper moves itself there, then execs pgjobd (same pid).
cat >"$T/in-cg.sh" <<EOF
#!/bin/sh
echo \$\$ >'$CG/cgroup.procs' || exit 111
exec '$REAL_PGJOBD' "\$@"
EOF
chmod +x "$T/in-cg.sh"
have=$(cat "$CG/cgroup.controllers")
missing=
for c in memory pids cpu; do
	case " $have " in *" $c "*) ;; *) missing="${missing:+$missing, }$c" ;; esac
done
if [ -n "$missing" ]; then
	# A cgroup v2 the daemon can have, without the controllers (a hybrid host, as
	# where this was written): the refusal names the missing controller.
	"$T/in-cg.sh" -c "$T/limits.ini" >"$T/f_refused.log" 2>&1 </dev/null
	is $? 2 "F: in a cgroup v2 without the memory controller, a queue with memory_max is refused (exit 2)"
	like "$(grep 'key=memory_max' "$T/f_refused.log")" "the memory controller is not available in the daemon's cgroup $CG" \
		"F: ... saying that the controller is missing" || diag "$(cat "$T/f_refused.log")"
	skip "F: enforcement: the cgroup v2 hierarchy at $cg_mnt offers no $missing controller to its cgroups (cgroup.controllers: '$have'; on a hybrid host they are bound to cgroup v1)" 9
	done_testing
	exit 0
fi
note "test cgroup: $CG (controllers: $have)"
write_conf "$T/f.ini" <<EOF
$(conf_header)

[queue.mem]
command = dd if=/dev/zero of=/dev/null bs=256M count=1
memory_max = 32MiB
max_attempts = 1

[queue.tasks]
command = for i in \$(seq 1 40); do sleep 3 & done; wait
tasks_max = 8
max_attempts = 1

[queue.cpu]
command = timeout 10 sh -c 'while :; do :; done'; exit 0
cpu_max = 20%
timeout = 60s
max_attempts = 1
EOF
PGJOBD=$T/in-cg.sh
start_daemon f "$T/f.ini"
PGJOBD=$REAL_PGJOBD
f=$DAEMON_PID
wait_until 20 "grep -q 'msg=\"ready\"' '$T/f.log'" || bail_out "daemon f did not get ready: $(tail -3 "$T/f.log")"
like "$(grep 'controllers enabled' "$T/f.log")" 'controllers="\+cpu \+memory \+pids"' \
	"F: the daemon enabled cpu, memory and pids for the commands' cgroups"
[ -d "$CG/daemon" ] && grep -q "^$f\$" "$CG/daemon/cgroup.procs"
ok $? "F: ... after moving itself into the leaf $CG/daemon"
m=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('mem') RETURNING id")
t=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('tasks') RETURNING id")
c=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('cpu') RETURNING id")
wait_until 60 "[ \"\$(count_jobs \"id IN ($m, $t, $c) AND status IN ('succeeded', 'failed')\")\" = 3 ]"
ok $? "F: the three jobs end"
is "$(job_field "$m" "status || ' ' || (error->>'reason')")" "failed oom" "F: memory_max = 32MiB, 256 MiB asked: reason oom"
note "F: the OOM-killed job's error: $(job_field "$m" "error::text")"
note "F: the fork bomb's error: $(job_field "$t" "error::text")"
peak=$(job_field "$m" "error->>'memory_peak_kb'")
note "F: memory_peak_kb of the OOM-killed command: $peak"
cmp_ok "${peak:-0}" -ge 16384 "F: ... with its peak memory (at least 16 MiB)"
is "$(job_field "$t" "error->>'tasks_max_hit'")" true "F: tasks_max = 8, 40 processes asked: tasks_max_hit"
pid_alive "$f"
ok $? "F: the daemon is alive after the process ceiling was hit"
cpu_ms=$(job_field "$c" "(history->-1->>'cpu_ms')::int")
note "F: cpu_max = 20%, 10 s of a busy loop: ${cpu_ms} ms of CPU ($((cpu_ms / 100))% of one CPU)"
cmp_ok "${cpu_ms:-0}" -ge 1600 "F: cpu_max 20%: at least 16% of a CPU over 10 s"
cmp_ok "${cpu_ms:-99999}" -le 2400 "F: cpu_max 20%: at most 24% of a CPU over 10 s"
stop_daemon "$f" >/dev/null
done_testing
