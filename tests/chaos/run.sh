#!/usr/bin/env bash
# tests/chaos/run.sh - the chaos run: three daemons, random faults, then the guarantees checked.
#
# One throwaway PostgreSQL (tests/integration/lib.sh), reachable on its Unix socket (for this
# script's psql) and on 127.0.0.1:PORT. Each of three daemons (a, b, c) connects through its own
# TCP relay (chaos-proxy, built from proxy.c), so a network partition of one daemon is a SIGSTOP
# of its relay. The daemons serve two queues: `cg`, whose jobs have a group_id among 15 groups,
# and `cu`, whose jobs have none. A producer enqueues jobs for the whole run, in transactions of
# 1-5 jobs on two sessions; now and then it commits a transaction opened later before one opened
# earlier, so commit order and id order differ (the order guarantee is about commit order).
#
# Each job runs job.sh (written below): it takes flock -n on its group's lock file (ungrouped:
# its own), logs CLASH if the lock is held, else START, sleeps, logs END and exits 0, or 1 while
# its attempt is at most data->fail (retries). Every line carries the queue, job, group, attempt,
# PGJOBD_FENCE ("-" when unset), a wall-clock time in microseconds and the shell's pid; START
# and CLASH also the daemon's pid (the shell's parent: the command execs bash). Every
# process of a job carries CHAOS_MARK=<this run> in its environment (the queue's `env`), so any
# that is left behind is found.
#
# Faults, one every CHAOS_FAULT_GAP seconds on average, chosen at random (weights in FAULT_WEIGHT):
#   kill9          kill -9 of a daemon, restarted 0-2 s later
#   kill9-group    kill -9 of the daemon's process group (each daemon runs under setsid), restarted
#   stop           SIGSTOP of a daemon for 1-12 s, then SIGCONT
#   terminate      pg_terminate_backend of one random pgjobd session (every other time, one
#                  inside a transaction: a slot holding a running job)
#   pg-fast        pg_ctl restart -m fast (the relays keep listening)
#   pg-immediate   pg_ctl restart -m immediate
#   partition      SIGSTOP of a daemon's relay for 1-12 s, then SIGCONT
#   cut            SIGUSR1 to a daemon's relay: every connection reset
#   read-only      the server read-only for 1-12 s (ALTER SYSTEM SET
#                  default_transaction_read_only = on and a reload, as a demoted primary
#                  answers): writes fail with SQLSTATE 25006, the producer's too
#   logstall       the reader of a daemon's stderr (a FIFO, read by cat into NAME.log) is
#                  stopped for 1-12 s, the pipe filled first: the daemon and its supervisor
#                  must neither wait for it nor kill late (their lines are dropped meanwhile)
# Faults overlap in time: a daemon may be stopped while PostgreSQL restarts.
#
# Three more queues carry flow-control limits (pgjobd.set_limits), set for every daemon:
# `lc` concurrency 4 (of 9 slots), `lg` group_concurrency 3 over 4 groups, `lr` rate 5/2s.
# A second producer enqueues into them for the whole run (its errors during faults are
# ignored). Their jobs run ljob.sh: under flock on one lock file it counts the commands of
# its queue, and of its group, alive at its start (a zombie has ended), and stamps its start
# (its first instruction) in limits.txt; then it sleeps as job.sh does. The report's last
# lines give the most commands seen alive at once per limit, the worst window of the rate,
# and `limit_violations=N`; any violation makes the exit status 1.
#
# Afterwards: faults stop, stopped processes continue, dead daemons are restarted, every job
# must end within CHAOS_SETTLE seconds, the daemons get SIGTERM, and check.awk reports what was
# violated: see its header for the checks. The output ends with `faults=N violations=M`; the exit
# status is 0 only without violations.
#
# Environment:
#   CHAOS_SECONDS    length of the fault phase (default 60)
#   CHAOS_SETTLE     deadline for every job to end afterwards (default 180)
#   CHAOS_FAULT_GAP  mean seconds between faults (default 1.5)
#   CHAOS_WINDOW     seconds after a fault in which the report counts a violation against it
#                    (default 8)
#   CHAOS_FAULTS     fault kinds to inject, space-separated (default all; `none` for a baseline)
#   CHAOS_SEED       seed of the random choices (printed; timing makes a rerun differ anyway)
#   CHAOS_LOCK_MODE  the queues' lock modes: transaction, lease, or mixed (the default: daemon a
#                    serves both queues in lock mode lease, b both in transaction, c `cg` in
#                    lease and `cu` in transaction, so each queue is served in both modes at
#                    once)
#   CHAOS_LEASE      the lease of lease-mode queues (default 3s: short, so that stops and
#                    partitions lead to takeovers)
#   CHAOS_BREAK      break the job command on purpose, to see the checks fire:
#                      linger          leave a process holding the group lock after the job
#                      linger-noflock  no flock, and END is logged by a process left behind
#   PGJOBD, CHAOS_PROXY  the binaries (make chaos sets them); PGJOBD_KEEP_TMP=1 keeps the files
PGJOBD_LIB_MODE=quiet
. "$(dirname "$0")/../integration/lib.sh"
CHAOS_DIR=$(cd "$(dirname "$0")" && pwd)

CHAOS_SECONDS=${CHAOS_SECONDS:-60}
CHAOS_SETTLE=${CHAOS_SETTLE:-180}
CHAOS_FAULT_GAP=${CHAOS_FAULT_GAP:-1.5}
# Seconds after a fault in which a violation is counted against it in the report: a command
# runs up to 8 s, so what a fault leaves running shows within that.
CHAOS_WINDOW=${CHAOS_WINDOW:-8}
CHAOS_SEED=${CHAOS_SEED:-$((RANDOM * 32768 + RANDOM))}
CHAOS_BREAK=${CHAOS_BREAK:-}
CHAOS_LOCK_MODE=${CHAOS_LOCK_MODE:-mixed}
CHAOS_LEASE=${CHAOS_LEASE:-3s}
PROXY=${CHAOS_PROXY:-$REPO_ROOT/build/tests/chaos-proxy}
ALL_KINDS="kill9 kill9-group stop terminate pg-fast pg-immediate partition cut read-only logstall"
CHAOS_FAULTS=${CHAOS_FAULTS:-$ALL_KINDS}
[ "$CHAOS_FAULTS" = none ] && CHAOS_FAULTS=
# A PostgreSQL restart ends every session at once, so it comes half as often as the others.
declare -A FAULT_WEIGHT=([kill9]=2 [kill9-group]=2 [stop]=2 [terminate]=2 [pg-fast]=1
	[pg-immediate]=1 [partition]=2 [cut]=2 [read-only]=1 [logstall]=2)
# (not DAEMONS: lib.sh keeps the pids of its own start_daemons there)
CHAOS_DAEMONS=(a b c)
NGROUPS=15

die_usage() {
	echo "chaos: $*" >&2
	exit 2
}
case $CHAOS_SECONDS in '' | *[!0-9]*) die_usage "CHAOS_SECONDS must be a whole number" ;; esac
case $CHAOS_SETTLE in '' | *[!0-9]*) die_usage "CHAOS_SETTLE must be a whole number" ;; esac
case $CHAOS_BREAK in '' | linger | linger-noflock) ;; *) die_usage "unknown CHAOS_BREAK '$CHAOS_BREAK'" ;; esac
case $CHAOS_LOCK_MODE in transaction | lease | mixed) ;; *) die_usage "unknown CHAOS_LOCK_MODE '$CHAOS_LOCK_MODE'" ;; esac
for k in $CHAOS_FAULTS; do
	[ -n "${FAULT_WEIGHT[$k]+x}" ] || die_usage "unknown fault kind '$k' (known: $ALL_KINDS)"
done
require_pgjobd
[ -x "$PROXY" ] || bail_out "chaos-proxy not found at $PROXY (run make chaos)"
RANDOM=$CHAOS_SEED

# ---------------------------------------------------------------- time, logging

# now_s: wall-clock seconds with microseconds, the clock of the job's lines.
now_s() { echo "$EPOCHREALTIME"; }

# say MSG: a progress line with the seconds since the start.
say() {
	local ms=$(($(now_ms) - T0))
	printf '[%4d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*"
}

# rand_ms MIN MAX: a uniform integer in [MIN, MAX].
rand_ms() { echo $(($1 + (RANDOM * 32768 + RANDOM) % ($2 - $1 + 1))); }

# ---------------------------------------------------------------- PostgreSQL, also on TCP

# lib.sh's server listens on its Unix socket only; the relays need TCP on the loopback.
pg_opts() {
	echo "-c listen_addresses=127.0.0.1 -c unix_socket_directories=$T/sock -c fsync=off" \
		"-c max_connections=200 -c port=$PG_PORT"
}

# pg_restart_mode fast|immediate: restart the server; 0 when it is up again.
pg_restart_mode() {
	as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -m "$1" -o "$(pg_opts)" \
		restart >/dev/null 2>>"$T/pgctl.log" && return 0
	# A failed restart may have left it stopped: start it, or the run cannot go on.
	as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -o "$(pg_opts)" \
		start >/dev/null 2>>"$T/pgctl.log" || bail_out "PostgreSQL does not start again (see pg.log)"
	return 1
}

# ---------------------------------------------------------------- the job

write_job_script() {
	local lock_take="exec 9>>\"\$lock\"
if ! flock -n 9; then
	echo \"CLASH \$q \$id \$g \$att \$fence \$EPOCHREALTIME \$\$ \$PPID\" >>\"\$log\"
	exit 1
fi"
	local run='sleep "$s"
echo "END $q $id $g $att $fence $EPOCHREALTIME $$ $res" >>"$log"'
	case $CHAOS_BREAK in
	linger)
		# A process that leaves the process group and keeps the lock (fd 9) after the job.
		run="setsid sleep 3 </dev/null >/dev/null 2>&1 &
$run"
		;;
	linger-noflock)
		# No lock, and the run goes on after the job has exited: its END comes later. The job
		# waits until that process has its own session, or the daemon's kill of the job's
		# process group at its end could still reach it.
		lock_take=
		run="setsid bash -c ': >\"\$6\"; sleep \"\$1\"; echo \"END \$2 \$EPOCHREALTIME \$3 \$4\" >>\"\$5\"' \\
	chaos-linger \"\$s\" \"\$q \$id \$g \$att \$fence\" \"\$\$\" \"\$res\" \"\$log\" \"\$dir/ready.\$\$\" \\
	</dev/null >/dev/null 2>&1 &
for i in {1..200}; do [ -e \"\$dir/ready.\$\$\" ] && break; sleep 0.01; done
rm -f \"\$dir/ready.\$\$\""
		;;
	esac
	cat >"$T/job.sh" <<EOF
#!/bin/bash
# A chaos job (written by tests/chaos/run.sh). Sleeps 0.1-1.5 s, one run in four 2-8 s so
# that faults often land while a command runs; fails while its attempt <= data->fail.
dir='$T'
log=\$dir/events.txt
q=\$PGJOBD_QUEUE id=\$PGJOBD_JOB_ID att=\$PGJOBD_ATTEMPT g=\${PGJOBD_GROUP_ID:--}
fence=\${PGJOBD_FENCE:--}
fence=\${fence//[[:space:]]/_}
if [ "\$g" != - ]; then lock=\$dir/locks/g.\$g; else lock=\$dir/locks/j.\$id; fi
if [ \$((RANDOM % 4)) = 0 ]; then ms=\$((RANDOM % 6001 + 2000)); else ms=\$((RANDOM % 1401 + 100)); fi
printf -v s '%d.%03d' \$((ms / 1000)) \$((ms % 1000))
res=ok
[ "\${PGJOBD_ARG_fail:-0}" -ge "\$att" ] && res=fail
$lock_take
echo "START \$q \$id \$g \$att \$fence \$EPOCHREALTIME \$\$ \$PPID" >>"\$log"
$run
[ \$res = ok ]
EOF
	chmod +x "$T/job.sh"
}

# The job of the limited queues (see the header): the measurement of make_limit_script in
# tests/integration/lib.sh, with job.sh's durations.
write_limit_job_script() {
	cat >"$T/ljob.sh" <<EOF
#!/bin/bash
t=\${EPOCHREALTIME/[.,]/}
d='$T'
q=\$PGJOBD_QUEUE g=\${PGJOBD_GROUP_ID:--}
alive() { local l s; IFS= read -r l </proc/\$1/stat 2>/dev/null || return 1; s=\${l##*) }; s=\${s%% *}; [ "\$s" != Z ]; }
exec 8>>"\$d/limit.lock"
flock 8
echo "\$\$ \$q \$g" >>"\$d/limit.pids"
nq=0 ng=0
while read -r p pq pg; do
	[ "\$pq" = "\$q" ] && alive "\$p" || continue
	nq=\$((nq + 1))
	[ "\$pg" = "\$g" ] && ng=\$((ng + 1))
done <"\$d/limit.pids"
echo "L \$q \$g \$PGJOBD_JOB_ID \$PGJOBD_ATTEMPT \$t \$nq \$ng" >>"\$d/limits.txt"
exec 8>&-
if [ \$((RANDOM % 4)) = 0 ]; then ms=\$((RANDOM % 6001 + 2000)); else ms=\$((RANDOM % 1401 + 100)); fi
printf -v s '%d.%03d' \$((ms / 1000)) \$((ms % 1000))
sleep "\$s"
EOF
	chmod +x "$T/ljob.sh"
}

# limit_producer: 2 jobs a second into lc, 2 into lg (one of 4 groups each), 1 into lr
# (which starts at most 2.5 a second), until producer.stop exists.
limit_producer() {
	trap - EXIT
	until [ -e "$T/producer.stop" ]; do
		psql -X -qAt -c "INSERT INTO pgjobd.jobs (queue, group_id)
			VALUES ('lc', NULL), ('lc', NULL), ('lg', 'l' || (random() * 3)::int),
			       ('lg', 'l' || (random() * 3)::int), ('lr', NULL)" >/dev/null 2>&1
		sleep 1
	done
}

# ---------------------------------------------------------------- relays and daemons

# Per daemon name: relay pid and port, daemon pid (empty while it is down), when a stop or a
# partition began (wall clock for faults.txt, ms for its length) and ends (ms, 0 for none),
# and when a killed daemon is restarted (ms, 0 for never).
declare -A PROXY_PID PROXY_PORT DPID STOP_UNTIL STOP_FROM STOP_START_MS PSTOP_UNTIL PSTOP_FROM \
	PSTOP_START_MS RESTART_AT
# logstall: per daemon name, the pid of the cat that reads its stderr (a FIFO) into NAME.log,
# and, while it is stopped, until when (ms, 0 for not), since when, and the daemon it served.
declare -A READER_PID LSTOP_READER LSTOP_UNTIL LSTOP_FROM LSTOP_START_MS LSTOP_TARGET

save_pids() {
	local n
	: >"$T/proxies.pids"
	for n in "${CHAOS_DAEMONS[@]}"; do
		[ -n "${PROXY_PID[$n]}" ] && echo "${PROXY_PID[$n]}" >>"$T/proxies.pids"
	done
}

start_proxy() {
	local n=$1
	"$PROXY" "$T/proxy-$n.port" "$PG_PORT" 2>>"$T/proxy-$n.log" </dev/null &
	PROXY_PID[$n]=$!
	save_pids
	wait_until 10 "[ -s '$T/proxy-$n.port' ]" || bail_out "relay $n did not start (see proxy-$n.log)"
	PROXY_PORT[$n]=$(cat "$T/proxy-$n.port")
	[ "$(psql -X -qAt -h 127.0.0.1 -p "${PROXY_PORT[$n]}" -c 'SELECT 42' 2>>"$T/proxy-$n.log")" = 42 ] ||
		bail_out "PostgreSQL does not answer through relay $n (see proxy-$n.log)"
}

# lock_mode_of DAEMON QUEUE: the queue's lock mode in that daemon (CHAOS_LOCK_MODE).
lock_mode_of() {
	case $CHAOS_LOCK_MODE:$1:$2 in
	transaction:*) echo transaction ;;
	lease:*) echo lease ;;
	mixed:a:* | mixed:c:cg) echo lease ;;
	*) echo transaction ;;
	esac
}

write_daemon_conf() {
	local n=$1 qname
	{
		echo "[pgjobd]"
		echo "database = host=127.0.0.1 port=${PROXY_PORT[$n]} dbname=pgjobd_test user=postgres"
		echo "worker_name = chaos-$n"
		echo "poll_interval = 500ms"
		echo "shutdown_grace = 10s"
		echo "log_level = info"
		for qname in cg cu; do
			cat <<EOF

[queue.$qname]
command = exec /bin/bash '$T/job.sh'
concurrency = 3
timeout = 60s
kill_grace = 1s
max_attempts = 10
backoff = 200ms
backoff_max = 1s
env = CHAOS_MARK=$MARK
lock_mode = $(lock_mode_of "$n" "$qname")
lease = $CHAOS_LEASE
EOF
		done
		for qname in lc lg lr; do
			cat <<EOF

[queue.$qname]
command = exec /bin/bash '$T/ljob.sh'
concurrency = 3
timeout = 60s
kill_grace = 1s
max_attempts = 10
backoff = 200ms
backoff_max = 1s
env = CHAOS_MARK=$MARK
lock_mode = $(lock_mode_of "$n" "$qname")
lease = $CHAOS_LEASE
EOF
		done
	} >"$T/$n.ini"
}

# pgid_of PID: the process group of PID (the fifth field of /proc/PID/stat; the second, the
# command name, may contain spaces and parentheses, hence the cut after the last ") ").
pgid_of() {
	local line f
	IFS= read -r line 2>/dev/null </proc/"$1"/stat || return 1
	read -r -a f <<<"${line##*) }"
	echo "${f[2]}"
}

# start_chaos_daemon NAME: the daemon in its own session and process group (setsid: the shell's
# background job is no group leader, so setsid execs in place and $! is the daemon).
start_chaos_daemon() {
	local n=$1 pid
	if [ "${BASH_SUBSHELL:-0}" != 0 ]; then
		echo "start_chaos_daemon: called in a subshell" >&2
		exit 1
	fi
	echo "---- $(date -u +%FT%T.%NZ) chaos: start" >>"$T/$n.log"
	# stderr is a FIFO with a reader of its own (logstall stops it): a new one each start,
	# as the previous reader ends once the previous daemon and its supervisor are gone (a
	# stopped one is continued by end_logstall).
	rm -f "$T/$n.fifo"
	mkfifo "$T/$n.fifo"
	cat "$T/$n.fifo" >>"$T/$n.log" &
	READER_PID[$n]=$! # its command line names $T: lib.sh's cleanup ends it
	setsid "$PGJOBD" -c "$T/$n.ini" >"$T/$n.fifo" 2>&1 </dev/null &
	pid=$!
	DPID[$n]=$pid
	DAEMON_PIDS+=("$pid")
	echo "$pid" >"$T/$n.pid"
	STOP_UNTIL[$n]=0
	RESTART_AT[$n]=0
	echo "D start $n $pid $(now_s)" >>"$T/daemons.txt"
	# The process group must be the daemon's own, or kill9-group would hit this shell.
	wait_until 5 "[ \"\$(pgid_of $pid)\" = $pid ]" ||
		bail_out "daemon $n (pid $pid) is not the leader of its own process group"
}

# reap NAME: the daemon's pid is gone (killed by us or died); collect its status.
reap() {
	local n=$1 pid=${DPID[$1]} status
	wait "$pid" 2>/dev/null
	status=$?
	forget_daemon "$pid"
	DPID[$n]=
	REAPED_STATUS=$status
}

# ---------------------------------------------------------------- faults

# fault KIND TARGET START END DETAIL: one line of faults.txt. TARGET is NAME:PID for a fault
# aimed at one daemon process, NAME for one aimed at its relay (whichever process of that
# daemon uses it), - for one aimed at all of them.
fault() {
	echo "F $1 $2 $3 $4 ${5:--}" >>"$T/faults.txt"
	say "fault $1 $2 ${5:-}"
}

end_stop() {
	local n=$1
	[ "${STOP_UNTIL[$n]:-0}" = 0 ] && return
	[ -n "${DPID[$n]}" ] && kill -CONT "${DPID[$n]}" 2>/dev/null
	fault stop "$n:${DPID[$n]}" "${STOP_FROM[$n]}" "$(now_s)" "$(($(now_ms) - ${STOP_START_MS[$n]}))ms"
	STOP_UNTIL[$n]=0
}

end_partition() {
	local n=$1
	[ "${PSTOP_UNTIL[$n]:-0}" = 0 ] && return
	kill -CONT "${PROXY_PID[$n]}" 2>/dev/null
	fault partition "$n" "${PSTOP_FROM[$n]}" "$(now_s)" "$(($(now_ms) - ${PSTOP_START_MS[$n]}))ms"
	PSTOP_UNTIL[$n]=0
}

# set_read_only on|off: the server's default_transaction_read_only (the read-only fault).
set_read_only() {
	PGOPTIONS="-c default_transaction_read_only=off" psql -X -qAt -v ON_ERROR_STOP=1 \
		-c "ALTER SYSTEM SET default_transaction_read_only = $1" \
		-c "SELECT pg_reload_conf()" >/dev/null 2>&1
}

# end_read_only: the server takes writes again (tried again at the next tick when the
# server cannot be reached now).
end_read_only() {
	[ "${RO_UNTIL:-0}" = 0 ] && return
	set_read_only off || return
	fault read-only - "$RO_FROM" "$(now_s)" "$(($(now_ms) - RO_START_MS))ms"
	RO_UNTIL=0
}

end_logstall() {
	local n=$1
	[ "${LSTOP_UNTIL[$n]:-0}" = 0 ] && return
	kill -CONT "${LSTOP_READER[$n]}" 2>/dev/null
	fault logstall "${LSTOP_TARGET[$n]}" "${LSTOP_FROM[$n]}" "$(now_s)" \
		"$(($(now_ms) - ${LSTOP_START_MS[$n]}))ms"
	LSTOP_UNTIL[$n]=0
}

# pick_daemon COND: a random daemon name for which COND (with $n set) holds, in $PICK.
pick_daemon() {
	local cond=$1 n cands=()
	for n in "${CHAOS_DAEMONS[@]}"; do
		eval "$cond" && cands+=("$n")
	done
	[ ${#cands[@]} -gt 0 ] || return 1
	PICK=${cands[RANDOM % ${#cands[@]}]}
}

# terminate_one FILTER: pg_terminate_backend of one random pgjobd session that matches the SQL
# FILTER; prints its application_name and state, nothing when there was none.
terminate_one() {
	psql_q "SELECT replace(application_name || '(' || state || ')', ' ', '_') FROM (
		SELECT pid, application_name, state FROM pg_stat_activity
		WHERE application_name LIKE 'pgjobd%' AND pid <> pg_backend_pid() $1
		ORDER BY random() LIMIT 1) s WHERE pg_terminate_backend(pid)" 2>/dev/null
}

# inject KIND: one fault; 1 when it was not possible now (nothing to act on).
inject() {
	local kind=$1 n pid t0 t1 app
	case $kind in
	kill9 | kill9-group)
		pick_daemon '[ -n "${DPID[$n]}" ]' || return 1
		n=$PICK
		pid=${DPID[$n]}
		t0=$(now_s)
		if [ "$kind" = kill9 ]; then
			kill -KILL "$pid"
		else
			# The daemon leads its own group (setsid): this is the daemon and every process
			# of its group, as supervisord's killasgroup or a careless `kill -9 -PGID` does.
			kill -KILL -- "-$pid"
		fi
		reap "$n"
		if [ "${STOP_UNTIL[$n]:-0}" != 0 ]; then
			fault stop "$n:$pid" "${STOP_FROM[$n]}" "$t0" "killed"
			STOP_UNTIL[$n]=0
		fi
		RESTART_AT[$n]=$(($(now_ms) + $(rand_ms 0 2000)))
		fault "$kind" "$n:$pid" "$t0" "$t0"
		;;
	stop)
		pick_daemon '[ -n "${DPID[$n]}" ] && [ "${STOP_UNTIL[$n]:-0}" = 0 ]' || return 1
		n=$PICK
		kill -STOP "${DPID[$n]}"
		STOP_FROM[$n]=$(now_s)
		STOP_START_MS[$n]=$(now_ms)
		STOP_UNTIL[$n]=$((STOP_START_MS[$n] + $(rand_ms 1000 12000)))
		say "stop $n for $((STOP_UNTIL[$n] - STOP_START_MS[$n])) ms"
		;;
	partition)
		pick_daemon '[ "${PSTOP_UNTIL[$n]:-0}" = 0 ]' || return 1
		n=$PICK
		kill -STOP "${PROXY_PID[$n]}"
		PSTOP_FROM[$n]=$(now_s)
		PSTOP_START_MS[$n]=$(now_ms)
		PSTOP_UNTIL[$n]=$((PSTOP_START_MS[$n] + $(rand_ms 1000 12000)))
		say "partition $n for $((PSTOP_UNTIL[$n] - PSTOP_START_MS[$n])) ms"
		;;
	logstall)
		pick_daemon '[ -n "${DPID[$n]}" ] && [ "${LSTOP_UNTIL[$n]:-0}" = 0 ] && [ -n "${READER_PID[$n]:-}" ]' || return 1
		n=$PICK
		kill -STOP "${READER_PID[$n]}"
		LSTOP_READER[$n]=${READER_PID[$n]}
		LSTOP_TARGET[$n]=$n:${DPID[$n]}
		LSTOP_FROM[$n]=$(now_s)
		LSTOP_START_MS[$n]=$(now_ms)
		LSTOP_UNTIL[$n]=$((LSTOP_START_MS[$n] + $(rand_ms 1000 12000)))
		# Fill the pipe now, or the daemon's own lines would take a minute to: yes blocks
		# once it is full, and timeout ends it, also if the open of the FIFO blocks (a
		# grandchild: no job of this shell).
		(timeout 1 bash -c 'exec yes "chaos: filler line, the log reader is stopped" >"$1"' \
			chaos-fill "$T/$n.fifo" 2>/dev/null &)
		say "log reader of $n stopped for $((LSTOP_UNTIL[$n] - LSTOP_START_MS[$n])) ms"
		;;
	cut)
		pick_daemon '[ "${PSTOP_UNTIL[$n]:-0}" = 0 ]' || return 1
		n=$PICK
		t0=$(now_s)
		kill -USR1 "${PROXY_PID[$n]}"
		fault cut "$n" "$t0" "$t0"
		;;
	terminate)
		# Every other time, a session inside a transaction (a slot holding a running job, in
		# transaction lock mode): a random one of all is most often an idle one, and the loss
		# of a claim is what tests the daemon.
		t0=$(now_s)
		app=
		if [ $((RANDOM % 2)) = 0 ]; then
			app=$(terminate_one "AND state = 'idle in transaction'")
		fi
		[ -n "$app" ] || app=$(terminate_one "")
		[ -n "$app" ] || return 1
		fault terminate - "$t0" "$t0" "$app"
		;;
	read-only)
		[ "${RO_UNTIL:-0}" = 0 ] || return 1
		set_read_only on || return 1
		RO_FROM=$(now_s)
		RO_START_MS=$(now_ms)
		RO_UNTIL=$((RO_START_MS + $(rand_ms 1000 12000)))
		say "read-only for $((RO_UNTIL - RO_START_MS)) ms"
		;;
	pg-fast | pg-immediate)
		t0=$(now_s)
		if pg_restart_mode "${kind#pg-}"; then
			t1=$(now_s)
			fault "$kind" - "$t0" "$t1"
		else
			t1=$(now_s)
			fault "$kind" - "$t0" "$t1" "restart-failed"
		fi
		;;
	esac
	return 0
}

# One scheduler pass: continue what is due, restart what is due, notice daemons that died.
tick() {
	local n now status
	now=$(now_ms)
	if [ "${RO_UNTIL:-0}" != 0 ] && [ "$now" -ge "$RO_UNTIL" ]; then
		end_read_only
	fi
	for n in "${CHAOS_DAEMONS[@]}"; do
		if [ "${STOP_UNTIL[$n]:-0}" != 0 ] && [ "$now" -ge "${STOP_UNTIL[$n]}" ]; then
			end_stop "$n"
		fi
		if [ "${PSTOP_UNTIL[$n]:-0}" != 0 ] && [ "$now" -ge "${PSTOP_UNTIL[$n]}" ]; then
			end_partition "$n"
		fi
		if [ "${LSTOP_UNTIL[$n]:-0}" != 0 ] && [ "$now" -ge "${LSTOP_UNTIL[$n]}" ]; then
			end_logstall "$n"
		fi
		if [ -n "${DPID[$n]}" ] && ! pid_alive "${DPID[$n]}"; then
			# Not killed by us: a daemon keeps running whatever happens to its database
			# connections, so an exit on its own is a violation.
			reap "$n"
			status=$REAPED_STATUS
			echo "D exit $n $status $(now_s)" >>"$T/daemons.txt"
			say "daemon $n exited on its own with status $status; restarting it"
			STOP_UNTIL[$n]=0
			RESTART_AT[$n]=$now
		fi
		if [ -z "${DPID[$n]}" ] && [ "${RESTART_AT[$n]:-0}" != 0 ] && [ "$now" -ge "${RESTART_AT[$n]}" ]; then
			start_chaos_daemon "$n"
		fi
	done
}

# ---------------------------------------------------------------- the producer

# Runs in a background subshell. Two psql sessions (S1, S2) read SQL from fifos; after each
# batch `\echo @@ok` marks the end of its output. psql exits at the first error (ON_ERROR_STOP),
# so an error, a lost connection and a PostgreSQL restart all look the same: end of file.
# enqueue.txt gets one line per job of a transaction whose COMMIT was sent, in the order of the
# COMMITs: "C SEQ ID QUEUE GROUP" when it was confirmed, "U ..." when the session died before
# the answer (committed or not: the table tells), "X ..." when the answer did not come in 30 s
# (its place in the commit order is unknown: left out of the order check). A COMMIT is sent
# only after the previous one was answered or its session had ended, so SEQ is commit order.
producer() {
	trap '' PIPE
	trap - EXIT
	RANDOM=$((CHAOS_SEED + 1))
	local -A sw sr spid
	local seq=0 rows_a=() rows_b=()

	sess_up() {
		local n=$1 fd
		[ -n "${spid[$n]}" ] && return 0
		rm -f "$T/p$n.in" "$T/p$n.out"
		mkfifo "$T/p$n.in" "$T/p$n.out"
		psql -X -qAt -v ON_ERROR_STOP=1 <"$T/p$n.in" >"$T/p$n.out" 2>>"$T/producer.log" &
		spid[$n]=$!
		exec {fd}>"$T/p$n.in"
		sw[$n]=$fd
		exec {fd}<"$T/p$n.out"
		sr[$n]=$fd
		echo "$BASHPID ${spid[1]} ${spid[2]}" >"$T/producer.pids"
	}
	sess_down() {
		local n=$1 fd
		[ -n "${spid[$n]}" ] || return 0
		fd=${sw[$n]}
		exec {fd}>&-
		fd=${sr[$n]}
		exec {fd}<&-
		kill -KILL "${spid[$n]}" 2>/dev/null
		wait "${spid[$n]}" 2>/dev/null
		spid[$n]=
	}
	# sess_do N SQL: run SQL on session N; its output lines in OUT. 0 on success, 1 when the
	# session ended (it is closed), 2 on a timeout (it is closed too).
	sess_do() {
		local n=$1 line
		OUT=()
		sess_up "$n"
		if ! printf '%s\n\\echo @@ok\n' "$2" 1>&"${sw[$n]}" 2>/dev/null; then
			sess_down "$n"
			return 1
		fi
		while :; do
			IFS= read -r -t 30 -u "${sr[$n]}" line
			case $? in
			0) ;;
			1) sess_down "$n"; return 1 ;;
			*) sess_down "$n"; return 2 ;;
			esac
			[ "$line" = @@ok ] && return 0
			OUT+=("$line")
		done
	}
	# values K [GROUP]: the VALUES list of K new jobs; the first is in GROUP when given. About
	# 60% are grouped; a grouped job often reuses the group of the one before, so groups get
	# several jobs in one transaction. One in five fails its first 1-2 attempts.
	values() {
		local k=$1 g=${2:-} i v=() fail q grp
		for ((i = 0; i < k; i++)); do
			fail=0
			[ $((RANDOM % 5)) = 0 ] && fail=$((RANDOM % 2 + 1))
			if [ -n "$g" ] && [ "$i" = 0 ]; then
				grp=$g
			elif [ $((RANDOM % 10)) -lt 6 ]; then
				if [ -n "${grp:-}" ] && [ $((RANDOM % 2)) = 0 ]; then
					:
				else
					printf -v grp 'g%02d' $((RANDOM % NGROUPS + 1))
				fi
			else
				grp=
			fi
			if [ -n "$grp" ]; then
				q="('cg', '$grp', '{\"fail\": $fail}')"
			else
				q="('cu', NULL, '{\"fail\": $fail}')"
			fi
			v+=("$q")
		done
		local IFS=,
		VALUES="${v[*]}"
	}
	insert_sql() {
		echo "BEGIN; INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES $1
			RETURNING id, queue, coalesce(group_id, '-');"
	}
	# record TAG ROWS...: the jobs of one COMMIT, in its place in the commit order.
	record() {
		local tag=$1 row id q g
		shift
		seq=$((seq + 1))
		for row in "$@"; do
			IFS='|' read -r id q g <<<"$row"
			echo "$tag $seq $id $q $g"
		done >>"$T/enqueue.txt"
	}
	# commit N ROWS...: COMMIT on session N and record its jobs.
	commit() {
		local n=$1 rc
		shift
		sess_do "$n" "COMMIT;"
		rc=$?
		case $rc in
		0) record C "$@" ;;
		1) record U "$@" ;;
		*) record X "$@" ;;
		esac
	}

	local k g
	while [ ! -e "$T/producer.stop" ]; do
		if [ $((RANDOM % 5)) = 0 ]; then
			# Open A, then open, fill and commit B, then commit A: B's jobs get higher ids but
			# become visible first; both have a job in group g.
			printf -v g 'g%02d' $((RANDOM % NGROUPS + 1))
			values $((RANDOM % 3 + 1)) "$g"
			if sess_do 1 "$(insert_sql "$VALUES")"; then
				rows_a=("${OUT[@]}")
				values $((RANDOM % 3 + 1)) "$g"
				if sess_do 2 "$(insert_sql "$VALUES")"; then
					rows_b=("${OUT[@]}")
					commit 2 "${rows_b[@]}"
				fi
				sleep "0.$((RANDOM % 9 + 1))"
				commit 1 "${rows_a[@]}"
			fi
		else
			values $((RANDOM % 5 + 1))
			if sess_do 1 "$(insert_sql "$VALUES")"; then
				rows_a=("${OUT[@]}")
				commit 1 "${rows_a[@]}"
			fi
		fi
		sleep "0.$((RANDOM % 9 + 1))"
	done
	sess_down 1
	sess_down 2
	rm -f "$T/producer.pids"
}

# ---------------------------------------------------------------- cleanup

chaos_cleanup() {
	local status=$? n
	# Stopped processes first: SIGKILL works on them, but their children may wait for them.
	for n in "${CHAOS_DAEMONS[@]}"; do
		[ -n "${DPID[$n]}" ] && kill -KILL -- "-${DPID[$n]}" 2>/dev/null
		[ -n "${PROXY_PID[$n]}" ] && kill -CONT "${PROXY_PID[$n]}" 2>/dev/null
		[ -n "${LSTOP_READER[$n]:-}" ] && kill -CONT "${LSTOP_READER[$n]}" 2>/dev/null
	done
	kill_marked
	# Reaped here, quietly: lib.sh's cleanup would kill them too, and the shell would report
	# each as "Killed".
	for n in "${CHAOS_DAEMONS[@]}"; do
		[ -n "${PROXY_PID[$n]}" ] || continue
		kill -KILL "${PROXY_PID[$n]}" 2>/dev/null
		wait "${PROXY_PID[$n]}" 2>/dev/null
		PROXY_PID[$n]=
	done
	[ -n "$T" ] && rm -f "$T/proxies.pids"
	if [ "$status" != 0 ] && [ -n "$T" ] && [ -d "$T" ]; then
		show_logs
		# lib.sh's cleanup would print them again, after the verdict.
		mkdir -p "$T/logs" && mv "$T"/*.log "$T/logs/" 2>/dev/null
		if [ -s "$T/report.txt" ]; then
			echo
			echo "==== the verdict again (seed $CHAOS_SEED; the report is above the logs) ===="
			sed -n '/^== violations ==/,/^total/p' "$T/report.txt"
			tail -n 1 "$T/report.txt"
		fi
	fi
	(exit "$status")
	cleanup
}

# show_logs: the end of every log (they can be long): 60 lines of a daemon's, 30 of others.
show_logs() {
	local f lines
	for f in "$T"/*.log; do
		[ -s "$f" ] || continue
		case ${f##*/} in
		initdb.log) continue ;;
		[abc].log) lines=60 ;;
		*) lines=30 ;;
		esac
		echo "# ---- last $lines lines of $f ----"
		tail -n "$lines" "$f" | sed 's/^/# /'
	done
}
trap chaos_cleanup EXIT

# marked_pids: every process whose environment carries this run's CHAOS_MARK.
marked_pids() {
	local d
	for d in /proc/[0-9]*; do
		# -z: the entries end in NUL; -s: processes that end meanwhile, kernel threads.
		grep -qsxzF -- "CHAOS_MARK=$MARK" "$d/environ" && echo "${d#/proc/}"
	done
}

kill_marked() {
	local p
	[ -n "${MARK:-}" ] || return 0
	for p in $(marked_pids); do
		[ "$p" != $$ ] && kill -KILL "$p" 2>/dev/null
	done
}

# ---------------------------------------------------------------- the run

T0=$(now_ms)
PG_PORT=$("$PROXY" --free-port) || bail_out "chaos-proxy --free-port failed"
pg_start
MARK=${T##*/}
mkdir -p "$T/locks"
: >"$T/events.txt"
: >"$T/enqueue.txt"
: >"$T/faults.txt"
: >"$T/daemons.txt"
: >"$T/procs.txt"
: >"$T/limits.txt"
: >"$T/limit.pids"
write_job_script
write_limit_job_script
say "seed $CHAOS_SEED, $CHAOS_SECONDS s of faults (${CHAOS_FAULTS:-none}), lock modes $CHAOS_LOCK_MODE (lease $CHAOS_LEASE), files in $T"
say "PostgreSQL on $T/sock and 127.0.0.1:$PG_PORT"

for n in "${CHAOS_DAEMONS[@]}"; do
	start_proxy "$n"
	write_daemon_conf "$n"
done
"$PGJOBD" migrate -c "$T/a.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
psql_q "SELECT pgjobd.set_limits('lc', concurrency => 4), pgjobd.set_limits('lg', group_concurrency => 3),
               pgjobd.set_limits('lr', rate => '5/2s')" >/dev/null || bail_out "set_limits failed"
for n in "${CHAOS_DAEMONS[@]}"; do
	start_chaos_daemon "$n"
	say "daemon $n: pid ${DPID[$n]}, relay 127.0.0.1:${PROXY_PORT[$n]} (pid ${PROXY_PID[$n]})"
done

producer >>"$T/producer.log" 2>&1 &
PRODUCER=$!
limit_producer &
LPRODUCER=$!

# The weighted list of fault kinds to draw from.
DRAW=()
for k in $CHAOS_FAULTS; do
	for ((i = 0; i < FAULT_WEIGHT[$k]; i++)); do DRAW+=("$k"); done
done
GAP_MS=$(secs_to_ms "$CHAOS_FAULT_GAP")
END_MS=$((T0 + CHAOS_SECONDS * 1000))
next_fault=$(($(now_ms) + GAP_MS))
while [ "$(now_ms)" -lt "$END_MS" ]; do
	tick
	if [ ${#DRAW[@]} -gt 0 ] && [ "$(now_ms)" -ge "$next_fault" ]; then
		for _ in 1 2 3 4 5; do
			inject "${DRAW[RANDOM % ${#DRAW[@]}]}" && break
		done
		next_fault=$(($(now_ms) + GAP_MS * (20 + RANDOM % 161) / 100))
	fi
	sleep 0.1
done

# ---------------------------------------------------------------- settle

say "faults stop; the producer stops"
touch "$T/producer.stop"
wait_until 60 "! pid_alive $PRODUCER" || say "the producer does not stop"
wait "$PRODUCER" 2>/dev/null
wait_until 10 "! pid_alive $LPRODUCER"
wait "$LPRODUCER" 2>/dev/null
end_read_only
for n in "${CHAOS_DAEMONS[@]}"; do
	end_stop "$n"
	end_partition "$n"
	end_logstall "$n"
	[ -z "${DPID[$n]}" ] && RESTART_AT[$n]=1
done
tick

# settle_done: every job ended; polls the table at most every 500 ms and keeps the daemons up.
LAST_POLL=0
settle_done() {
	tick
	[ $(($(now_ms) - LAST_POLL)) -ge 500 ] || return 1
	LAST_POLL=$(now_ms)
	[ "$(count_jobs "status IN ('queued', 'running')" 2>/dev/null)" = 0 ]
}
say "waiting up to $CHAOS_SETTLE s for every job to end"
if wait_until "$CHAOS_SETTLE" settle_done; then
	say "every job ended"
else
	say "jobs still open after $CHAOS_SETTLE s:"
	psql_q "SELECT id, queue, group_id, status, attempts, run_at, worker FROM pgjobd.jobs
		WHERE status IN ('queued', 'running') ORDER BY id LIMIT 20"
fi

say "SIGTERM to the daemons"
for n in "${CHAOS_DAEMONS[@]}"; do
	[ -n "${DPID[$n]}" ] && kill -TERM "${DPID[$n]}"
done
for n in "${CHAOS_DAEMONS[@]}"; do
	[ -n "${DPID[$n]}" ] || continue
	pid=${DPID[$n]}
	if ! wait_until 40 "! pid_alive $pid"; then
		say "daemon $n does not stop on SIGTERM; killing it"
		kill -KILL -- "-$pid" 2>/dev/null
	fi
	reap "$n"
	echo "D stop $n $REAPED_STATUS $(now_s)" >>"$T/daemons.txt"
done

# Anything of a job still alive now outlived its daemon's claim: the daemon stops its commands
# before it exits. Its helper process (the same command line) exits once it sees the daemon
# gone, which may take a moment: it has 5 s.
for p in $(marked_pids); do
	echo "P $p $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | tr -s ' ' | cut -c1-80 | tr ' ' _)"
done >>"$T/procs.txt"
for n in "${CHAOS_DAEMONS[@]}"; do
	wait_until 5 "! pgrep -f -- '$T/$n.ini' >/dev/null" && continue
	for p in $(pgrep -f -- "$T/$n.ini"); do
		echo "P $p daemon-$n-helper"
	done
done >>"$T/procs.txt"
kill_marked

psql -X -qAt -F ' ' -v ON_ERROR_STOP=1 -c "SELECT 'J', id, queue, coalesce(group_id, '-'),
	status, attempts FROM pgjobd.jobs WHERE queue IN ('cg', 'cu') ORDER BY id" >"$T/jobs.txt" ||
	bail_out "cannot read pgjobd.jobs"

LC_ALL=C sort -s -k7,7n -k1,1 "$T/events.txt" >"$T/events.sorted"
awk -v kinds="$ALL_KINDS" -v expect_kinds="$CHAOS_FAULTS" -v window="$CHAOS_WINDOW" \
	-f "$CHAOS_DIR/check.awk" "$T/faults.txt" "$T/enqueue.txt" "$T/jobs.txt" "$T/daemons.txt" \
	"$T/procs.txt" pass=1 "$T/events.sorted" pass=2 "$T/events.sorted" >"$T/report.txt"
status=$?

# The limited queues: each limit from the commands' side, and every job ended.
lmax() { awk -v q="$1" -v c="$2" '$1 == "L" && $2 == q && $c > m { m = $c } END { print m + 0 }' "$T/limits.txt"; }
lc_max=$(lmax lc 7)
lg_max=$(lmax lg 8)
lr_worst=$(awk '$1 == "L" && $2 == "lr" { print $6 }' "$T/limits.txt" | sort -n |
	awk '{ ts[n] = $1 / 1000; c = 0; for (j = n; j >= 0 && ts[n] - ts[j] < 2000; j--) c++; n++; if (c > w) w = c }
	     END { print w + 0 }')
lost=$(count_jobs "queue IN ('lc', 'lg', 'lr') AND status <> 'succeeded'")
lstarts=$(psql_q "SELECT string_agg(queue || ' ' || n, ', ' ORDER BY queue) FROM
	(SELECT queue, count(*) n FROM pgjobd.jobs WHERE queue IN ('lc', 'lg', 'lr') GROUP BY 1) s")
lviol=0
[ "$lc_max" -le 4 ] || lviol=$((lviol + 1))
[ "$lg_max" -le 3 ] || lviol=$((lviol + 1))
[ "$lr_worst" -le 5 ] || lviol=$((lviol + 1))
[ "$lost" = 0 ] || lviol=$((lviol + 1))
{
	echo "limits: jobs $lstarts, not succeeded $lost; starts $(grep -c '^L ' "$T/limits.txt")"
	echo "limits: lc most alive at once $lc_max (concurrency 4), lg most of a group $lg_max (group_concurrency 3), lr most starts in 2 s $lr_worst (rate 5/2s)"
	echo "limit_violations=$lviol"
} >>"$T/report.txt"
[ "$lviol" = 0 ] || status=1
echo
cat "$T/report.txt"
[ "$status" = 0 ] || say "violations found (seed $CHAOS_SEED); the logs follow"
exit "$status"
