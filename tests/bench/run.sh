#!/usr/bin/env bash
# tests/bench/run.sh - `make bench`: measure pgjobd against a throwaway PostgreSQL with
# default durability, print a table and write build/bench/results.json.
#
# Measurements, not tests: the script exits 0 whatever the figures say (1 only when the
# harness itself breaks: no PostgreSQL, a failed setup statement, a missing helper).
# Figures that could not be measured (a daemon that died, a run that timed out) are
# listed under "problems" in the output and in the JSON, and are left out of the table.
# What each figure means and how to read it: tests/bench/README.
#
# Every figure is the median of BENCH_REPS repetitions (default 3), shown with its min and
# max. The repetition loop is the outer loop, so a burst of other work on the machine
# lands in one repetition of every measurement rather than in all of one.
#
# Usage:  make bench                  (builds pgjobd and the helpers first)
#         BENCH_QUICK=1 make bench    (every size 10x smaller: about 2 min; 30 s with BENCH_REPS=1)
#         BENCH_REPS=5 BENCH_JOBS=50000 make bench
# Direct: PGJOBD=build/pgjobd BENCH_BIN=build/bench bash tests/bench/run.sh
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
repo=$PWD

# ---------------------------------------------------------------- sizes (env overrides)
QUICK=${BENCH_QUICK:-0}
div=1
[ "$QUICK" = 1 ] && div=10
REPS=${BENCH_REPS:-3}
CONCURRENCY=${BENCH_CONCURRENCY:-16}          # slots per queue in measurements 2, 3, 4, 6d
N_SPAWNS=${BENCH_SPAWNS:-$((20000 / div))}    # 1: spawns per ceiling run
N_JOBS=${BENCH_JOBS:-$((20000 / div))}        # 2: jobs per throughput run
N_GROUPS=${BENCH_GROUPS:-100}                 # 2b: groups of the grouped throughput run
N_PICKUP=${BENCH_PICKUP:-$((200 / div))}      # 3: single-row INSERTs per pickup run
N_PTRACE=${BENCH_PICKUP_TRACE:-$((50 / div))} # 3t, 8t: INSERTs of the pickup run under strace
PICKUP_MIN_MS=${BENCH_PICKUP_MIN_MS:-20}      # 3: random pause before each INSERT
PICKUP_MAX_MS=${BENCH_PICKUP_MAX_MS:-50}
N_SMALL=${BENCH_SMALL:-1000}                  # 4: small backlog, drained entirely (not
G_SMALL=${BENCH_SMALL_GROUPS:-100}            #    shrunk by QUICK: fewer groups than slots)
N_LARGE=${BENCH_LARGE:-$((1000000 / div))}    # 4: large backlog
G_LARGE=${BENCH_LARGE_GROUPS:-$((100000 / div))}
N_LARGE_STOP=${BENCH_LARGE_STOP:-$((5000 / div))} # 4: finished jobs measured in the large run
ENQ_SECS=${BENCH_ENQ_SECS:-$((10 / div))}     # 5: pgbench -T
ENQ_CLIENTS=${BENCH_ENQ_CLIENTS:-16}          # 5: pgbench -c
ENQ_GROUPS=${BENCH_ENQ_GROUPS:-1000}          # 5: group_id drawn from g1..gN
FOOT_SLOTS=${BENCH_FOOT_SLOTS:-64}            # 6a: busy slots for the RSS figure
FOOT_SLEEP=${BENCH_FOOT_SLEEP:-3}             # 6a: seconds each job sleeps (not shrunk:
                                              #    64 claims must fit in it on a busy machine)
N_STRACE=${BENCH_STRACE_JOBS:-$((2000 / div))} # 6d: jobs of the straced run
N_HELD=${BENCH_HELD:-$((20000 / div))}        # 7: groups held back by a retry
N_BO_JOBS=${BENCH_BO_JOBS:-$((100000 / div))}  # 7b: grouped jobs queued
N_BO_GROUPS=${BENCH_BO_GROUPS:-$((25000 / div))} # 7b: their groups (jobs enqueued group by group)
N_BO_HELD=${BENCH_BO_HELD:-$((20000 / div))}  # 7b: the first groups, their heads in a backoff
N_BO_STOP=${BENCH_BO_STOP:-$((5000 / div))}   # 7b: finished jobs measured
N_TICKS=${BENCH_TICKS:-8}                     # 9a, 9b: schedule ticks measured (1 a second)
N_CANCEL=${BENCH_CANCEL:-5}                   # 9c: jobs cancelled
WD_SECS=${BENCH_WD_SECS:-5}                   # 9d: seconds of watchdog pings
LIMIT_RATE=${BENCH_LIMIT_RATE:-50}            # 11b: the rate, starts a second
LIMIT_RATE_SECS=${BENCH_LIMIT_RATE_SECS:-$((60 / div))} # 11b: seconds of starts at that rate
N_LIMIT_JOBS=${BENCH_LIMIT_JOBS:-$((20000 / div))} # 11c: grouped jobs, over 1,000 groups
# BENCH_ONLY: a subset of "ceiling throughput burst pickup steps backlog enqueue footprint strace held lease
# timers scale limits idle", or limit_burst, limit_rate, limit_claim for a part of limits
# (default all), for working on one measurement; idle: 10e and 10f alone (scale includes them).
ONLY=${BENCH_ONLY:-}
STEP_TIMEOUT=${BENCH_STEP_TIMEOUT:-600}       # seconds any single run may take
OUT=${BENCH_OUT:-$repo/build/bench}           # results.json, table.txt, logs
BIN=${BENCH_BIN:-$repo/build/bench}           # spawnbench, pickup, stamp
NOTIFY_SINK=${NOTIFY_SINK:-$repo/build/tests/notify-sink} # 9d: systemd's notify socket
CLAIM_SQL=${CLAIM_SQL:-$repo/build/tests/claim-sql} # 11c: prints the daemon's claim statement

# Targets of the performance work, read by people next to the figures; never pass/fail criteria of
# the build. Each is "OP VALUE" with OP one of <= >=; empty: no target.
TGT_RATIO_CEILING=">= 0.8"   # ungrouped throughput / spawn ceiling
TGT_RATIO_GROUPED=">= 0.7"   # 100 groups throughput / spawn ceiling
TGT_BURST_TX=">= 0.5"        # the burst case, transaction mode: throughput / spawn ceiling
TGT_BURST_LEASE=">= 0.7"     # the burst case, lease mode
TGT_CPUBOUND=">= 0.9"        # throughput / what the machine's CPU allows (every core busy)
TGT_PGCPU_TX="<= 0.30"       # ms, PostgreSQL backends' CPU per job, transaction mode
TGT_PGCPU_LEASE="<= 0.12"    # ms, lease mode
TGT_DAEMON_CPU="<= 0.08"     # ms, the daemon's own CPU per job
TGT_PICKUP_P50="<= 5"        # ms, INSERT commit -> command start
TGT_PICKUP_P99="<= 20"       # ms
TGT_PICKUP_MAX=""            # ms (no target; shown)
TGT_BACKLOG_RATIO=">= 0.8"   # a million queued jobs cost at most 20% of the claim rate
TGT_ENQ_RATIO=">= 0.9"       # the shipped triggers cost at most 10% of enqueue throughput
TGT_RSS_DAEMON="<= 16"       # MiB with 64 busy slots
TGT_RSS_GUARD=""             # MiB (no target; shown)
TGT_CPU=""                   # daemon CPU seconds per 1,000 jobs (no target; shown)
TGT_STMTS=""                 # SQL statements per job (no target; shown)
TGT_WAL=""                   # bytes per job, right after a checkpoint (no target; shown)
TGT_TRIPS="<= 3"             # round trips to PostgreSQL per job on the hot path
TGT_HELD_RATIO="<= 2"        # a claim with 20,000 retry-held groups / the same claim without
TGT_BO_RATIO=">= 0.8"         # claim rate behind 20,000 backed-off heads / with none
TGT_LEASE_CEILING=">= 0.85"  # lock mode lease: throughput / spawn ceiling, ungrouped and grouped
TGT_LEASE_P50="<= 2"         # ms, lock mode lease: INSERT commit -> command start
TGT_LEASE_SESSIONS="<= 3"    # the daemon's sessions in lock mode lease
TGT_TICK_LATE="<= 1000"      # ms, a schedule's tick -> its job created, either lock mode
TGT_CANCEL="<= 1500"         # ms, pgjobd.cancel() -> the job's outcome
TGT_WD_GAP="<= 999"          # ms, longest gap between watchdog pings (WATCHDOG_USEC 1 s)
TGT_LIMIT_BURST=">= 0.9"     # a global concurrency limit equal to the slots / no limit
TGT_LIMIT_RATE=">= 0.98"     # a rate's starts a second / the rate (2 % under by design)
TGT_LIMIT_CLAIM="<= 1.2"     # claim server time with every limit set on 1,000 groups / none

# ---------------------------------------------------------------- harness

for tool in spawnbench pickup stamp; do
	[ -x "$BIN/$tool" ] || {
		echo "bench: $BIN/$tool missing (run make bench)" >&2
		exit 1
	}
done
# strace is optional (6d is skipped without it); ask for it like the tests ask for their
# packages. A failed install is not a harness failure.
command -v strace >/dev/null 2>&1 || bash "$repo/tests/deps.sh" strace >&2 || true

# lib.sh without TAP output; its trap stops the daemons and PostgreSQL and removes $T.
# shellcheck disable=SC2034 # read by lib.sh
PGJOBD_LIB_MODE=quiet
# The server's data on a disk, as in production (lib.sh would take a tmpfs, where a
# commit costs no flush): the figures depend on it ("disk:" in the table).
export PGJOBD_TEST_TMPDIR=${PGJOBD_TEST_TMPDIR:-/tmp}
. "$repo/tests/integration/lib.sh"
set +eu # lib.sh's helpers test exit statuses themselves and allow unset variables
require_pgjobd

# Default durability: lib.sh's pg_opts sets fsync=off for the tests. Only what the bench
# needs is set here (connections for 64 slots + pgbench, pg_stat_statements); everything
# else, fsync and synchronous_commit included, is PostgreSQL's default.
PGSS_LIB=
pg_opts() {
	echo "-c listen_addresses='' -c unix_socket_directories=$T/sock -c port=$PG_PORT" \
		"-c max_connections=$PG_MAX_CONN${PGSS_LIB:+ -c shared_preload_libraries=$PGSS_LIB}"
}
PG_MAX_CONN=300 # 10 raises it (scale_server)

BENCH_T0=$(now_ms)
PROBLEMS=()
mkdir -p "$OUT" || exit 1
rm -f "$OUT/results.json" "$OUT/table.txt" "$OUT/daemon-warnings.log" "$OUT/statements.txt"

log() { printf '%s %s\n' "$(date +%T)" "$*"; }
problem() {
	PROBLEMS+=("$*")
	log "PROBLEM: $*"
}
harness_fail() {
	echo "bench: harness failure: $*" >&2
	# Inside $(...) or <(...), exit would only leave the subshell: stop the bench itself
	# (its TERM trap runs lib.sh's cleanup).
	[ "${BASH_SUBSHELL:-0}" -gt 0 ] && kill -TERM $$
	exit 1
}
# sql STATEMENT: a statement the harness needs; its failure ends the bench.
sql() { psql_q "$1" || harness_fail "SQL failed: $1"; }

# calc EXPR: awk arithmetic, printed with 6 decimals; empty when EXPR divides by zero or
# has an empty operand (so that fig reports a problem rather than a wrong number).
calc() {
	awk "BEGIN { x = ($1); printf \"%.6f\", x }" 2>/dev/null
}
# ratio A B: A/B, empty if either is empty or B is 0.
ratio() {
	[ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 != 0) printf "%.6f", a / b }'
}

# Figures: $W/defs holds one definition per figure in table order, $W/figs one line
# "KEY REP VALUE" per measured value.
W=
def() { # KEY LABEL UNIT DECIMALS TARGET
	printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$W/defs"
}
section() { printf 'section\t%s\t\t\t\n' "$1" >>"$W/defs"; }
REP=0
fig() { # KEY VALUE
	if [[ $2 =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then
		printf '%s\t%s\t%s\n' "$1" "$REP" "$2" >>"$W/figs"
		log "    $1 = $2"
	else
		problem "rep $REP: $1 not measured${2:+ (got '$2')}"
	fi
}

# void_target KEY REASON: every figure KEY.* of this repetition is suspect (e.g. pickups
# that never happened): the table and the JSON mark their targets as not met, whatever
# the medians say.
void_target() {
	printf '%s\t%s\t%s\n' "$1" "$REP" "$2" >>"$W/void"
}

# ---------------------------------------------------------------- daemon helpers

DAEMON=
# slot_sessions [STATE]: the daemon's sessions (slots, the queue's claimer and the
# listener), in STATE if given. The maintenance and fence sessions (once a second each,
# whatever the load) are left out.
slot_sessions() {
	psql_q "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgjobd %' AND application_name NOT IN ('pgjobd maintenance', 'pgjobd fence')${1:+ AND state = '$1'}"
}
# daemon_up NAME CONF: start the daemon; DAEMON is its pid.
daemon_up() {
	start_daemon "$1" "$2"
	DAEMON=$DAEMON_PID
	CUR_LOG=$T/$1.log
}
# daemon_idle SLOTS: wait until the listener, the claimer and SLOTS slot sessions are connected and idle
# (the startup claims have returned), i.e. the daemon waits for a NOTIFY.
daemon_idle() {
	wait_until 30 "[ \"\$(slot_sessions idle)\" = $(($1 + 2)) ] || ! pid_alive $DAEMON" &&
		pid_alive "$DAEMON" && return 0
	problem "rep $REP: daemon ${CUR_LOG##*/} did not become idle with $1 slots"
	return 1
}
# daemon_down: SIGTERM and wait (SIGKILL after 60 s); keep its warnings.
daemon_down() {
	[ -n "$DAEMON" ] || return 0
	stop_daemon "$DAEMON" 60
	local s=$?
	[ $s = 0 ] || problem "rep $REP: daemon ${CUR_LOG##*/} exited with status $s"
	# log_level = warn: anything in the log is a warning or an error, but for the
	# startup warnings that commands run as the daemon's user (the bench runs them so)
	# and that schedules use a test clock (9a, 9b).
	local warned
	warned=$(grep -v 'msg="commands run as the daemon.s own user\|msg="schedules use a test clock"' "$CUR_LOG" 2>/dev/null)
	if [ -n "$warned" ]; then
		{
			echo "== ${CUR_LOG##*/}"
			echo "$warned"
		} >>"$OUT/daemon-warnings.log"
		problem "rep $REP: daemon ${CUR_LOG##*/} logged $(wc -l <<<"$warned") warning/error lines (${OUT#"$repo"/}/daemon-warnings.log)"
	fi
	DAEMON=
}
# poll_until SECONDS 'condition': like lib.sh's wait_until, but every 0.5 s. Each check is
# a psql process and a connection; 20 of them a second (wait_until's pace) would take a
# noticeable share of a 2-core machine away from the run being measured. Figures come
# from the table's timestamps, so checking late only stops a run a little later.
poll_until() {
	local deadline=$(($(now_ms) + $1 * 1000))
	while ! eval "$2"; do
		[ "$(now_ms)" -ge "$deadline" ] && return 1
		sleep 0.5
	done
}
# sample_waits FILE: append what the daemon's active sessions are waiting for now, one
# line per session: "wait_event_type:wait_event statement" ("CPU" when not waiting).
sample_waits() {
	psql_q "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') || ' ' ||
		left(regexp_replace(query, '\s+', ' ', 'g'), 60)
		FROM pg_stat_activity WHERE application_name LIKE 'pgjobd %' AND state = 'active'" >>"$1"
}
# waits_dump TITLE FILE: sample_waits' samples in FILE, most frequent first, for the
# record (statements.txt).
waits_dump() {
	[ -s "$2" ] || return 0
	{
		echo "== $1: the daemon's active sessions, sampled every 0.5 s (wait event, statement)"
		sort "$2" | uniq -c | sort -rn | head -n 15
		echo
	} >>"$OUT/statements.txt"
}
# wait_drained QUEUE [SAMPLES]: until QUEUE has nothing left (0), the daemon died or
# STEP_TIMEOUT (1). With SAMPLES, each check also appends sample_waits to that file.
wait_drained() {
	poll_until "$STEP_TIMEOUT" "${2:+sample_waits $2; }[ \"\$(unfinished $1)\" = f ] || ! pid_alive $DAEMON"
	[ "$(unfinished "$1")" = f ] && return 0
	pid_alive "$DAEMON" || problem "rep $REP: daemon ${CUR_LOG##*/} died"
	pid_alive "$DAEMON" && problem "rep $REP: queue $1 not drained after ${STEP_TIMEOUT}s"
	return 1
}
# cpu_s PID [children]: user + system CPU seconds of PID itself (utime + stime), or with
# `children`, of the children it has waited for (cutime + cstime).
cpu_s() {
	local line which=${2:-self}
	IFS= read -r line <"/proc/$1/stat" || return 1
	line=${line##*) } # fields from 3 on; comm (field 2) may contain spaces
	# shellcheck disable=SC2086
	set -- $line
	if [ "$which" = children ]; then
		calc "(${14} + ${15}) / $CLK_TCK"
	else
		calc "(${12} + ${13}) / $CLK_TCK"
	fi
}
# machine_cpu: "BUSY TOTAL" jiffies of every core since boot (/proc/stat): the CPU the
# whole machine spent (PostgreSQL, the daemon, its commands, everything else) and its
# time. Two readings give the busy share of a run and the machine's CPU per job.
machine_cpu() {
	local _cpu us ni sy id wa hi si st
	read -r _cpu us ni sy id wa hi si st _ </proc/stat || return 1
	echo "$((us + ni + sy + hi + si + st)) $((us + ni + sy + id + wa + hi + si + st))"
}
# machine_figs KEY N "BUSY0 TOTAL0": figures mcpu.KEY (the machine's CPU per unit of N,
# ms) and busy.KEY (share of all cores busy) since that reading.
machine_figs() {
	local b0 t0 b1 t1
	read -r b0 t0 <<<"$3"
	read -r b1 t1 < <(machine_cpu)
	[ -n "$b0" ] && [ -n "$b1" ] && [ "$t1" -gt "$t0" ] || return 0
	fig "mcpu.$1" "$(calc "($b1 - $b0) * 1000 / $CLK_TCK / $2")"
	fig "busy.$1" "$(calc "($b1 - $b0) / ($t1 - $t0)")"
}
# hwm_mib PID: peak resident set size (VmHWM) in MiB.
hwm_mib() {
	awk '/^VmHWM:/ { printf "%.3f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null
}
# guard_of PID: the daemon's guard (src/guard.c): its child that still runs the pgjobd
# image (forked, never exec'd) and leads a session of its own (setsid). Commands get
# process groups of their own in the daemon's session, so a command caught between its
# fork and exec is not mistaken for it.
guard_of() {
	local c
	for c in $(pgrep -P "$1" -x pgjobd); do
		[ "$(awk '{ sub(/.*\) /, ""); print $4 }' "/proc/$c/stat" 2>/dev/null)" = "$c" ] && echo "$c"
	done
}

reset_tables() { sql "TRUNCATE pgjobd.jobs, pgjobd.groups" >/dev/null; }
# fill QUEUE N GROUPS: N jobs in one INSERT ... SELECT (GROUPS 0: ungrouped), then VACUUM
# ANALYZE (the visibility map and statistics an autovacuum would leave), then a
# CHECKPOINT, so that each run starts from the same WAL position relative to a checkpoint
# (WAL per job then includes the full-page images of every page the run touches first).
fill() {
	local g=NULL t0
	t0=$(now_ms)
	[ "$3" -gt 0 ] && g="'g' || (i % $3)"
	sql "INSERT INTO pgjobd.jobs (queue, group_id) SELECT '$1', $g FROM generate_series(1, $2) i"
	sql "VACUUM ANALYZE pgjobd.jobs"
	sql "VACUUM ANALYZE pgjobd.groups"
	sql "CHECKPOINT"
	[ "$2" -ge 100000 ] && log "    (filled $2 jobs in $((($(now_ms) - t0) / 1000)) s)"
	return 0
}

# The daemon connects as `postgres` (DB_CONNINFO); the bench's own psql and pgbench
# sessions as `bench`, so that pg_stat_statements can tell them apart by userid.
stats_reset() { [ -n "$PGSS_LIB" ] && sql "SELECT pg_stat_statements_reset()" >/dev/null; }
# stats_calls [LIKE]: statements the daemon ran since stats_reset (top-level statements,
# BEGIN/COMMIT included: pg_stat_statements.track_utility is on by default).
stats_calls() {
	[ -n "$PGSS_LIB" ] || return 0
	psql_q "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
		WHERE userid = 'postgres'::regrole AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		${1:+AND query LIKE '$1'}"
}
stats_dump() { # TITLE JOBS: per-statement calls per job, for the record
	[ -n "$PGSS_LIB" ] || return 0
	{
		echo "== $1 (calls per job, $2 jobs)"
		psql -X -q -P pager=off -c "SELECT round(calls::numeric / $2, 3) AS per_job, calls,
			round(total_exec_time::numeric / $2, 3) AS ms_per_job, left(regexp_replace(query, '\s+', ' ', 'g'), 100) AS query
			FROM pg_stat_statements WHERE userid = 'postgres'::regrole
			AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			ORDER BY calls DESC, query"
	} >>"$OUT/statements.txt"
}

# ---------------------------------------------------------------- 1. ceiling

bench_ceiling() {
	local out m0
	m0=$(machine_cpu)
	out=$("$BIN/spawnbench" -n "$N_SPAWNS" -j "$CONCURRENCY" -c true) ||
		{ problem "rep $REP: spawnbench failed"; return; }
	fig ceiling "$(sed -n 's/.* rate=\([0-9.]*\).*/\1/p' <<<"$out")"
	machine_figs ceiling "$N_SPAWNS" "$m0"
}

# ---------------------------------------------------------------- 2. throughput (+ 6b, 6c)

# bench_throughput VARIANT [lease]: with `lease`, the queue is of lock mode lease (figure
# 8) and its figures are keyed lease.*; the daemon's sessions are counted then too.
bench_throughput() { # ungrouped|grouped [lease]
	local v=$1 mode=${2:-} groups=0 lsn0 cpu wal calls n secs pm pg0 pg1 cmdcpu conf key sess m0
	[ "$v" = grouped ] && groups=$N_GROUPS
	conf=$W/tput.ini key=$v
	[ "$mode" = lease ] && conf=$W/tput-lease.ini key=lease.$v
	reset_tables
	fill tput "$N_JOBS" "$groups"
	stats_reset
	# pg_current_wal_insert_lsn, not pg_current_wal_lsn: the latter is where WAL has
	# been written out to, and lags the records already inserted by up to wal_buffers.
	lsn0=$(sql "SELECT pg_current_wal_insert_lsn()")
	# Where the CPU goes, beside the daemon's own: its commands (the children it reaped)
	# and PostgreSQL (the backends the postmaster reaped during the run: the daemon's
	# sessions, and also the bench's own short polling sessions and any autovacuum
	# worker, a small share).
	pm=$(head -n 1 "$T/pg/postmaster.pid")
	pg0=$(cpu_s "$pm" children)
	m0=$(machine_cpu)
	daemon_up "tput-$key-$REP" "$conf"
	if [ "$mode" = lease ]; then
		sleep 1
		sess=$(psql_q "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgjobd %'")
	fi
	if wait_drained tput "$W/waits.$key.$REP"; then
		[ "$mode" = lease ] && machine_figs "$key" "$N_JOBS" "$m0"
		cpu=$(cpu_s "$DAEMON")
		cmdcpu=$(cpu_s "$DAEMON" children)
		wal=$(sql "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$lsn0')")
		calls=$(stats_calls)
	fi
	daemon_down
	# The daemon's sessions (user postgres) have ended once the postmaster reaped them.
	wait_until 10 "! pgrep -P $pm -f 'postgres: postgres pgjobd_test' >/dev/null"
	pg1=$(cpu_s "$pm" children)
	IFS='|' read -r n secs < <(sql "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))
		FROM pgjobd.jobs WHERE queue = 'tput' AND status = 'succeeded'")
	if [ "$n" != "$N_JOBS" ]; then
		# A partial run's figures would look plausible and be wrong: none are kept.
		problem "rep $REP: throughput $v: $n of $N_JOBS jobs succeeded; no figures from this run"
		return
	fi
	fig "tput.$key" "$(ratio "$n" "$secs")"
	[ -n "$sess" ] && fig "sessions.$key" "$sess"
	if [ "$mode" = lease ]; then
		[ -n "$cpu" ] && fig "cpu.$key" "$(calc "$cpu * 1000 / $n")"
		[ -n "$pg0" ] && [ -n "$pg1" ] && fig "pgcpu.$key" "$(calc "($pg1 - $pg0) * 1000 / $n")"
		[ -n "$wal" ] && fig "wal.$key" "$(ratio "$wal" "$n")"
		[ -n "$PGSS_LIB" ] && [ -n "$calls" ] && fig "stmts.$key" "$(ratio "$calls" "$n")"
		return
	fi
	[ -n "$cpu" ] && fig "cpu.$v" "$(calc "$cpu * 1000 / $n")"
	[ -n "$cmdcpu" ] && fig "cmdcpu.$v" "$(calc "$cmdcpu * 1000 / $n")"
	[ -n "$pg0" ] && [ -n "$pg1" ] && fig "pgcpu.$v" "$(calc "($pg1 - $pg0) * 1000 / $n")"
	[ -n "$wal" ] && fig "wal.$v" "$(ratio "$wal" "$n")"
	if [ -n "$PGSS_LIB" ] && [ -n "$calls" ]; then
		fig "stmts.$v" "$(ratio "$calls" "$n")"
		[ "$REP" = 1 ] && stats_dump "throughput $v" "$n"
	fi
	[ "$REP" = 1 ] && waits_dump "throughput $v" "$W/waits.$v.$REP"
	return 0
}

# ---------------------------------------------------------------- 2c. the burst case

# bench_burst VARIANT MODE: what users send. The daemon is already running and waiting
# when N_JOBS jobs arrive in one INSERT ... SELECT, with no VACUUM, ANALYZE or CHECKPOINT
# in between (autovacuum may run during the drain, as it would). The rate is counted from
# the INSERT's commit to the last outcome. Keyed burst.MODE.VARIANT (MODE tx or lease).
bench_burst() { # ungrouped|grouped tx|lease
	local v=$1 mode=$2 groups=0 g=NULL key conf t0 cpu0 cpu1 pm pg0 pg1 m0 n secs calls
	[ "$v" = grouped ] && groups=$N_GROUPS && g="'g' || (i % $N_GROUPS)"
	key=burst.$mode.$v conf=$W/tput.ini
	[ "$mode" = lease ] && conf=$W/tput-lease.ini
	reset_tables
	sql "TRUNCATE pgjobd.waiting" >/dev/null
	daemon_up "burst-$mode-$v-$REP" "$conf"
	if ! wait_until 30 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'tput'\")\" = 1 ] || ! pid_alive $DAEMON" ||
		! pid_alive "$DAEMON"; then
		problem "rep $REP: burst $mode $v: the daemon never waited for work"
		daemon_down
		return
	fi
	stats_reset
	pm=$(head -n 1 "$T/pg/postmaster.pid")
	pg0=$(cpu_s "$pm" children)
	cpu0=$(cpu_s "$DAEMON")
	m0=$(machine_cpu)
	t0=$(sql "INSERT INTO pgjobd.jobs (queue, group_id) SELECT 'tput', $g FROM generate_series(1, $N_JOBS) i;
		SELECT extract(epoch FROM clock_timestamp())")
	if wait_drained tput "$W/waits.$key.$REP"; then
		machine_figs "$key" "$N_JOBS" "$m0"
		cpu1=$(cpu_s "$DAEMON")
		calls=$(stats_calls)
	fi
	daemon_down
	wait_until 10 "! pgrep -P $pm -f 'postgres: postgres pgjobd_test' >/dev/null"
	pg1=$(cpu_s "$pm" children)
	IFS='|' read -r n secs < <(sql "SELECT count(*), max(extract(epoch FROM finished_at)) - $t0
		FROM pgjobd.jobs WHERE queue = 'tput' AND status = 'succeeded'")
	if [ "$n" != "$N_JOBS" ]; then
		problem "rep $REP: burst $mode $v: $n of $N_JOBS jobs succeeded; no figures from this run"
		return
	fi
	fig "tput.$key" "$(ratio "$n" "$secs")"
	[ -n "$cpu1" ] && fig "cpu.$key" "$(calc "($cpu1 - $cpu0) * 1000 / $n")"
	[ -n "$pg0" ] && [ -n "$pg1" ] && fig "pgcpu.$key" "$(calc "($pg1 - $pg0) * 1000 / $n")"
	[ -n "$PGSS_LIB" ] && [ -n "$calls" ] && fig "stmts.$key" "$(ratio "$calls" "$n")"
	if [ "$REP" = 1 ]; then
		stats_dump "burst $mode $v" "$n"
		waits_dump "burst $mode $v" "$W/waits.$key.$REP"
	fi
	return 0
}

# ---------------------------------------------------------------- 3. pickup latency

# The steps bench_pickup and bench_floor share. pickup_reset: empty tables, no waiting
# row left over, a checkpoint before the run. pickup_waiting: until whoever serves queue
# pickup waits for a wake-up (its row in pgjobd.waiting). pickup_insert INS: the INSERTs,
# their return times into INS. pickup_started LABEL STAMPS: until every job's command has
# stamped its start into STAMPS (at most 30 s).
pickup_reset() {
	reset_tables
	sql "TRUNCATE pgjobd.waiting" >/dev/null
	sql "CHECKPOINT" >/dev/null
}
pickup_waiting() {
	wait_until 30 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'pickup'\")\" = 1 ]"
}
pickup_insert() {
	"$BIN/pickup" insert "$DB_CONNINFO" pickup "$N_PICKUP" "$PICKUP_MIN_MS" "$PICKUP_MAX_MS" "$1" && return 0
	problem "rep $REP: pickup client failed"
	return 1
}
pickup_started() {
	wait_until 30 "[ -f $2 ] && [ \$(wc -l <$2) -ge $N_PICKUP ]" ||
		problem "rep $REP: $1: only $(wc -l <"$2" 2>/dev/null || echo 0) of $N_PICKUP jobs started within 30 s"
}

# bench_pickup [lease]: with `lease`, the queue is of lock mode lease (figure 8), keyed
# lease.pickup.*.
bench_pickup() {
	local mode=${1:-} key=pickup
	[ "$mode" = lease ] && key=lease.pickup
	local ins=$T/$key-ins.$REP stamps=$T/$key-stamps.$REP lat=$T/$key-lat.$REP claims
	pickup_reset
	# exec: the shell becomes the stamp program, which reads the clock first thing.
	cat >"$W/$key.ini" <<EOF
$(conf_header log_level=warn poll_interval=30s)

[queue.pickup]
command = exec $BIN/stamp stamp $stamps
concurrency = $CONCURRENCY
lock_mode = ${mode:-transaction}
EOF
	daemon_up "$key-$REP" "$W/$key.ini"
	if [ "$mode" = lease ]; then
		# idle: its claim returned with slots left, so it waits in pgjobd.waiting
		if ! pickup_waiting; then
			problem "rep $REP: lease pickup: the daemon did not become idle"
			daemon_down
			return
		fi
	elif ! daemon_idle "$CONCURRENCY"; then
		daemon_down
		return
	fi
	stats_reset
	if ! pickup_insert "$ins"; then
		daemon_down
		return
	fi
	pickup_started pickup "$stamps"
	# The daemon's claim statement names claim_batch (its full path calls it).
	claims=$(stats_calls '%pgjobd.claim_batch(%')
	pickup_server
	daemon_down
	pickup_figs "$key" "$ins" "$stamps" "$lat" || return
	[ -n "$claims" ] && fig $key.claims "$(ratio "$claims" "$(wc -l <"$lat")")"
	pickup_server_figs "$key" "$(wc -l <"$lat")"
}

# The pickup at the server: what the daemon's statements cost PostgreSQL during
# bench_pickup's run (pg_stat_statements, reset before the first INSERT; the executor's
# time, neither planning, once per session, nor the commits' WAL flushes). pickup_server:
# once the last outcome is written (the queue drained), the daemon's statements by step
# into $W/pickup-srv: "STEP CALLS TOTAL_MS". The steps: claim (the claim statement),
# hold (lock mode transaction: the slot's lock statements, the group row's for a grouped
# job and the job row's; older daemons sent a stand-in for an ungrouped job's), outcome (the outcome's UPDATE; finish_leases in lock mode
# lease), other (BEGIN, COMMIT, the lease extension, the heartbeat, maintenance). The
# INSERTs of build/bench/pickup, which connects as the daemon's user, are left out.
PICKUP_INSERT='INSERT INTO pgjobd.jobs (queue) VALUES'
# pickup_server_figs KEY JOBS: figures KEY.srv.STEP (ms per job) and KEY.stmts.
pickup_server() {
	: >"$W/pickup-srv"
	[ -n "$PGSS_LIB" ] || return 0
	wait_until 30 "[ \"\$(unfinished pickup)\" = f ]" ||
		problem "rep $REP: pickup: jobs still unfinished 30 s after the last start"
	psql_q "SELECT s.step, sum(s.calls), round(sum(s.total_exec_time)::numeric, 4)
		FROM (SELECT CASE WHEN query LIKE '%pgjobd.claim_batch(%' THEN 'claim'
		                  WHEN query LIKE '%FROM pgjobd.groups WHERE id = \$1::bigint FOR UPDATE'
		                    OR query LIKE 'SELECT \$_ WHERE \$_'
		                    OR query LIKE '%FROM pgjobd.jobs j WHERE j.id = \$1::bigint%FOR UPDATE OF j' THEN 'hold'
		                  WHEN query LIKE 'UPDATE pgjobd.jobs SET status = \$2,%'
		                    OR query LIKE '%pgjobd.finish_leases(%' THEN 'outcome'
		                  ELSE 'other' END AS step, calls, total_exec_time
		        FROM pg_stat_statements WHERE userid = 'postgres'::regrole
		         AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		         AND query NOT LIKE '$PICKUP_INSERT%') s
		GROUP BY s.step" | tr '|' ' ' >"$W/pickup-srv"
	[ "$REP" = 1 ] && {
		echo "== pickup ($key): the daemon's statements, $N_PICKUP INSERTs"
		psql -X -q -P pager=off -c "SELECT calls, round(mean_exec_time::numeric, 4) AS mean_ms,
			round(total_exec_time::numeric, 3) AS total_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS query
			FROM pg_stat_statements WHERE userid = 'postgres'::regrole
			AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND query NOT LIKE '$PICKUP_INSERT%'
			ORDER BY total_exec_time DESC, query"
	} >>"$OUT/statements.txt"
	return 0
}
pickup_server_figs() {
	local step calls ms all_calls=0 all_ms=0
	[ -s "$W/pickup-srv" ] && [ "$2" -gt 0 ] || return 0
	while read -r step calls ms; do
		all_calls=$((all_calls + calls))
		all_ms=$(calc "$all_ms + $ms")
		[ "$step" = other ] && continue
		[ "$step" = hold ] && [ "$1" = lease.pickup ] && continue
		fig "$1.srv.$step" "$(calc "$ms / $2")"
	done <"$W/pickup-srv"
	fig "$1.srv.all" "$(calc "$all_ms / $2")"
	fig "$1.stmts" "$(ratio "$all_calls" "$2")"
}

# bench_pickup_trace [lease]: the daemon's part of a pickup seen from outside (figures 3t,
# 8t): N_PTRACE INSERTs as in bench_pickup to an idle daemon under strace (its own
# process only, not -f: the commands are not traced), -ttt -T for each call's start and
# duration. The daemon's spawn is a clone that shares its memory and suspends it until
# the new process has exec'd (src/exec.c), so the clone's return is the execve of
# /bin/sh. Per pickup, from the trace, in order:
#   the listener's read of the NOTIFY (a recvfrom whose data starts with a
#   NotificationResponse, 'A'),
#   the claim's send: the last send, after that read, on the socket of
#   the claim's answer: the next read of a row description of 13 columns, the first
#   named slot (claim_batch's columns; "\rslot\0" in strace's quoting),
#   the next clone (in lock mode transaction after the slot's hold, a round trip of its
#   own) and its return.
# Sends of other sessions between (a heartbeat) are not mistaken for the claim.
# Figures KEY.trace.STEP: the p50 of each step in ms, and KEY.trace.n, the pickups found
# whole. strace stops the daemon at every call it traces and at every other one (no
# seccomp filter can be installed in a process it attaches to): each step is longer
# than without it, by tens of microseconds a call.
bench_pickup_trace() {
	local mode=${1:-} key=pickup spid out steps
	[ "$mode" = lease ] && key=lease.pickup
	command -v strace >/dev/null 2>&1 || {
		[ "$REP" = 1 ] && problem "strace not installed: $key.trace skipped"
		return
	}
	local stamps=$T/$key-trace-stamps.$REP
	pickup_reset
	cat >"$W/$key-trace.ini" <<EOF
$(conf_header log_level=warn poll_interval=30s)

[queue.pickup]
command = exec $BIN/stamp stamp $stamps
concurrency = $CONCURRENCY
lock_mode = ${mode:-transaction}
EOF
	daemon_up "$key-trace-$REP" "$W/$key-trace.ini"
	if [ "$mode" = lease ]; then
		if ! pickup_waiting; then
			problem "rep $REP: $key trace: the daemon did not become idle"
			daemon_down
			return
		fi
	elif ! daemon_idle "$CONCURRENCY"; then
		daemon_down
		return
	fi
	out=$T/$key-trace.$REP
	# shellcheck disable=SC2046 # one -p per task: word splitting wanted
	strace -qq -ttt -T -yy -s 32 -e trace=recvfrom,sendto,clone,clone3 -o "$out" \
		$(printf -- '-p %s ' $(ls "/proc/$DAEMON/task")) 2>"$T/$key-trace-err.$REP" &
	spid=$!
	echo "$spid" >"$T/$key-trace-strace.pid" # killed by lib.sh's cleanup if we die first
	if ! wait_until 10 "awk '/^TracerPid:/ { exit \$2 == 0 }' /proc/$DAEMON/status"; then
		problem "rep $REP: $key trace: strace could not attach ($(head -c 200 "$T/$key-trace-err.$REP"))"
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		daemon_down
		return
	fi
	"$BIN/pickup" insert "$DB_CONNINFO" pickup "$N_PTRACE" "$PICKUP_MIN_MS" "$PICKUP_MAX_MS" "$T/$key-trace-ins.$REP" ||
		problem "rep $REP: $key trace: pickup client failed"
	wait_until 30 "[ -f $stamps ] && [ \$(wc -l <$stamps) -ge $N_PTRACE ]" ||
		problem "rep $REP: $key trace: only $(wc -l <"$stamps" 2>/dev/null || echo 0) of $N_PTRACE jobs started within 30 s"
	kill -INT "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	daemon_down
	# One line per pickup found whole: the four steps in ms.
	steps=$T/$key-trace-steps.$REP
	awk '
		function fdof(l,    f) { f = l; sub(/^[0-9.]+ [a-z0-9]+\(/, "", f); sub(/<.*/, "", f); return f }
		function ret(l,    r) { r = l; sub(/.*\) = /, "", r); sub(/ .*/, "", r); return r + 0 }
		function dur(l,    d) { d = l; sub(/.*</, "", d); sub(/>$/, "", d); return d + 0 }
		{ t = $1 + 0 }
		/ recvfrom\(/ && / = [1-9]/ && $0 ~ /, "A\\0\\0\\0/ { t0 = t; t2 = 0; delete sent; next }
		!t0 { next }
		/ sendto\(/ { sent[fdof($0)] = t; next }
		/ recvfrom\(/ && !t2 && ret($0) > 0 && $0 ~ /\\rslot\\0/ && (fdof($0) in sent) { t1 = sent[fdof($0)]; t2 = t; next }
		/ clone3?\(/ && t2 {
			printf "%.3f %.3f %.3f %.3f %.3f\n", (t1 - t0) * 1000, (t2 - t1) * 1000, (t - t2) * 1000,
				dur($0) * 1000, (t + dur($0) - t0) * 1000
			t0 = 0
		}' "$out" >"$steps"
	fig "$key.trace.n" "$(wc -l <"$steps")"
	[ -s "$steps" ] || {
		problem "rep $REP: $key trace: no pickup found whole in the trace"
		return
	}
	local i name
	i=0
	for name in notify_claim claim_answer answer_clone clone_exec total; do
		i=$((i + 1))
		fig "$key.trace.$name" "$(awk -v c=$i '{ print $c }' "$steps" | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')"
	done
}

# bench_pickup_steps tx|lease: 3's INSERTs again, the daemon at log_level = debug, which
# logs each job's pickup step by step (msg="pickup", src/job.c): the NOTIFY read -> the
# claim sent -> its answer read -> the hold's answer -> the command exec'd. The p50 of
# each step, and of INSERT return -> command start in this run (debug logging costs a
# little: compare with 3 and 8c, not with the targets).
bench_pickup_steps() {
	local mode=$1 key=steps.$1 lm=transaction ins stamps lat f v
	[ "$mode" = lease ] && lm=lease
	ins=$T/$key-ins.$REP stamps=$T/$key-stamps.$REP lat=$T/$key-lat.$REP
	pickup_reset
	cat >"$W/$key.ini" <<EOF
$(conf_header log_level=debug poll_interval=30s)

[queue.pickup]
command = exec $BIN/stamp stamp $stamps
concurrency = $CONCURRENCY
lock_mode = $lm
EOF
	daemon_up "$key-$REP" "$W/$key.ini"
	if ! pickup_waiting; then
		problem "rep $REP: pickup steps $mode: the daemon did not become idle"
		daemon_down
		return
	fi
	if ! pickup_insert "$ins"; then
		daemon_down
		return
	fi
	pickup_started "pickup steps $mode" "$stamps"
	# At log_level = debug every line would count as a warning in daemon_down: stop
	# the daemon here instead.
	stop_daemon "$DAEMON" 60 || problem "rep $REP: pickup steps $mode: the daemon exited with status $?"
	DAEMON=
	awk 'NR == FNR { t[$1] = $2; next } ($1 in t) && !seen[$1]++ { printf "%.3f\n", ($2 - t[$1]) / 1e6 }' \
		"$ins" "$stamps" 2>/dev/null | sort -n >"$lat"
	v=$(percentile 0.5 "$lat")
	[ -n "$v" ] && fig "$key.total" "$v"
	for f in notify claim hold spawn; do
		grep 'msg="pickup"' "$CUR_LOG" | sed -n "s/.* ${f}_ms=\([0-9.]*\) .*/\1/p" | sort -n >"$T/$key.$f"
		v=$(percentile 0.5 "$T/$key.$f")
		[ -n "$v" ] && fig "$key.$f" "$v"
	done
	return 0
}

# pickup_figs KEY INS STAMPS LAT: the latencies (command start - INSERT return, in ms,
# joined by id) into LAT, sorted, and figures KEY.missing, .p50, .p99, .max. Nanosecond
# timestamps lose precision in awk's doubles (steps of 256 ns): irrelevant here.
# KEY.missing is how many of the $N_PICKUP INSERTs did not reach a command within the
# 30 s pickup_started waits (an INSERT that failed counts too). The percentiles are over
# all $N_PICKUP, a missing pickup counting as longer than any measured: a percentile
# whose rank falls on one is not measured (more than 30 s), never taken over the
# measured ones only, which would look better the more were lost; the max is not
# measured then. Any missing pickup makes every target of KEY not met (void_target).
pickup_figs() {
	local got missing p v
	awk 'NR == FNR { t[$1] = $2; next } ($1 in t) && !seen[$1]++ { printf "%.3f\n", ($2 - t[$1]) / 1e6 }' \
		"$2" "$3" 2>/dev/null | sort -n >"$4"
	got=$(wc -l <"$4")
	missing=$((N_PICKUP > got ? N_PICKUP - got : 0))
	fig "$1.missing" "$missing"
	if [ "$missing" -gt 0 ]; then
		problem "rep $REP: $1: $missing of $N_PICKUP INSERTs never reached a command within 30 s (counted as slower than any measured; targets of $1 not met)"
		void_target "$1" "$missing of $N_PICKUP pickups missing"
	fi
	[ "$got" -gt 0 ] || {
		problem "rep $REP: $1: no latencies"
		return 1
	}
	for p in 50 99; do
		v=$(percentile "0.$p" "$4" "$N_PICKUP")
		if [ -n "$v" ]; then
			fig "$1.p$p" "$v"
		else
			problem "rep $REP: $1.p$p not measured (its rank falls on a missing pickup: more than 30 s)"
		fi
	done
	if [ "$missing" -gt 0 ]; then
		problem "rep $REP: $1.max not measured (more than 30 s: $missing pickups missing)"
	else
		fig "$1.max" "$(tail -n 1 "$4")"
	fi
}

# bench_floor: pickup latency with no daemon, the least it can be on this machine (figure
# 8d): `pickup floor` waits for the same wake-up, marks the job running in one durable
# autocommitted UPDATE and starts the same command with posix_spawn. What lock mode lease
# adds to it (8c - 8d) is the daemon's claim (its checks and its lease) and
# its start of the command (slot, lease, supervisor, cgroup, output pipes).
bench_floor() {
	local key=lease.floor ins=$T/floor-ins.$REP stamps=$T/floor-stamps.$REP lat=$T/floor-lat.$REP
	pickup_reset
	"$BIN/pickup" floor "$DB_CONNINFO" pickup "$N_PICKUP" "exec $BIN/stamp stamp $stamps" \
		>>"$T/floor.log" 2>&1 &
	local fpid=$!
	if ! pickup_waiting; then
		problem "rep $REP: pickup floor did not start waiting (see $T/floor.log)"
		kill "$fpid" 2>/dev/null
		wait "$fpid" 2>/dev/null
		return
	fi
	pickup_insert "$ins"
	pickup_started "pickup floor" "$stamps"
	kill "$fpid" 2>/dev/null
	wait "$fpid" 2>/dev/null
	pickup_figs "$key" "$ins" "$stamps" "$lat"
}

# percentile P FILE [N]: nearest-rank percentile (0 < P <= 1) of the sorted numbers in
# FILE, of a sample of N (default: FILE's lines) whose values missing from FILE are larger
# than any in it: nothing (not measured) when the rank falls on one of them.
percentile() {
	awk -v p="$1" -v n="${3:-0}" '{ a[NR] = $1 } END { if (n < NR) n = NR; i = int(p * n); if (i < p * n) i++; if (i < 1) i = 1; if (i <= NR) print a[i] }' "$2"
}

# ---------------------------------------------------------------- 9. timers

# What the integration tests check only with bounds a busy machine cannot break (a tick
# on its timer, a cancel before its kill_grace, watchdog pings never twice WATCHDOG_USEC
# apart) is measured here.
#
# bench_tick [lease]: how late a schedule's tick enqueues its job (figure 9a; 9b with
# lock mode lease, where the scheduler runs on the lease session). The daemon's clock
# runs 60 times as fast (PGJOBD_TEST_CLOCK: a minute per second), so a minutely schedule
# ticks every second; a tick's real time is REAL0 + (scheduled_for - FAKE0) / 60, and its
# lateness created_at minus that. poll_interval = 1h: only the scheduler's timer acts.
bench_tick() {
	local mode=${1:-} key=tick late real0 fake0
	[ "$mode" = lease ] && key=lease.tick
	late=$T/$key-late.$REP
	reset_tables
	sql "DELETE FROM pgjobd.schedules" >/dev/null
	cat >"$W/$key.ini" <<EOF
$(conf_header log_level=warn poll_interval=1h)

[queue.tick]
command = true
concurrency = 4
lock_mode = ${mode:-transaction}
EOF
	real0=$(date +%s.%N)
	fake0=$(date -u -d 2031-06-01T00:00:00Z +%s)
	start_daemon "$key-$REP" "$W/$key.ini" PGJOBD_TEST_CLOCK="$real0 $fake0 60"
	DAEMON=$DAEMON_PID
	CUR_LOG=$T/$key-$REP.log
	sql "SELECT pgjobd.schedule('bench', '* * * * *', 'tick', missed => 'all')" >/dev/null
	wait_until $((N_TICKS + 10)) "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.jobs WHERE schedule = 'bench'\")\" -ge $((N_TICKS + 1)) ]" ||
		problem "rep $REP: $key: fewer than $((N_TICKS + 1)) ticks in $((N_TICKS + 10)) s"
	daemon_down
	sql "SELECT pgjobd.unschedule('bench')" >/dev/null
	# The first tick is left out: the scheduler may read the new schedule after it.
	psql_q "SELECT round((extract(epoch FROM created_at)
		- ($real0 + (extract(epoch FROM scheduled_for) - $fake0) / 60)) * 1000, 3)
		FROM pgjobd.jobs WHERE schedule = 'bench' ORDER BY scheduled_for OFFSET 1" | sort -n >"$late"
	[ -s "$late" ] || {
		problem "rep $REP: $key: no ticks measured"
		return
	}
	fig "$key.p50" "$(percentile 0.50 "$late")"
	fig "$key.max" "$(tail -n 1 "$late")"
	fig "$key.min" "$(head -n 1 "$late")"
}

# bench_cancel: from pgjobd.cancel() (its statement_timestamp) to the job's outcome
# (finished_at), both on the server's clock, for N_CANCEL jobs one at a time, each
# running `exec sleep 300` (which dies on SIGTERM at once). Figure 9c.
bench_cancel() {
	local lat=$T/cancel-lat.$REP id ts i
	reset_tables
	cat >"$W/cancel.ini" <<EOF
$(conf_header log_level=warn poll_interval=500ms)

[queue.long]
command = exec sleep 300
kill_grace = 5s
EOF
	daemon_up "cancel-$REP" "$W/cancel.ini"
	: >"$lat"
	for ((i = 0; i < N_CANCEL; i++)); do
		id=$(sql "INSERT INTO pgjobd.jobs (queue) VALUES ('long') RETURNING id")
		if ! wait_until 20 "[ \"\$(job_field $id status)\" = running ]"; then
			problem "rep $REP: cancel: job $id did not start"
			break
		fi
		sleep 0.2 # its command has started
		ts=$(sql "SELECT statement_timestamp() FROM (SELECT pgjobd.cancel($id)) c")
		if ! wait_until 20 "[ \"\$(job_field $id status)\" = cancelled ]"; then
			problem "rep $REP: cancel: job $id was not cancelled within 20 s"
			break
		fi
		job_field "$id" "round(extract(epoch FROM finished_at - '$ts'::timestamptz) * 1000, 3)" >>"$lat"
	done
	daemon_down
	[ -s "$lat" ] || return
	sort -n -o "$lat" "$lat"
	fig cancel.p50 "$(percentile 0.50 "$lat")"
	fig cancel.max "$(tail -n 1 "$lat")"
}

# bench_watchdog: WATCHDOG=1 pings of a daemon with WATCHDOG_USEC=1000000 (one every
# 0.5 s is the aim) to a stand-in for systemd's notify socket (build/tests/notify-sink,
# which stamps each datagram with CLOCK_MONOTONIC), over WD_SECS seconds: the mean
# interval and the longest gap (figure 9d). systemd kills a service whose gap reaches
# WATCHDOG_USEC.
bench_watchdog() {
	local sock=$T/wd.$REP.sock msgs=$T/wd.$REP.txt spid pid out
	if [ ! -x "$NOTIFY_SINK" ]; then
		problem "rep $REP: watchdog: $NOTIFY_SINK missing (make build/tests/notify-sink)"
		return
	fi
	"$NOTIFY_SINK" "$sock" "$msgs" 2>>"$T/sink.log" &
	spid=$!
	DAEMON_PIDS+=("$spid")
	if ! wait_until 10 "[ -S '$sock' ]"; then
		problem "rep $REP: watchdog: the notify sink did not start"
		return
	fi
	cat >"$W/wd.ini" <<EOF
$(conf_header log_level=warn poll_interval=1h)

[queue.wd]
command = true
EOF
	start_daemon "wd-$REP" "$W/wd.ini" NOTIFY_SOCKET="$sock" WATCHDOG_USEC=1000000
	DAEMON=$DAEMON_PID
	CUR_LOG=$T/wd-$REP.log
	pid=$DAEMON
	sleep "$WD_SECS"
	daemon_down
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	forget_daemon "$spid"
	out=$(awk -v pid="$pid" '$3 == pid && $4 == "WATCHDOG=1" {
			if (n) { g = $1 - prev; if (g > max) max = g }
			if (!n) first = $1
			prev = $1; n++
		} END { if (n > 2) printf "%.3f %.3f\n", (prev - first) / (n - 1) * 1000, max * 1000 }' "$msgs")
	if [ -z "$out" ]; then
		problem "rep $REP: watchdog: fewer than 3 pings in $WD_SECS s"
		return
	fi
	fig watchdog.interval "${out% *}"
	fig watchdog.gap "${out#* }"
}

# ---------------------------------------------------------------- 4. backlog scaling

# finished_at_least FIRST N: a lower bound of the jobs of queue backlog that finished, for
# N jobs with ids FIRST.. (see bench_backlog). No job of the backlog fails, so none is
# held back by a retry (held_until IS NULL: the condition of jobs_ready_grouped).
finished_at_least() {
	psql_q "SELECT coalesce((SELECT id FROM pgjobd.jobs
		WHERE queue = 'backlog' AND status = 'queued' AND group_id IS NOT NULL AND held_until IS NULL
		ORDER BY priority, run_at, id LIMIT 1), $1 + $2) - $1 - $CONCURRENCY"
}

bench_backlog() { # small|large
	local size=$1 n groups stop first got secs lsn0 wal
	if [ "$size" = small ]; then
		n=$N_SMALL groups=$G_SMALL stop=$N_SMALL
	else
		n=$N_LARGE groups=$G_LARGE stop=$N_LARGE_STOP
	fi
	reset_tables
	fill backlog "$n" "$groups"
	first=$(sql "SELECT min(id) FROM pgjobd.jobs")
	lsn0=$(sql "SELECT pg_current_wal_insert_lsn()")
	stats_reset
	daemon_up "backlog-$size-$REP" "$W/backlog.ini"
	if [ "$size" = small ]; then
		wait_drained backlog
	else
		# When to stop: counting finished rows is a scan of a million rows (no index
		# covers finished jobs), too dear to repeat every 50 ms on the machine being
		# measured. Instead one probe of jobs_ready_grouped finds the smallest queued
		# id (all jobs have the same priority and run_at, so the index order is id
		# order). The ids come from one INSERT, so they are consecutive from $first, and
		# every row below that id has left `queued`: it is running (at most
		# CONCURRENCY of them) or finished. Hence finished >= (min queued id - first) -
		# CONCURRENCY, a lower bound that needs no assumption about claim order. The
		# exact count and times are read from the table once the daemon has stopped.
		poll_until "$STEP_TIMEOUT" "[ \"\$(finished_at_least $first $n)\" -ge $stop ] || ! pid_alive $DAEMON" ||
			problem "rep $REP: backlog $size: $stop jobs not finished after ${STEP_TIMEOUT}s"
		pid_alive "$DAEMON" || problem "rep $REP: daemon ${CUR_LOG##*/} died"
	fi
	daemon_down
	wal=$(sql "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$lsn0')")
	# Rate = stop / (the stop-th finish - the first start); one scan, after the run.
	IFS='|' read -r got secs < <(sql "WITH s AS (SELECT started_at, finished_at FROM pgjobd.jobs
			WHERE queue = 'backlog' AND status <> 'queued')
		SELECT (SELECT count(*) FROM s WHERE finished_at IS NOT NULL),
		       extract(epoch FROM (SELECT finished_at FROM s WHERE finished_at IS NOT NULL
		                           ORDER BY finished_at OFFSET $stop - 1 LIMIT 1)
		                          - (SELECT min(started_at) FROM s))")
	if [ "${got:-0}" -lt "$stop" ]; then
		problem "rep $REP: backlog $size: $got of $stop jobs finished; no figures from this run"
		return
	fi
	fig "backlog.$size" "$(ratio "$stop" "$secs")"
	# The claim statement's own execution time (pg_stat_statements times the executor,
	# not the commit that follows, so WAL flushes are not in it): whether the claim
	# itself slows down with the backlog, apart from the I/O the backlog causes.
	[ -n "$PGSS_LIB" ] && fig "backlog.claim_ms.$size" "$(sql "SELECT sum(total_exec_time) / nullif(sum(calls), 0)
		FROM pg_stat_statements WHERE userid = 'postgres'::regrole AND query LIKE '%pgjobd.claim_batch(%'")"
	# WAL per finished job (the count includes those finished after the stop point; a job
	# still running at the stop was claimed, and its claim's WAL is counted too: a bias
	# of at most CONCURRENCY jobs).
	fig "backlog.wal.$size" "$(ratio "$wal" "$got")"
}

# ---------------------------------------------------------------- 5. enqueue cost

bench_enqueue() {
	local v trig out tps
	declare -A t
	# No daemon runs now, so none waits: the rows that stopped daemons left in
	# pgjobd.waiting (the orphan pass of a live daemon would remove them) go first.
	sql "TRUNCATE pgjobd.waiting" >/dev/null
	# Warm-up, not measured. A new cluster creates each 16 MB WAL segment file (and
	# fills it with zeros) the first time it needs it, and recycles segments only once a
	# checkpoint has passed them; a run writes several segments. Without this, the
	# first runs of the first repetition paid for creating them, and those were the
	# "triggers on" runs.
	if [ "$REP" = 1 ]; then
		reset_tables
		"$PG_BINDIR/pgbench" -n -c "$ENQ_CLIENTS" -j 2 -T "$ENQ_SECS" \
			-f "$W/enq-ungrouped.sql" >/dev/null 2>&1
	fi
	# "waiting": triggers on while a daemon waits for another queue, so every INSERT
	# looks its queue up in pgjobd.waiting (and sends no NOTIFY).
	for v in ungrouped grouped; do
		for trig in on off waiting; do
			[ "$v" = grouped ] && [ "$trig" = waiting ] && continue
			reset_tables
			[ "$trig" = off ] && sql "ALTER TABLE pgjobd.jobs DISABLE TRIGGER USER"
			[ "$trig" = waiting ] &&
				sql "INSERT INTO pgjobd.waiting (queue, pid) VALUES ('elsewhere', pg_backend_pid())"
			sql "CHECKPOINT"
			out=$("$PG_BINDIR/pgbench" -n -c "$ENQ_CLIENTS" -j 2 -T "$ENQ_SECS" -f "$W/enq-$v.sql" 2>&1)
			[ "$trig" = off ] && sql "ALTER TABLE pgjobd.jobs ENABLE TRIGGER USER"
			[ "$trig" = waiting ] && sql "TRUNCATE pgjobd.waiting"
			tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | head -n 1)
			[ -n "$tps" ] || echo "$out" >&2
			fig "enq.$v.$trig" "$tps"
			t[$v.$trig]=$tps
		done
		fig "enq.$v.ratio" "$(ratio "${t[$v.on]}" "${t[$v.off]}")"
	done
	fig "enq.ungrouped.waiting_ratio" "$(ratio "${t[ungrouped.waiting]}" "${t[ungrouped.off]}")"
}

# ---------------------------------------------------------------- 6a. memory with 64 busy slots

bench_footprint() {
	local guard
	reset_tables
	fill foot $((FOOT_SLOTS * 2)) 0
	daemon_up "foot-$REP" "$W/foot.ini"
	# Peak (VmHWM) after all slots have claimed, spawned, and then recorded the outcome of
	# a job at the same time: wait for FOOT_SLOTS running, then for FOOT_SLOTS finished.
	if wait_until 60 "[ \"\$(count_jobs \"queue = 'foot' AND status = 'running'\")\" -ge $FOOT_SLOTS ] || ! pid_alive $DAEMON" &&
		wait_until 60 "[ \"\$(count_jobs \"queue = 'foot' AND status = 'succeeded'\")\" -ge $FOOT_SLOTS ] || ! pid_alive $DAEMON" &&
		pid_alive "$DAEMON"; then
		fig rss.daemon "$(hwm_mib "$DAEMON")"
		guard=$(guard_of "$DAEMON")
		if [ "$(wc -w <<<"$guard")" = 1 ]; then
			fig rss.guard "$(hwm_mib "$guard")"
		else
			problem "rep $REP: guard process not identified (candidates: ${guard:-none})"
		fi
	else
		problem "rep $REP: footprint: $FOOT_SLOTS slots never busy and done at once"
	fi
	daemon_down
}

# ---------------------------------------------------------------- 6d. sends per job

# strace -c over the daemon would mix sends to PostgreSQL with messages to the guard and
# writes to the commands' stdin, so the calls are logged one by one instead, with -yy
# naming each descriptor, and sorted by what they go to: UNIX-STREAM/TCP sockets are
# database sessions, the other UNIX socket (a SOCK_SEQPACKET socketpair, which strace
# shows as plain UNIX) is the guard channel, pipe: is a command's stdin.
# -f is not used: the daemon is single-threaded (every thread of it is attached anyway,
# one -p per task), and -f would also trace every command's shell, counting its writes
# and slowing each spawn by an order of magnitude.
# Sends vs round trips: with libpq's pipeline mode a whole batch of statements goes out
# without waiting for replies, so one send is about one round trip. Not exactly, though:
# libpq flushes at every PQpipelineSync, and pgjobd's claim batch has two Syncs (claim;
# BEGIN + hold), so it leaves as two sends back to back. Round trips are therefore counted
# too, as bursts of sends: a send on a database socket starts a new round trip when that
# socket has received data since its previous send.
bench_strace() {
	local spid tids out db trips guard pipe other
	command -v strace >/dev/null 2>&1 || {
		[ "$REP" = 1 ] && problem "strace not installed: 6d (sends per job) skipped"
		return
	}
	reset_tables
	sql "CHECKPOINT" >/dev/null
	daemon_up "strace-$REP" "$W/tput.ini"
	daemon_idle "$CONCURRENCY" || {
		daemon_down
		return
	}
	out=$T/strace.$REP
	tids=$(ls "/proc/$DAEMON/task")
	# shellcheck disable=SC2046,SC2086 # one -p per task: word splitting wanted
	strace -qq -yy -e trace=sendto,send,sendmsg,write,recvfrom,recv -o "$out" $(printf -- '-p %s ' $tids) 2>"$T/strace-err.$REP" &
	spid=$!
	echo "$spid" >"$T/strace.pid" # killed by lib.sh's cleanup if we die first
	if ! wait_until 10 "awk '/^TracerPid:/ { exit \$2 == 0 }' /proc/$DAEMON/status"; then
		problem "rep $REP: strace could not attach ($(head -c 200 "$T/strace-err.$REP"))"
		kill "$spid" 2>/dev/null
		wait "$spid" 2>/dev/null
		daemon_down
		return
	fi
	sql "INSERT INTO pgjobd.jobs (queue) SELECT 'tput' FROM generate_series(1, $N_STRACE)"
	wait_drained tput
	kill -INT "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	daemon_down
	read -r db trips guard pipe other < <(awk '
		match($0, /^[0-9]* *[a-z]+\([0-9]+</) {
			call = substr($0, RSTART, RLENGTH - 1)
			sub(/^[0-9]* */, "", call)
			fd = call
			sub(/^[a-z]+\(/, "", fd)
			sub(/\(.*/, "", call)
			ret = $0
			sub(/.*\) = /, "", ret)
			isdb = $0 ~ /^[0-9]* *[a-z]+\([0-9]+<(UNIX-STREAM|TCP|TCPv6):/
			if (call ~ /^recv/) {
				if (isdb && ret + 0 > 0)
					replied[fd] = 1
				next
			}
			if (isdb) {
				db++
				if (!(fd in sent) || replied[fd])
					trips++
				sent[fd] = 1
				replied[fd] = 0
			} else if (call == "sendmsg" || $0 ~ /\([0-9]+<UNIX:/)
				guard++
			else if ($0 ~ /\([0-9]+<pipe:/)
				pipe++
			else
				other++
		}
		END { print db + 0, trips + 0, guard + 0, pipe + 0, other + 0 }' "$out")
	fig trips.db "$(ratio "$trips" "$N_STRACE")"
	fig sends.db "$(ratio "$db" "$N_STRACE")"
	fig sends.guard "$(ratio "$guard" "$N_STRACE")"
	fig sends.pipe "$(ratio "$pipe" "$N_STRACE")"
	[ "$other" -gt 0 ] && log "    ($other other write calls, e.g. log lines)"
}

# ---------------------------------------------------------------- 7. groups held back by a retry

# claim_rounds QUEUE COUNT WORKER: COUNT claims for one slot in one warm psql session, as
# the daemon's claimer makes them (p_scan 1000, src/claim.c), each followed by the
# claimed job's finish. Appends one line per claim to
# $W/held.QUEUE.$REP: "ms M buffers B wal W" (execution time and shared buffers from
# EXPLAIN ANALYZE; WAL written by the claim's own transaction, the finish left out).
claim_rounds() {
	local i q=$1 out=$W/held.$1.$REP sql=""
	for i in $(seq "$2"); do
		sql+="SELECT pg_current_wal_insert_lsn() AS lsn \\gset
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM pgjobd.claim_batch('$q', $3, '{bench}', 5, 0, 1048576, 1000, false, '{}', '{}', '{}');
SELECT 'wal ' || pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'lsn');
UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE worker = 'bench' AND status = 'running';
"
	done
	psql -X -qAt -v ON_ERROR_STOP=1 <<<"$sql" >"$T/held-raw" 2>&1 ||
		harness_fail "claims on queue $q failed: $(tail -n 3 "$T/held-raw")"
	awk '/Buffers: shared/ && b == "" { n = 0; for (f = 1; f <= NF; f++) { split($f, kv, "=");
			if (kv[1] == "hit" || kv[1] == "read") n += kv[2] } b = n }
		/Execution Time/ { ms = $3 }
		/^wal / { print "ms " ms " buffers " b " wal " $2; b = "" }' "$T/held-raw" >>"$out"
}
# held_median FIELD QUEUE FROM: median of FIELD over the last 9 of the 12 claims from line
# FROM of $W/held.QUEUE.$REP (the first 3 of each 12 settle the session's cached plans).
held_median() {
	tail -n +"$3" "$W/held.$2.$REP" | head -n 12 | tail -n 9 |
		awk -v f="$1" '{ for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' |
		sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'
}

bench_held() {
	local warm=$((N_HELD / 1000 + 5)) wid t0 ms
	reset_tables
	# Queue held: N_HELD groups whose head failed once and waits out a backoff of an hour,
	# each with a second job that became ready an hour ago; behind them, work that became
	# ready half an hour ago (warm + 12 jobs, alternately ungrouped and in a group of
	# their own). Queue none: 12 jobs of the same work alone. No daemon runs.
	sql "INSERT INTO pgjobd.jobs (queue, group_id, run_at, attempts)
		SELECT 'held', 'h' || i, now() + interval '1 hour', 1 FROM generate_series(1, $N_HELD) i"
	sql "INSERT INTO pgjobd.jobs (queue, group_id, run_at)
		SELECT 'held', 'h' || i, now() - interval '1 hour' FROM generate_series(1, $N_HELD) i"
	sql "INSERT INTO pgjobd.jobs (queue, group_id, run_at)
		SELECT 'held', CASE WHEN i % 2 = 0 THEN 'w' || i END, now() - interval '30 minutes' + i * interval '1 second'
		  FROM generate_series(1, $((warm + 12))) i ORDER BY i"
	sql "INSERT INTO pgjobd.jobs (queue, group_id, run_at)
		SELECT 'none', CASE WHEN i % 2 = 0 THEN 'w' || i END, now() - interval '30 minutes' + i * interval '1 second'
		  FROM generate_series(1, 12) i ORDER BY i"
	# Autovacuum would add WAL of its own to the claims': VACUUM runs where the bench says,
	# as autovacuum would after the same changes.
	sql "ALTER TABLE pgjobd.jobs SET (autovacuum_enabled = false)" >/dev/null
	sql "VACUUM ANALYZE pgjobd.jobs"
	sql "CHECKPOINT"
	wid=$(sql "SELECT pgjobd.register_worker('bench:1', 600000)")
	# The first claims over newly held groups take them out of their scan (1000 groups a
	# call): measured as a whole.
	t0=$(now_ms)
	claim_rounds held "$warm" "$wid"
	ms=$(($(now_ms) - t0))
	fig held.warm.ms "$ms"
	fig held.warm.wal "$(awk '{ s += $6 } END { printf "%.1f", s / 1024 }' "$W/held.held.$REP")"
	sql "VACUUM pgjobd.jobs"
	claim_rounds held 12 "$wid" # taking a job
	claim_rounds held 12 "$wid" # nothing left
	claim_rounds none 12 "$wid"
	claim_rounds none 12 "$wid"
	sql "ALTER TABLE pgjobd.jobs RESET (autovacuum_enabled)" >/dev/null
	local hj nj hi ni hbi nbi
	hj=$(held_median ms held $((warm + 1)))
	nj=$(held_median ms none 1)
	hi=$(held_median ms held $((warm + 13)))
	ni=$(held_median ms none 13)
	hbi=$(held_median buffers held $((warm + 13)))
	nbi=$(held_median buffers none 13)
	fig held.none.job "$nj"
	fig held.held.job "$hj"
	fig held.ratio.job "$(ratio "$hj" "$nj")"
	fig held.none.idle "$ni"
	fig held.held.idle "$hi"
	fig held.ratio.idle "$(ratio "$hi" "$ni")"
	fig held.buffers.idle "$(ratio "$hbi" "$nbi")"
	fig held.wal.job "$(held_median wal held $((warm + 1)))"
	fig held.wal.idle "$(held_median wal held $((warm + 13)))"
	# Work claimed out of the held groups' way: a partial run's figures would be wrong.
	[ "$(sql "SELECT count(*) FROM pgjobd.jobs WHERE status = 'queued' AND (group_id IS NULL OR group_id LIKE 'w%')")" = 0 ] ||
		problem "rep $REP: held: not every ready job was claimed"
}

# ---------------------------------------------------------------- 7b. a backlog behind backed-off heads

# bench_backoff MODE CASE: the claim rate of a running daemon (16 slots of `true`, lock
# mode MODE: transaction or lease) over a backlog of N_BO_JOBS grouped jobs, enqueued
# group by group (group k holds ids k*S+1 .. k*S+S, S = N_BO_JOBS / N_BO_GROUPS), with
# CASE free: nothing held; held: the heads of the first N_BO_HELD groups (the lowest
# ids: what a claim's scan meets first) failed once and wait out an hour's backoff,
# as an outcome `queued` with a retry leaves them (attempts 1, run_at ahead, an error),
# so the later jobs of those groups are held back and the claim must find the other
# groups' jobs behind them. The failures are made as they happen, so the groups are
# marked held where real failures mark them (the outcome's trigger jobs_backed_off, and
# the claims that meet what it left); marked: hold_group marks them once more before the
# daemon starts. The daemon starts after the fill (VACUUM ANALYZE, CHECKPOINT, as 4) and is
# stopped once N_BO_STOP jobs have finished; rate = N_BO_STOP / (the N_BO_STOP-th finish -
# the first start), as 4. Figures backoff.MODE.CASE (jobs/s) and backoff.claim_ms.MODE.CASE
# (the claim statement's mean execution time, pg_stat_statements).
bench_backoff() {
	local mode=$1 case=$2 key size got secs
	key=$mode.$case
	size=$((N_BO_JOBS / N_BO_GROUPS))
	cat >"$W/backoff-$mode.ini" <<EOF
$(conf_header log_level=warn poll_interval=2s)

[queue.backoff]
command = true
concurrency = $CONCURRENCY
lock_mode = $mode
EOF
	reset_tables
	sql "INSERT INTO pgjobd.jobs (queue, group_id)
		SELECT 'backoff', 'g' || ((i - 1) / $size) FROM generate_series(1, $N_BO_JOBS) i ORDER BY i"
	# The heads of the first N_BO_HELD groups fail once: claimed (as the claim marks a
	# job running), then the outcome of a failed attempt with a retry left, in the form
	# of the daemon's outcome statement (src/claim.c, sql_finish): queued again, run_at an
	# hour ahead, the attempt's history entry. Two statements, so that whatever reacts
	# to a real failure (triggers) sees one.
	if [ "$case" != free ]; then
		# Statistics first: the outcome of a failure marks its group held (trigger
		# jobs_backed_off), and plans made on the table as TRUNCATE left it are slow.
		sql "ANALYZE pgjobd.jobs"
		sql "UPDATE pgjobd.jobs SET status = 'running', attempts = attempts + 1, worker = 'bench:1',
			fence = nextval('pgjobd.fence_seq'), started_at = now(), updated_at = now()
			WHERE queue = 'backoff' AND (id - (SELECT min(id) FROM pgjobd.jobs)) % $size = 0
			  AND id - (SELECT min(id) FROM pgjobd.jobs) < $N_BO_HELD * $size" >/dev/null
		sql "UPDATE pgjobd.jobs SET status = 'queued', error = '{\"reason\": \"exit\", \"exit_code\": 1, \"signal\": null, \"stderr\": null}',
			run_at = c.t + interval '1 hour', finished_at = NULL, updated_at = c.t,
			history = pgjobd.history_add(history, jsonb_build_object('attempt', attempts,
				'worker', worker, 'started_at', started_at, 'finished_at', c.t, 'exit_code', 1))
			FROM (SELECT clock_timestamp() AS t) c
			WHERE queue = 'backoff' AND status = 'running'" >/dev/null
	fi
	sql "VACUUM ANALYZE pgjobd.jobs"
	sql "VACUUM ANALYZE pgjobd.groups"
	# marked: as the claims would leave those groups once they have met them (the
	# heads' groups marked held until their run_at), before the daemon starts; then
	# VACUUM again, for the marked rows' old index entries. After the ANALYZE: before
	# it (no statistics since the TRUNCATE) the marking was much slower, once over 5
	# minutes instead of under one.
	if [ "$case" = marked ]; then
		sql "SELECT sum(pgjobd.hold_group('backoff', coalesce(group_key, group_id), id, run_at, 1000))
			FROM pgjobd.jobs WHERE queue = 'backoff' AND status = 'queued' AND run_at > now()" >/dev/null
		sql "VACUUM ANALYZE pgjobd.jobs"
	fi
	sql "CHECKPOINT"
	stats_reset
	daemon_up "backoff-$mode-$case-$REP" "$W/backoff-$mode.ini"
	# jobs_finished covers finished jobs: the count reads at most N_BO_STOP index entries.
	poll_until "$STEP_TIMEOUT" "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.jobs WHERE queue = 'backoff' AND status = 'succeeded'\")\" -ge $N_BO_STOP ] || ! pid_alive $DAEMON" ||
		problem "rep $REP: backoff $key: $N_BO_STOP jobs not finished after ${STEP_TIMEOUT}s"
	pid_alive "$DAEMON" || problem "rep $REP: daemon ${CUR_LOG##*/} died"
	daemon_down
	# The held heads stay queued (their backoff has an hour to run): only this run's
	# starts count.
	IFS='|' read -r got secs < <(sql "WITH s AS (SELECT started_at, finished_at FROM pgjobd.jobs
			WHERE queue = 'backoff' AND status <> 'queued')
		SELECT (SELECT count(*) FROM s WHERE finished_at IS NOT NULL),
		       extract(epoch FROM (SELECT finished_at FROM s WHERE finished_at IS NOT NULL
		                           ORDER BY finished_at OFFSET $N_BO_STOP - 1 LIMIT 1)
		                          - (SELECT min(started_at) FROM s))")
	if [ "${got:-0}" -lt "$N_BO_STOP" ]; then
		problem "rep $REP: backoff $key: $got of $N_BO_STOP jobs finished; no figures from this run"
		return
	fi
	fig "backoff.$key" "$(ratio "$N_BO_STOP" "$secs")"
	[ -n "$PGSS_LIB" ] && fig "backoff.claim_ms.$key" "$(sql "SELECT sum(total_exec_time) / nullif(sum(calls), 0)
		FROM pg_stat_statements WHERE userid = 'postgres'::regrole AND query LIKE '%pgjobd.claim_batch(%'")"
	[ -n "$PGSS_LIB" ] && [ "$REP" = 1 ] && stats_dump "backoff $key" "$got"
	[ "$case" != free ] && fig "backoff.ratio.$mode.$case" "$(ratio "$(awk -F'\t' -v k="backoff.$key" -v r="$REP" '$1 == k && $2 == r { print $3 }' "$W/figs")" \
		"$(awk -F'\t' -v k="backoff.$mode.free" -v r="$REP" '$1 == k && $2 == r { print $3 }' "$W/figs")")"
	return 0
}

# ---------------------------------------------------------------- 10. many daemons on one server

# Sizes of measurement 10 (env overrides; BENCH_ONLY=scale runs it alone). The commands
# sleep, so that the spawns do not bind on a small machine: what is measured is what the
# daemons cost the server.
SCALE_DAEMONS=${BENCH_SCALE_DAEMONS:-16}        # 10a, 10c: daemons; 10b, 10d: one daemon
SCALE_SLOTS=${BENCH_SCALE_SLOTS:-16}            #   with DAEMONS x SLOTS slots
SCALE_SLEEP=${BENCH_SCALE_SLEEP:-2}             #   seconds each job sleeps (not shrunk)
SCALE_ROUNDS=${BENCH_SCALE_ROUNDS:-$([ "$QUICK" = 1 ] && echo 3 || echo 6)} # jobs per slot
N_SCALE=${BENCH_SCALE_JOBS:-$((SCALE_ROUNDS * SCALE_DAEMONS * SCALE_SLOTS))}
SCALE_QUEUES=${BENCH_SCALE_QUEUES:-20}          # 10e-10h: queues of each idle daemon
SCALE_POLL_S=${BENCH_SCALE_POLL:-2}             #   poll_interval in s (2s: conf/ and the default)
SCALE_IDLE_SECS=${BENCH_SCALE_IDLE_SECS:-$([ "$QUICK" = 1 ] && echo 8 || echo 20)} # each window
SCALE_NOTIFY_RATE=${BENCH_SCALE_NOTIFY_RATE:-200} # NOTIFYs a second sent by a stranger role
SCALE_MAX_CONN=${BENCH_SCALE_MAX_CONNECTIONS:-800} # the server's max_connections during 10
TGT_SCALE_PGCPU="<= 1.5"      # server CPU per job, many daemons / one daemon of as many slots
TGT_SCALE_LEASE_SESSIONS="<= 3" # sessions per daemon in lock mode lease
TGT_SCALE_IDLE_POLLS="<= 1.05" # claims per queue per poll_interval, idle (1 but noise)
TGT_SCALE_IDLE_OTHER="<= 0"   # other statements per daemon per poll_interval, idle
TGT_SCALE_NOTIFY_OTHER="<= 0.02" # statements per NOTIFY for a queue nobody waits for (0 but noise)

# scale_server N: the server with max_connections = N, restarted when it has another
# value. In lock mode transaction every slot is a session: 16 daemons of 16 slots need
# 16 x 20, 16 idle daemons of 20 queues 16 x 43. The other measurements run with 300.
scale_server() {
	[ "$PG_MAX_CONN" = "$1" ] && return 0
	PG_MAX_CONN=$1
	log "    (restarting the server with max_connections=$1)"
	pg_restart || harness_fail "PostgreSQL did not restart with max_connections=$1 (see $T/pg.log)"
}

# The daemons of a run of 10: scale_up KEY N MODE SLOTS QUEUES COMMAND starts N daemons
# named scale-KEY-REP-I, each serving QUEUES queues (QUEUES 1: queue `scale`; otherwise
# q01, q02, ...) of SLOTS slots, lock mode MODE, running COMMAND, and writing its metrics
# to $W/scale-KEY-I.prom. Their pids are SCALE_PIDS. scale_down stops them all (SIGTERM
# to every one first), with daemon_down's checks.
SCALE_PIDS=()
scale_up() {
	local key=$1 n=$2 mode=$3 slots=$4 queues=$5 cmd=$6 i q conf
	SCALE_PIDS=()
	rm -f "$W"/scale-"$key"-*.prom
	for ((i = 1; i <= n; i++)); do
		conf=$W/scale-$key-$i.ini
		{
			conf_header log_level=warn poll_interval="${SCALE_POLL_S}s" metrics_file="$W/scale-$key-$i.prom"
			for ((q = 1; q <= queues; q++)); do
				echo
				if [ "$queues" = 1 ]; then echo "[queue.scale]"; else printf '[queue.q%02d]\n' "$q"; fi
				echo "command = $cmd"
				echo "concurrency = $slots"
				echo "lock_mode = $mode"
			done
		} >"$conf"
		start_daemon "scale-$key-$REP-$i" "$conf"
		SCALE_PIDS+=("$DAEMON_PID")
	done
}
scale_down() {
	local i pid warned
	for pid in "${SCALE_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
	# One SIGTERM each (a second one would stop a daemon at once), then as daemon_down.
	for i in "${!SCALE_PIDS[@]}"; do
		pid=${SCALE_PIDS[$i]}
		CUR_LOG=$T/scale-$1-$REP-$((i + 1)).log
		wait_daemon_exit "$pid" 60
		if [ "$DAEMON_STATUS" = 999 ]; then
			kill -KILL "$pid" 2>/dev/null
			wait "$pid" 2>/dev/null
			forget_daemon "$pid"
			problem "rep $REP: daemon ${CUR_LOG##*/} did not stop within 60 s (killed)"
		elif [ "$DAEMON_STATUS" != 0 ]; then
			problem "rep $REP: daemon ${CUR_LOG##*/} exited with status $DAEMON_STATUS"
		fi
		warned=$(grep -v 'msg="commands run as the daemon.s own user' "$CUR_LOG" 2>/dev/null)
		if [ -n "$warned" ]; then
			{
				echo "== ${CUR_LOG##*/}"
				echo "$warned"
			} >>"$OUT/daemon-warnings.log"
			problem "rep $REP: daemon ${CUR_LOG##*/} logged $(wc -l <<<"$warned") warning/error lines (${OUT#"$repo"/}/daemon-warnings.log)"
		fi
	done
	SCALE_PIDS=()
}
# scale_alive: every daemon of the run lives (a problem is recorded for one that died).
scale_alive() {
	local i
	for i in "${!SCALE_PIDS[@]}"; do
		pid_alive "${SCALE_PIDS[$i]}" && continue
		problem "rep $REP: daemon scale-$1-$REP-$((i + 1)) died"
		return 1
	done
}
# daemon_backends_cpu: CPU seconds so far of the backends of the daemons' sessions that
# live now (user postgres: the daemons'; the bench's sessions are user bench), from
# /proc/PID/schedstat (nanoseconds on a CPU; /proc/PID/stat counts in clock ticks, 10 ms,
# too coarse for hundreds of mostly idle backends).
daemon_backends_cpu() {
	local pm pids
	pm=$(head -n 1 "$T/pg/postmaster.pid")
	pids=$(pgrep -P "$pm" -f 'postgres: postgres pgjobd_test')
	[ -n "$pids" ] || {
		echo 0
		return
	}
	# shellcheck disable=SC2046,SC2086 # one file per pid
	awk '{ s += $1 } END { printf "%.6f", s / 1e9 }' $(printf '/proc/%s/schedstat ' $pids) 2>/dev/null
}

# The monitoring session of a run of 10: one psql (user bench) for every query made while
# the daemons run. Its backend's CPU is read before it ends and taken out of the server's
# CPU of the run; a psql per query would add a backend start each. mon_q SQL prints the
# rows of one statement.
mon_start() {
	coproc MON { exec stdbuf -oL psql -X -qAt 2>&1; }
	MON_BACKEND=$(mon_q "SELECT pg_backend_pid()")
}
mon_q() {
	local line
	printf '%s;\n\\echo __mon_end__\n' "$1" >&"${MON[1]}" || return 1
	while IFS= read -r -t 60 line <&"${MON[0]}"; do
		[ "$line" = __mon_end__ ] && return 0
		printf '%s\n' "$line"
	done
	return 1
}
# mon_stop: end the session; prints its backend's CPU seconds.
mon_stop() {
	local cpu pid=$MON_PID
	cpu=$(cpu_s "$MON_BACKEND")
	printf '\\q\n' >&"${MON[1]}"
	wait "$pid" 2>/dev/null
	echo "$cpu"
}

# claim_p99_ms FILE...: the 99th percentile of pgjobd_claim_seconds (a claim sent ->
# its job's command starting, src/metrics.c) of queue `scale`, all the daemons' metrics
# files together, in ms: linear within its bucket, as Prometheus' histogram_quantile
# does (the buckets' bounds are 0.5, 1, 2.5, 5, 10, 25, 50, 100 ms, ...). Empty when it
# falls beyond the last bound.
claim_p99_ms() {
	awk '/^pgjobd_claim_seconds_bucket\{queue="scale",le="/ {
			le = $0
			sub(/.*le="/, "", le)
			sub(/".*/, "", le)
			if (!(le in c)) les[++n] = le
			c[le] += $NF
		}
		END {
			for (i = 2; i <= n; i++) for (j = i; j > 1 && (les[j - 1] == "+Inf" || (les[j] != "+Inf" && les[j - 1] + 0 > les[j] + 0)); j--) { t = les[j]; les[j] = les[j - 1]; les[j - 1] = t }
			tot = c["+Inf"]
			if (tot == 0) exit
			rank = 0.99 * tot
			pb = 0; pc = 0
			for (i = 1; i <= n; i++) {
				if (c[les[i]] >= rank) {
					if (les[i] == "+Inf") exit
					printf "%.3f", (pb + (les[i] - pb) * (rank - pc) / (c[les[i]] - pc)) * 1000
					exit
				}
				pb = les[i]; pc = c[les[i]]
			}
		}' "$@" 2>/dev/null
}

# bench_scale MODE many|one: 10a-10d. N_SCALE jobs `sleep SCALE_SLEEP`, ungrouped, queued
# before the daemons start (as in 2): SCALE_DAEMONS daemons of SCALE_SLOTS slots (many) or
# one daemon of all those slots (one), lock mode MODE. Every 0.5 s the monitoring session
# samples the queue, the daemons' sessions, those waiting for a lock and the daemons'
# statements so far, and the bench reads their backends' CPU (daemon_backends_cpu).
# Whole-run figures: after the run, every backend of the run must have ended before the
# postmaster's children's CPU is read again (their connections included). Steady-state
# figures: from the first sample after a job finished (every daemon connected, every slot
# busy) to the last one with jobs still queued.
bench_scale() {
	local mode=$1 shape=$2 key nd slots pm pg0 pg1 moncpu calls claim_ms samples n secs row
	local steady sj scpu scalls sess lw
	key=$mode.$shape
	if [ "$shape" = many ]; then
		nd=$SCALE_DAEMONS slots=$SCALE_SLOTS
	else
		nd=1 slots=$((SCALE_DAEMONS * SCALE_SLOTS))
	fi
	samples=$W/scale-samples.$key.$REP
	: >"$samples"
	scale_server "$SCALE_MAX_CONN"
	reset_tables
	fill scale "$N_SCALE" 0
	stats_reset
	pm=$(head -n 1 "$T/pg/postmaster.pid")
	pg0=$(cpu_s "$pm" children)
	mon_start
	scale_up "$key" "$nd" "$mode" "$slots" 1 "sleep $SCALE_SLEEP"
	# "queued running succeeded sessions lock-waiters statements cpu" every 0.5 s, until
	# nothing is left
	while :; do
		row=$(mon_q "SELECT (SELECT count(*) FROM pgjobd.jobs WHERE queue = 'scale' AND status = 'queued'),
			(SELECT count(*) FROM pgjobd.jobs WHERE queue = 'scale' AND status = 'running'),
			(SELECT count(*) FROM pgjobd.jobs WHERE queue = 'scale' AND status = 'succeeded'),
			count(*) FILTER (WHERE application_name LIKE 'pgjobd %'),
			count(*) FILTER (WHERE application_name LIKE 'pgjobd %' AND wait_event_type = 'Lock'),
			(SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE userid = 'postgres'::regrole)
			FROM pg_stat_activity WHERE datname = current_database()") || break
		echo "${row//|/ } $(daemon_backends_cpu)" >>"$samples"
		[[ $row == 0\|0\|* ]] && break
		scale_alive "$key" || break
		[ "$(wc -l <"$samples")" -gt $((STEP_TIMEOUT * 2)) ] && {
			problem "rep $REP: scale $key: queue not drained after ${STEP_TIMEOUT}s"
			break
		}
		sleep 0.5
	done
	calls=$(mon_q "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE userid = 'postgres'::regrole
		AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
	claim_ms=$(mon_q "SELECT sum(total_exec_time) / nullif(sum(calls), 0), max(max_exec_time) FROM pg_stat_statements
		WHERE userid = 'postgres'::regrole AND query LIKE '%pgjobd.claim_batch(%'")
	moncpu=$(mon_stop)
	scale_down "$key"
	# Every backend of the run has ended (and the postmaster has reaped it).
	wait_until 30 "! pgrep -P $pm -f 'postgres: (postgres|bench) pgjobd_test' >/dev/null" ||
		problem "rep $REP: scale $key: backends still running 30 s after the daemons stopped"
	pg1=$(cpu_s "$pm" children)
	IFS='|' read -r n secs < <(sql "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))
		FROM pgjobd.jobs WHERE queue = 'scale' AND status = 'succeeded'")
	if [ "$n" != "$N_SCALE" ]; then
		problem "rep $REP: scale $key: $n of $N_SCALE jobs succeeded; no figures from this run"
		return
	fi
	fig "scale.tput.$key" "$(ratio "$n" "$secs")"
	[ -n "$pg0" ] && [ -n "$pg1" ] && [ -n "$moncpu" ] &&
		fig "scale.pgcpu.$key" "$(calc "($pg1 - $pg0 - $moncpu) * 1000 / $n")"
	[ -n "$PGSS_LIB" ] && fig "scale.stmts.$key" "$(ratio "$calls" "$n")"
	# Steady state: "JOBS CPU STATEMENTS SESSIONS LOCKWAITS" over its samples.
	steady=$(awk '$3 > 0 && $1 > 0 { if (!k++) { j0 = $3; s0 = $6; c0 = $7 } j1 = $3; s1 = $6; c1 = $7
			ss[k] = $4; w += $5 }
		END { if (k < 2 || j1 <= j0) exit
			for (i = 2; i <= k; i++) for (j = i; j > 1 && ss[j - 1] > ss[j]; j--) { t = ss[j]; ss[j] = ss[j - 1]; ss[j - 1] = t }
			printf "%d %.6f %d %s %.3f\n", j1 - j0, c1 - c0, s1 - s0, ss[int((k + 1) / 2)], w / k }' "$samples")
	if [ -n "$steady" ]; then
		read -r sj scpu scalls sess lw <<<"$steady"
		fig "scale.pgcpu_steady.$key" "$(calc "$scpu * 1000 / $sj")"
		[ -n "$PGSS_LIB" ] && fig "scale.stmts_steady.$key" "$(ratio "$scalls" "$sj")"
		fig "scale.sessions.$key" "$(ratio "$sess" "$nd")"
		fig "scale.lockwaits.$key" "$lw"
	else
		problem "rep $REP: scale $key: no steady state sampled (more jobs: BENCH_SCALE_ROUNDS)"
	fi
	fig "scale.lockmax.$key" "$(awk '{ if ($5 > m) m = $5 } END { print m + 0 }' "$samples")"
	fig "scale.claim_p99.$key" "$(claim_p99_ms "$W"/scale-"$key"-*.prom)"
	if [ -n "$PGSS_LIB" ]; then
		fig "scale.claim_exec.$key" "${claim_ms%|*}"
		fig "scale.claim_max.$key" "${claim_ms#*|}"
	fi
	[ "$REP" = 1 ] && stats_dump "many daemons: $nd x $slots slots, lock mode $mode" "$n"
}

# idle_window SECS: a window of SECS seconds over the idle daemons, opened and closed on
# the monitoring session. Prints "STATEMENTS CLAIMS CPU SECS NOTIFIES": the daemons'
# statements and claim statements at the server (pg_stat_statements, user postgres),
# their live backends' CPU (s), the window's length (s), and the NOTIFYs the role
# stranger sent meanwhile. The daemons' statements of the window, one line each ("calls
# mean-execution-ms query"), go to $W/scale-window.
idle_window() {
	local c0 c1 t0 t1 row calls claims sent
	c0=$(daemon_backends_cpu)
	t0=$(now_ms)
	mon_q "SELECT pg_stat_statements_reset()" >/dev/null
	sleep "$1"
	row=$(mon_q "SELECT coalesce(sum(calls) FILTER (WHERE userid = 'postgres'::regrole), 0),
		coalesce(sum(calls) FILTER (WHERE userid = 'postgres'::regrole AND query LIKE '%pgjobd.claim_batch(%'), 0),
		coalesce(sum(calls) FILTER (WHERE userid = 'stranger'::regrole AND query LIKE 'NOTIFY%'), 0)
		FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
	t1=$(now_ms)
	c1=$(daemon_backends_cpu)
	mon_q "SELECT calls || ' ' || round(mean_exec_time::numeric, 3) || ' ' || left(regexp_replace(query, '\s+', ' ', 'g'), 90)
		FROM pg_stat_statements WHERE userid = 'postgres'::regrole ORDER BY calls DESC, query" >"$W/scale-window"
	IFS='|' read -r calls claims sent <<<"$row"
	echo "$calls $claims $(calc "$c1 - $c0") $(calc "($t1 - $t0) / 1000") $sent"
}
# scale_dump TITLE DIVISOR UNIT: the statements of the last idle_window ($W/scale-window),
# calls divided by DIVISOR, into statements.txt.
scale_dump() {
	{
		echo "== $1 (calls $3; mean execution ms; statement)"
		awk -v d="$2" '{ c = $1; m = $2; $1 = $2 = ""; sub(/^  /, ""); printf "%10.3f %8.3f  %s\n", c / d, m, $0 }' "$W/scale-window"
		echo
	} >>"$OUT/statements.txt"
}
# notify_start PAYLOAD: the role stranger (no grant) sends NOTIFY pgjobd, 'PAYLOAD'
# SCALE_NOTIFY_RATE times a second (pgbench -R), from now until a little after the next
# idle_window; notify_stop waits for it.
notify_start() {
	printf "NOTIFY pgjobd, '%s';\n" "$1" >"$W/scale-notify.sql"
	"$PG_BINDIR/pgbench" -n -U stranger -c 1 -R "$SCALE_NOTIFY_RATE" -T $((SCALE_IDLE_SECS + 3)) \
		-f "$W/scale-notify.sql" >"$T/scale-pgbench.out" 2>&1 &
	NOTIFY_PID=$!
	sleep 1
}
notify_stop() {
	wait "$NOTIFY_PID" ||
		problem "rep $REP: pgbench sending NOTIFYs failed: $(tail -n 2 "$T/scale-pgbench.out")"
}
# notify_cost KEY MODE BASE WINDOW: figures KEY.stmts.MODE (the daemons' statements per
# NOTIFY), KEY.cpu.MODE (their backends' CPU per NOTIFY, µs) and KEY.rate.MODE (statements
# per daemon per second beyond BASE's): a window with NOTIFYs (idle_window's
# output) less the quiet window BASE, scaled to the same length.
notify_cost() {
	local v
	local stmts cpu rate
	read -r stmts cpu rate < <(awk -v b="$3" -v o="$4" -v nd="$SCALE_DAEMONS" 'BEGIN {
		split(b, x, " "); split(o, y, " ")
		if (y[5] > 0 && x[4] > 0 && y[4] > 0)
			printf "%.4f %.2f %.3f\n", (y[1] - x[1] / x[4] * y[4]) / y[5],
				(y[3] - x[3] / x[4] * y[4]) * 1e6 / y[5], (y[1] / y[4] - x[1] / x[4]) / nd }')
	[ -n "$stmts" ] || {
		problem "rep $REP: $1: no NOTIFY sent in the window"
		return
	}
	fig "$1.stmts.$2" "$stmts"
	fig "$1.cpu.$2" "$cpu"
	fig "$1.rate.$2" "$rate"
}

# bench_scale_idle MODE: 10e (transaction), 10f (lease). SCALE_DAEMONS daemons of
# SCALE_QUEUES queues each (the same names q01, q02, ... in every daemon; concurrency 1;
# command true), nothing queued. Once every queue of every daemon waits for a wake-up (a
# row in pgjobd.waiting each) and a poll_interval and a second more have passed (the
# first claims make the orphan pass), three windows of SCALE_IDLE_SECS, a multiple of
# poll_interval, so that each daemon's timers fire as often in every window: nothing
# happens; the role stranger NOTIFYs for a queue nobody waits for (a payload no queue
# has); the same for queue q01, whose payload it learned by LISTEN while a job was
# inserted there. Figures per second and per NOTIFY, against the quiet window.
bench_scale_idle() {
	local mode=$1 key=idle.$1 nd=$SCALE_DAEMONS nq=$SCALE_QUEUES want base win payload lpid
	local calls claims cpu secs sent
	[ -n "$PGSS_LIB" ] || return 0
	scale_server "$SCALE_MAX_CONN"
	reset_tables
	sql "TRUNCATE pgjobd.waiting" >/dev/null
	[ "$(sql "SELECT count(*) FROM pg_roles WHERE rolname = 'stranger'")" = 1 ] ||
		sql "CREATE ROLE stranger LOGIN" >/dev/null
	scale_up "$key" "$nd" "$mode" 1 "$nq" true
	want=$((nd * nq))
	if ! wait_until 120 "[ \"\$(psql_q 'SELECT count(*) FROM pgjobd.waiting')\" -ge $want ]"; then
		problem "rep $REP: idle $mode: $(psql_q 'SELECT count(*) FROM pgjobd.waiting') of $want queues waiting after 120 s"
		scale_down "$key"
		return
	fi
	sleep $((SCALE_POLL_S + 1))
	if ! scale_alive "$key"; then
		scale_down "$key"
		return
	fi
	fig "scale.idle.sessions.$mode" "$(ratio "$(psql_q "SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'pgjobd %'")" "$nd")"
	mon_start
	base=$(idle_window "$SCALE_IDLE_SECS")
	read -r calls claims cpu secs sent <<<"$base"
	[ "$REP" = 1 ] && scale_dump "idle: $nd daemons x $nq queues, lock mode $mode: a ${secs}s window" \
		"$(calc "$nd * $secs")" "per daemon per second"
	fig "scale.idle.stmts.$mode" "$(calc "$calls / $secs")"
	fig "scale.idle.stmts_daemon.$mode" "$(calc "$calls / $secs / $nd")"
	fig "scale.idle.claims.$mode" "$(calc "$claims / ($secs / $SCALE_POLL_S) / ($nd * $nq)")"
	fig "scale.idle.other.$mode" "$(calc "($calls - $claims) / ($secs / $SCALE_POLL_S) / $nd")"
	fig "scale.idle.pgcpu.$mode" "$(calc "$cpu * 1000 / $secs")"
	# NOTIFYs for a queue nobody waits for.
	notify_start 0000000000000000000000000000000000000000000000000000000000000000
	win=$(idle_window "$SCALE_IDLE_SECS")
	notify_stop
	notify_cost scale.notify.other "$mode" "$base" "$win"
	read -r calls claims cpu secs sent <<<"$win"
	[ "$REP" = 1 ] && scale_dump "the same, while a stranger sent $sent NOTIFYs for a queue nobody waits for" \
		"$(calc "$nd * $secs")" "per daemon per second"
	# The stranger learns q01's payload by LISTEN while a job is inserted there.
	psql -X -U stranger -c "LISTEN pgjobd" -c "SELECT pg_sleep(3)" >"$T/scale-listen.out" 2>&1 &
	lpid=$!
	wait_until 10 "[ \"\$(psql_q \"SELECT count(*) FROM pg_stat_activity WHERE usename = 'stranger'\")\" = 1 ]"
	sql "INSERT INTO pgjobd.jobs (queue) VALUES ('q01')" >/dev/null
	wait "$lpid"
	payload=$(sed -n 's/.*with payload "\([0-9a-f]*\)".*/\1/p' "$T/scale-listen.out" | head -n 1)
	if [ -z "$payload" ]; then
		problem "rep $REP: idle $mode: no wake-up payload for q01 ($(head -c 200 "$T/scale-listen.out"))"
	elif wait_until 30 "[ \"\$(count_jobs \"queue = 'q01' AND status = 'succeeded'\")\" = 1 ]" &&
		wait_until 30 "[ \"\$(psql_q 'SELECT count(*) FROM pgjobd.waiting')\" -ge $want ]"; then
		sleep $((SCALE_POLL_S + 1))
		notify_start "$payload"
		win=$(idle_window "$SCALE_IDLE_SECS")
		notify_stop
		notify_cost scale.notify.waited "$mode" "$base" "$win"
		read -r calls claims cpu secs sent <<<"$win"
		[ "$REP" = 1 ] && scale_dump "the same, while a stranger sent $sent NOTIFYs for q01, which every daemon waits for" \
			"$(calc "$nd * $secs")" "per daemon per second"
	else
		problem "rep $REP: idle $mode: the job in q01 did not run, or the daemons did not wait again"
	fi
	mon_stop >/dev/null
	scale_alive "$key"
	scale_down "$key"
}

# ---------------------------------------------------------------- 11. flow control

# bench_limit_burst tx|lease none|limit: the burst case (2c, ungrouped) with the queue's
# global concurrency limit equal to the daemon's slots, or with no limit, in the same
# repetition: what a limit that never binds costs (the claims take turns on the limits
# row and count the running jobs; the quick path is not taken).
bench_limit_burst() {
	local mode=$1 lim=$2 key conf t0 n secs calls pm pg0 pg1
	key=limits.burst.$mode.$lim conf=$W/tput.ini
	[ "$mode" = lease ] && conf=$W/tput-lease.ini
	reset_tables
	sql "TRUNCATE pgjobd.waiting; DELETE FROM pgjobd.queue_limits" >/dev/null
	[ "$lim" = limit ] && sql "SELECT pgjobd.set_limits('tput', concurrency => $CONCURRENCY)" >/dev/null
	daemon_up "limits-burst-$mode-$lim-$REP" "$conf"
	if ! wait_until 30 "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.waiting WHERE queue = 'tput'\")\" = 1 ] || ! pid_alive $DAEMON" ||
		! pid_alive "$DAEMON"; then
		problem "rep $REP: limits burst $mode $lim: the daemon never waited for work"
		daemon_down
		return
	fi
	stats_reset
	pm=$(head -n 1 "$T/pg/postmaster.pid")
	pg0=$(cpu_s "$pm" children)
	t0=$(sql "INSERT INTO pgjobd.jobs (queue) SELECT 'tput' FROM generate_series(1, $N_JOBS);
		SELECT extract(epoch FROM clock_timestamp())")
	wait_drained tput && calls=$(stats_calls)
	daemon_down
	wait_until 10 "! pgrep -P $pm -f 'postgres: postgres pgjobd_test' >/dev/null"
	pg1=$(cpu_s "$pm" children)
	sql "DELETE FROM pgjobd.queue_limits" >/dev/null
	IFS='|' read -r n secs < <(sql "SELECT count(*), max(extract(epoch FROM finished_at)) - $t0
		FROM pgjobd.jobs WHERE queue = 'tput' AND status = 'succeeded'")
	if [ "$n" != "$N_JOBS" ]; then
		problem "rep $REP: limits burst $mode $lim: $n of $N_JOBS jobs succeeded; no figures from this run"
		return
	fi
	fig "$key" "$(ratio "$n" "$secs")"
	[ -n "$pg0" ] && [ -n "$pg1" ] && fig "limits.pgcpu.$mode.$lim" "$(calc "($pg1 - $pg0) * 1000 / $n")"
	[ -n "$PGSS_LIB" ] && [ -n "$calls" ] && fig "limits.stmts.$mode.$lim" "$(ratio "$calls" "$n")"
	return 0
}

# bench_limit_rate: a rate of LIMIT_RATE/1s over LIMIT_RATE_SECS seconds with 3 daemons
# (transaction mode, 8 slots each), a backlog that never runs dry; the commands stamp
# their start (date +%s%N). Figures: starts per second from the first to the last
# stamp, its ratio to the rate, the most starts in any window of 1 s, and the jobs given
# back because their start would have come late.
declare -A RATE_PIDS
bench_limit_rate() {
	local n d stamps=$W/rate.stamps.$REP per worst gave span
	reset_tables
	sql "TRUNCATE pgjobd.waiting; DELETE FROM pgjobd.queue_limits" >/dev/null
	: >"$stamps"
	n=$((LIMIT_RATE * LIMIT_RATE_SECS))
	sql "SELECT pgjobd.set_limits('rate', rate => '$LIMIT_RATE/1s')" >/dev/null
	for d in 1 2 3; do
		cat >"$W/rate$d.ini" <<EOF
$(conf_header log_level=info poll_interval=2s)

[queue.rate]
command = date +%s%N >>'$stamps'
concurrency = 8
EOF
		start_daemon "rate$d-$REP" "$W/rate$d.ini"
		RATE_PIDS[$d]=$DAEMON_PID
	done
	sql "INSERT INTO pgjobd.jobs (queue) SELECT 'rate' FROM generate_series(1, $n)" >/dev/null
	poll_until $((LIMIT_RATE_SECS * 2 + 60)) "[ \"\$(psql_q \"SELECT count(*) FROM pgjobd.jobs WHERE queue = 'rate' AND status <> 'succeeded'\")\" = 0 ]" ||
		problem "rep $REP: rate: not every job succeeded"
	for d in 1 2 3; do
		stop_daemon "${RATE_PIDS[$d]}" 60 >/dev/null
	done
	gave=$(cat "$T"/rate[123]-"$REP".log | grep -c 'planned start missed')
	sql "DELETE FROM pgjobd.queue_limits" >/dev/null
	span=$(sort -n "$stamps" | awk 'NR == 1 { a = $1 } { b = $1 } END { if (NR > 1) printf "%.6f", (b - a) / 1e9 }')
	[ "$(wc -l <"$stamps")" -ge "$n" ] || problem "rep $REP: rate: $(wc -l <"$stamps") of $n starts stamped"
	per=$(calc "($(wc -l <"$stamps") - 1) / $span")
	worst=$(sort -n "$stamps" | awk '{ ts[n] = $1 / 1e6; c = 0; for (j = n; j >= 0 && ts[n] - ts[j] < 1000; j--) c++; n++; if (c > w) w = c } END { print w + 0 }')
	fig limits.rate.per_s "$per"
	fig limits.rate.ratio "$(calc "$per / $LIMIT_RATE")"
	fig limits.rate.worst "$worst"
	fig limits.rate.gave_back "$gave"
}

# bench_limit_claim none|limit|counts: claims over 1,000 groups (N_LIMIT_JOBS jobs, 16
# slots of `true`, transaction mode), with every limit set but none binding (concurrency
# 100,000, group_concurrency 3, rate 100,000/1s, group_rate 1,000/1s), with the two
# counting limits alone (counts: the concurrencies, no rate), or none: the claim
# statements' server time per job (pg_stat_statements), and to tell a claim's own cost
# from how many jobs each claim carries, the server time per claim statement and the
# jobs per statement; under the rates, how many late starts moved them on (rate_late
# statements, their time not counted above).
bench_limit_claim() {
	local lim=$1 ms n st calls call_ms moves
	reset_tables
	sql "TRUNCATE pgjobd.waiting; DELETE FROM pgjobd.queue_limits; DELETE FROM pgjobd.group_rates" >/dev/null
	fill tput "$N_LIMIT_JOBS" 1000
	[ "$lim" = limit ] && sql "SELECT pgjobd.set_limits('tput', concurrency => 100000, group_concurrency => 3,
		rate => '100000/1s', group_rate => '1000/1s')" >/dev/null
	[ "$lim" = counts ] && sql "SELECT pgjobd.set_limits('tput', concurrency => 100000,
		group_concurrency => 3)" >/dev/null
	stats_reset
	daemon_up "limits-claim-$lim-$REP" "$W/tput.ini"
	wait_drained tput
	ms=$(psql_q "SELECT round((sum(total_exec_time) / $N_LIMIT_JOBS)::numeric, 6) FROM pg_stat_statements
		WHERE userid = 'postgres'::regrole AND query LIKE '/* pgjobd claim */%'")
	# calls|ms a call|rate_late calls
	st=$(psql_q "SELECT sum(calls) FILTER (WHERE query LIKE '/* pgjobd claim */%') || '|' ||
			round((sum(total_exec_time) FILTER (WHERE query LIKE '/* pgjobd claim */%')
			       / sum(calls) FILTER (WHERE query LIKE '/* pgjobd claim */%'))::numeric, 6) || '|' ||
			coalesce(sum(calls) FILTER (WHERE query LIKE '%pgjobd.rate_late(%'), 0)
		FROM pg_stat_statements WHERE userid = 'postgres'::regrole")
	daemon_down
	sql "DELETE FROM pgjobd.queue_limits" >/dev/null
	n=$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE queue = 'tput' AND status = 'succeeded'")
	[ "$n" = "$N_LIMIT_JOBS" ] || {
		problem "rep $REP: limits claim $lim: $n of $N_LIMIT_JOBS jobs succeeded"
		return
	}
	[ -n "$PGSS_LIB" ] || return
	fig "limits.claim_ms.$lim" "$ms"
	IFS='|' read -r calls call_ms moves <<<"$st"
	[ -n "$calls" ] && [ "$calls" -gt 0 ] || return
	fig "limits.claim_jobs.$lim" "$(ratio "$N_LIMIT_JOBS" "$calls")"
	fig "limits.claim_call_ms.$lim" "$call_ms"
	if [ "$lim" = limit ]; then
		fig limits.claim_moves "$moves"
	fi
}

# bench_limit_claim_alone: the claim statement alone, no daemon: the statement the daemon
# prepares (sql/claim.sql, printed by $CLAIM_SQL after the settings of the daemon's
# claiming sessions, so that it is planned as there), sent by one psql session for 4 slots
# at a time over two queues of N_LIMIT_JOBS jobs in 1,000 groups, one with every limit
# set as in bench_limit_claim and one with none, in turn, each claim's jobs marked
# succeeded before the next: the client's time per job of each queue's claim statements
# (psql \timing of the EXECUTE, each in a transaction of its own, so its commit's flush
# apart, less the time of a SELECT 1 in the same turn: the round trip on a local socket
# and psql's own part). The two queues take turns in one session so that the machine's
# moods fall on both alike; through the daemon (above) the claims also carry fewer jobs
# each when a rate holds planned starts back.
bench_limit_claim_alone() {
	local wid slots n none limit
	[ -x "${CLAIM_SQL:-}" ] || {
		problem "CLAIM_SQL not set: 11c's claim statement alone skipped"
		return
	}
	reset_tables
	sql "TRUNCATE pgjobd.waiting; DELETE FROM pgjobd.queue_limits; DELETE FROM pgjobd.group_rates" >/dev/null
	sql "INSERT INTO pgjobd.jobs (queue, group_id) SELECT q, 'g' || (i % 1000)
	       FROM generate_series(1, $N_LIMIT_JOBS) i, (VALUES ('alone_n'), ('alone_l')) v(q)" >/dev/null
	sql "VACUUM ANALYZE pgjobd.jobs" >/dev/null
	sql "SELECT pgjobd.set_limits('alone_l', concurrency => 100000, group_concurrency => 3,
		rate => '100000/1s', group_rate => '1000/1s')" >/dev/null
	wid=$(sql "SELECT pgjobd.register_worker('bench:alone', 36000000, '{alone_n,alone_l}')")
	slots='{s1,s2,s3,s4}'
	{
		"$CLAIM_SQL" || harness_fail "$CLAIM_SQL failed"
		echo '\timing on'
		for ((n = 0; n < N_LIMIT_JOBS / 4; n++)); do
			echo "BEGIN;"
			echo "EXECUTE qc('alone_n', $wid, '$slots', 5, 0, 1048576, 1000, false, '{}', NULL);"
			echo "COMMIT;"
			echo "BEGIN;"
			echo "EXECUTE qc('alone_l', $wid, '$slots', 5, 0, 1048576, 1000, false, '{}', NULL);"
			echo "COMMIT;"
			echo "UPDATE pgjobd.jobs SET status = 'succeeded', finished_at = now() WHERE status = 'running';"
			echo "SELECT 1;"
		done
	} >"$W/alone.sql"
	psql -X -qAt -v ON_ERROR_STOP=1 -f "$W/alone.sql" >"$W/alone.out" || harness_fail "claims alone failed"
	n=$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE queue LIKE 'alone_%' AND status = 'succeeded'")
	sql "DELETE FROM pgjobd.queue_limits; DELETE FROM pgjobd.jobs WHERE queue LIKE 'alone_%'" >/dev/null
	[ "$n" = $((2 * N_LIMIT_JOBS)) ] || {
		problem "rep $REP: limits claim alone: $n of $((2 * N_LIMIT_JOBS)) jobs succeeded"
		return
	}
	# Each claim less the turn's SELECT 1 (the round trip and psql's part): the 2nd and
	# 5th of a turn's eight timings, less the 8th.
	read -r none limit < <(grep '^Time:' "$W/alone.out" | awk -v n="$N_LIMIT_JOBS" '
		NR % 8 == 2 { a += $2 } NR % 8 == 5 { b += $2 } NR % 8 == 0 { a -= $2; b -= $2 }
		END { printf "%.6f %.6f\n", a / n, b / n }')
	fig limits.alone_ms.none "$none"
	fig limits.alone_ms.limit "$limit"
}

only() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

# ---------------------------------------------------------------- setup

log "pgjobd bench: $REPS repetitions$([ "$QUICK" = 1 ] && echo ", BENCH_QUICK=1"); results in $OUT"
CLK_TCK=$(getconf CLK_TCK)
PG_BINDIR=$(find_pg_bindir) || harness_fail "initdb/pg_ctl not found"
if [ -e "$PG_BINDIR/../lib/pg_stat_statements.so" ] || [ -e "$("$PG_BINDIR/pg_config" --pkglibdir 2>/dev/null)/pg_stat_statements.so" ]; then
	PGSS_LIB=pg_stat_statements
else
	problem "pg_stat_statements not available: 6c (statements per job) skipped"
fi
[ -x "$PG_BINDIR/pgbench" ] || harness_fail "pgbench not found in $PG_BINDIR"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
pg_start
# The disk's synchronous write latency bounds every commit under default durability:
# 200 8 KiB O_DSYNC writes next to the data directory (like one WAL flush each).
DSYNC_MS=$(dd if=/dev/zero of="$T/dsync.test" bs=8k count=200 oflag=dsync 2>&1 >/dev/null |
	sed -n 's/.* copied, \([0-9.]*\) s.*/\1/p' | awk '{ printf "%.3f", $1 * 1000 / 200 }')
rm -f "$T/dsync.test"
W=$T/bench
mkdir -p "$W"
: >"$W/defs"
: >"$W/figs"
: >"$W/void"
PGUSER=postgres sql "CREATE ROLE bench SUPERUSER LOGIN" >/dev/null
[ -n "$PGSS_LIB" ] && PGUSER=postgres sql "CREATE EXTENSION pg_stat_statements" >/dev/null
export PGUSER=bench

# Machine and server, printed and kept for the JSON.
M_CORES=$(nproc)
M_CPU=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
[ -n "$M_CPU" ] || M_CPU=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ { print $2; exit }')
M_KERNEL=$(uname -r)
M_MEM_MIB=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 }' /proc/meminfo)
PG_VERSION=$(sql "SHOW server_version")
# Read-only (GIT_OPTIONAL_LOCKS=0: --dirty must not refresh the index of a shared checkout).
PGJOBD_DESCRIBE=$(GIT_OPTIONAL_LOCKS=0 git -C "$repo" describe --always --tags --dirty 2>/dev/null || echo unknown)
PGJOBD_VERSION=$("$PGJOBD" --version 2>/dev/null | head -n 1)
PG_SETTINGS_LIST="fsync synchronous_commit full_page_writes wal_sync_method wal_level shared_buffers
	max_wal_size checkpoint_timeout max_connections shared_preload_libraries autovacuum"
# shellcheck disable=SC2086 # the list is split into names on purpose
PG_SETTINGS=$(sql "SELECT string_agg(name || '=' || current_setting(name), ' ' ORDER BY name)
	FROM pg_settings WHERE name IN ($(printf "'%s'," $PG_SETTINGS_LIST | sed 's/,$//'))")
DATA_FS=$(df -PT "$T" | awk 'NR == 2 { print $2 " on " $1 }')

conf_header >"$W/migrate.ini"
"$PGJOBD" migrate -c "$W/migrate.ini" >"$T/migrate.log" 2>&1 || {
	cat "$T/migrate.log" >&2
	harness_fail "pgjobd migrate failed"
}

# Configurations. log_level = warn: a line per job at info is a cost of its own.
cat >"$W/tput.ini" <<EOF
$(conf_header log_level=warn poll_interval=2s)

[queue.tput]
command = true
concurrency = $CONCURRENCY
EOF
cat >"$W/tput-lease.ini" <<EOF
$(conf_header log_level=warn poll_interval=2s)

[queue.tput]
command = true
concurrency = $CONCURRENCY
lock_mode = lease
EOF
cat >"$W/backlog.ini" <<EOF
$(conf_header log_level=warn poll_interval=2s)

[queue.backlog]
command = true
concurrency = $CONCURRENCY
EOF
cat >"$W/foot.ini" <<EOF
$(conf_header log_level=warn poll_interval=2s shutdown_grace=30s)

[queue.foot]
command = sleep $FOOT_SLEEP
concurrency = $FOOT_SLOTS
EOF
cat >"$W/enq-ungrouped.sql" <<'EOF'
INSERT INTO pgjobd.jobs (queue) VALUES ('enqueue');
EOF
cat >"$W/enq-grouped.sql" <<EOF
\set g random(1, $ENQ_GROUPS)
INSERT INTO pgjobd.jobs (queue, group_id) VALUES ('enqueue', 'g' || :g);
EOF

# The table, in order. Labels start with the measurement's number from the README.
section "1. ceiling"
def ceiling "1  spawn+reap sh -c true, $CONCURRENCY in flight" spawns/s 1 ""
def busy.ceiling "1  share of the machine's cores busy" ratio 2 ""
def mcpu.ceiling "1  the machine's CPU per spawn (all processes)" ms 3 ""
section "2. throughput: $N_JOBS jobs 'true', concurrency $CONCURRENCY"
def tput.ungrouped "2a ungrouped" jobs/s 1 ""
def ratio.ungrouped "2a ungrouped / ceiling" ratio 3 "$TGT_RATIO_CEILING"
def tput.grouped "2b $N_GROUPS groups" jobs/s 1 ""
def ratio.grouped "2b grouped / ceiling" ratio 3 "$TGT_RATIO_GROUPED"
section "2c. the burst case: the daemon waits, then $N_JOBS jobs in one INSERT, no VACUUM/ANALYZE"
for m in tx lease; do
	for v in ungrouped grouped; do
		ml=transaction tgt=$TGT_BURST_TX
		[ $m = lease ] && ml=lease tgt=$TGT_BURST_LEASE
		def "tput.burst.$m.$v" "2c $ml, $v" jobs/s 1 ""
		def "ratio.burst.$m.$v" "2c $ml, $v / ceiling" ratio 3 "$tgt"
		def "cpubound.burst.$m.$v" "2c $ml, $v: most / ceiling the CPU allows (every core busy)" ratio 3 ""
		def "busy.burst.$m.$v" "2c $ml, $v: share of what the CPU allows (cores busy)" ratio 2 "$TGT_CPUBOUND"
		def "pgcpu.burst.$m.$v" "2c $ml, $v: PostgreSQL CPU per job" ms 3 "$([ $m = lease ] && echo "$TGT_PGCPU_LEASE" || echo "$TGT_PGCPU_TX")"
		def "cpu.burst.$m.$v" "2c $ml, $v: daemon CPU per job" ms 3 "$TGT_DAEMON_CPU"
		def "stmts.burst.$m.$v" "2c $ml, $v: SQL statements per job" stmts 2 ""
	done
done
section "3. pickup latency: $N_PICKUP INSERTs to an idle daemon (poll 30s)"
def pickup.missing "3  INSERTs not picked up within 30 s" jobs 0 "<= 0"
def pickup.p50 "3  p50 INSERT return -> command start" ms 2 "$TGT_PICKUP_P50"
def pickup.p99 "3  p99" ms 2 "$TGT_PICKUP_P99"
def pickup.max "3  max" ms 2 "$TGT_PICKUP_MAX"
def pickup.claims "3  claims per job (idle daemon)" calls 2 ""
def pickup.srv.claim "3  server, per job: the claim statements" ms 3 ""
def pickup.srv.hold "3  server, per job: the hold's lock statements" ms 3 ""
def pickup.srv.outcome "3  server, per job: the outcome" ms 3 ""
def pickup.srv.all "3  server, per job: all the daemon's statements" ms 3 ""
def pickup.stmts "3  the daemon's statements per job" stmts 2 ""
def pickup.trace.n "3t under strace, $N_PTRACE INSERTs: traced whole" jobs 0 ""
def pickup.trace.notify_claim "3t p50 NOTIFY read -> claim sent" ms 3 ""
def pickup.trace.claim_answer "3t p50 claim sent -> its answer read" ms 3 ""
def pickup.trace.answer_clone "3t p50 answer read -> clone (the hold between)" ms 3 ""
def pickup.trace.clone_exec "3t p50 clone -> /bin/sh exec'd" ms 3 ""
def pickup.trace.total "3t p50 NOTIFY read -> /bin/sh exec'd" ms 3 ""
section "3b. pickup step by step: 3 again at log_level = debug (msg=\"pickup\"), p50 of each step"
for m in tx lease; do
	ml=transaction
	[ $m = lease ] && ml=lease
	def "steps.$m.notify" "3b $ml: NOTIFY read -> claim sent" ms 3 ""
	def "steps.$m.claim" "3b $ml: claim sent -> its answer read" ms 3 ""
	def "steps.$m.hold" "3b $ml: answer -> hold's answer (slot's locks)" ms 3 ""
	def "steps.$m.spawn" "3b $ml: hold -> command exec'd" ms 3 ""
	def "steps.$m.total" "3b $ml: INSERT return -> command start, this run" ms 2 ""
done
section "4. backlog: claim rate, $N_SMALL jobs/$G_SMALL groups vs $N_LARGE/$G_LARGE"
def backlog.small "4  small backlog, drained" jobs/s 1 ""
def backlog.large "4  large backlog, first $N_LARGE_STOP" jobs/s 1 ""
def backlog.ratio "4  large / small" ratio 3 "$TGT_BACKLOG_RATIO"
def backlog.claim_ms.small "4  claim execution, small backlog" ms/call 3 ""
def backlog.claim_ms.large "4  claim execution, large backlog" ms/call 3 ""
def backlog.wal.small "4  WAL per job, small backlog" bytes 0 ""
def backlog.wal.large "4  WAL per job, large backlog" bytes 0 ""
section "5. enqueue: pgbench -c $ENQ_CLIENTS -T $ENQ_SECS, one-row INSERT per transaction"
def enq.ungrouped.on "5  ungrouped, triggers on" tps 0 ""
def enq.ungrouped.off "5  ungrouped, triggers off" tps 0 ""
def enq.ungrouped.ratio "5  ungrouped on / off" ratio 3 "$TGT_ENQ_RATIO"
def enq.ungrouped.waiting "5  ungrouped, triggers on, a daemon waits elsewhere" tps 0 ""
def enq.ungrouped.waiting_ratio "5  that / off" ratio 3 ""
def enq.grouped.on "5  grouped (g1..g$ENQ_GROUPS), triggers on" tps 0 ""
def enq.grouped.off "5  grouped, triggers off" tps 0 ""
def enq.grouped.ratio "5  grouped on / off" ratio 3 "$TGT_ENQ_RATIO"
section "6. daemon footprint"
def rss.daemon "6a peak RSS, daemon, $FOOT_SLOTS slots busy" MiB 2 "$TGT_RSS_DAEMON"
def rss.guard "6a peak RSS, guard process" MiB 2 "$TGT_RSS_GUARD"
def cpu.ungrouped "6b daemon CPU (own, not children), 2a" s/1000jobs 3 "$TGT_CPU"
def cpu.grouped "6b daemon CPU (own, not children), 2b" s/1000jobs 3 "$TGT_CPU"
def cmdcpu.ungrouped "6b  for comparison: commands' CPU, 2a" s/1000jobs 3 ""
def pgcpu.ungrouped "6b  for comparison: PostgreSQL backends' CPU, 2a" s/1000jobs 3 ""
def pgcpu.grouped "6b  for comparison: PostgreSQL backends' CPU, 2b" s/1000jobs 3 ""
def stmts.ungrouped "6c SQL statements per job, 2a" stmts 2 "$TGT_STMTS"
def stmts.grouped "6c SQL statements per job, 2b" stmts 2 "$TGT_STMTS"
def wal.ungrouped "6c WAL per job, 2a" bytes 0 "$TGT_WAL"
def wal.grouped "6c WAL per job, 2b" bytes 0 "$TGT_WAL"
def trips.db "6d round trips to PostgreSQL per job ($N_STRACE jobs)" trips 2 "$TGT_TRIPS"
def sends.db "6d sends to PostgreSQL per job" sends 2 ""
def sends.guard "6d messages to the guard per job" msgs 2 ""
def sends.pipe "6d writes to command stdin per job" writes 2 ""
section "7. a claim over $N_HELD groups held back by a retry (a ready job behind each head)"
def held.none.job "7  taking a job, no held groups" ms/call 3 ""
def held.held.job "7  taking a job, $N_HELD held groups ahead of it" ms/call 3 ""
def held.ratio.job "7  claim with $N_HELD held groups / with none" ratio 3 "$TGT_HELD_RATIO"
def held.none.idle "7  finding nothing, empty queue" ms/call 3 ""
def held.held.idle "7  finding nothing, $N_HELD held groups" ms/call 3 ""
def held.ratio.idle "7  finding nothing: held / empty queue" ratio 3 "$TGT_HELD_RATIO"
def held.buffers.idle "7  buffers, finding nothing: held / empty" ratio 3 "$TGT_HELD_RATIO"
def held.wal.job "7  WAL per claim taking a job, held groups" bytes 0 ""
def held.wal.idle "7  WAL per claim finding nothing, held groups" bytes 0 ""
def held.warm.ms "7  first $((N_HELD / 1000 + 5)) claims, taking the groups out" ms 0 ""
def held.warm.wal "7  WAL of those claims (after a CHECKPOINT)" KiB 0 ""
section "7b. $N_BO_JOBS jobs in $N_BO_GROUPS groups, the first $N_BO_HELD groups' heads in a backoff: claim rate"
def backoff.transaction.free "7b nothing held, first $N_BO_STOP" jobs/s 1 ""
def backoff.transaction.held "7b $N_BO_HELD groups held, first $N_BO_STOP" jobs/s 1 ""
def backoff.ratio.transaction.held "7b held / nothing held" ratio 3 "$TGT_BO_RATIO"
def backoff.transaction.marked "7b held, marked beforehand" jobs/s 1 ""
def backoff.ratio.transaction.marked "7b marked beforehand / nothing held" ratio 3 ""
def backoff.claim_ms.transaction.free "7b claim execution, nothing held" ms/call 3 ""
def backoff.claim_ms.transaction.held "7b claim execution, held" ms/call 3 ""
def backoff.claim_ms.transaction.marked "7b claim execution, marked beforehand" ms/call 3 ""
def backoff.lease.free "7b lease: nothing held" jobs/s 1 ""
def backoff.lease.held "7b lease: $N_BO_HELD groups held" jobs/s 1 ""
def backoff.ratio.lease.held "7b lease: held / nothing held" ratio 3 "$TGT_BO_RATIO"
def backoff.lease.marked "7b lease: held, marked beforehand" jobs/s 1 ""
def backoff.ratio.lease.marked "7b lease: marked beforehand / nothing held" ratio 3 ""
def backoff.claim_ms.lease.free "7b lease: claim execution, nothing held" ms/call 3 ""
def backoff.claim_ms.lease.held "7b lease: claim execution, held" ms/call 3 ""
def backoff.claim_ms.lease.marked "7b lease: claim execution, marked beforehand" ms/call 3 ""
section "8. lock mode lease: 2 and 3 again with lock_mode = lease"
def tput.lease.ungrouped "8a ungrouped" jobs/s 1 ""
def ratio.lease.ungrouped "8a ungrouped / ceiling" ratio 3 "$TGT_LEASE_CEILING"
def tput.lease.grouped "8b $N_GROUPS groups" jobs/s 1 ""
def ratio.lease.grouped "8b grouped / ceiling" ratio 3 "$TGT_LEASE_CEILING"
def sessions.lease.ungrouped "8  the daemon's sessions, concurrency $CONCURRENCY" sessions 0 "$TGT_LEASE_SESSIONS"
def lease.pickup.missing "8c INSERTs not picked up within 30 s" jobs 0 "<= 0"
def lease.pickup.p50 "8c p50 INSERT return -> command start" ms 2 "$TGT_LEASE_P50"
def lease.pickup.p99 "8c p99" ms 2 "$TGT_PICKUP_P99"
def lease.pickup.max "8c max" ms 2 ""
def lease.pickup.claims "8c claims per job (idle daemon)" calls 2 ""
def lease.pickup.srv.claim "8c server, per job: the claim statements" ms 3 ""
def lease.pickup.srv.outcome "8c server, per job: the outcome (finish_leases)" ms 3 ""
def lease.pickup.srv.all "8c server, per job: all the daemon's statements" ms 3 ""
def lease.pickup.stmts "8c the daemon's statements per job" stmts 2 ""
def lease.pickup.trace.n "8t under strace, $N_PTRACE INSERTs: traced whole" jobs 0 ""
def lease.pickup.trace.notify_claim "8t p50 NOTIFY read -> claim sent" ms 3 ""
def lease.pickup.trace.claim_answer "8t p50 claim sent -> its answer read" ms 3 ""
def lease.pickup.trace.answer_clone "8t p50 answer read -> clone" ms 3 ""
def lease.pickup.trace.clone_exec "8t p50 clone -> /bin/sh exec'd" ms 3 ""
def lease.pickup.trace.total "8t p50 NOTIFY read -> /bin/sh exec'd" ms 3 ""
def lease.floor.missing "8d INSERTs not picked up within 30 s" jobs 0 "<= 0"
def lease.floor.p50 "8d p50, no daemon: the floor of 8c" ms 2 ""
def lease.floor.p99 "8d p99" ms 2 ""
def lease.floor.max "8d max" ms 2 ""
def cpu.lease.ungrouped "8  daemon CPU (own), 8a" s/1000jobs 3 ""
def pgcpu.lease.ungrouped "8  PostgreSQL backends' CPU, 8a" s/1000jobs 3 ""
def stmts.lease.ungrouped "8  SQL statements per job, 8a" stmts 2 ""
def wal.lease.ungrouped "8  WAL per job, 8a" bytes 0 ""
def busy.lease.ungrouped "8  share of the machine's cores busy, 8a" ratio 2 ""
def mcpu.lease.ungrouped "8  the machine's CPU per job (all processes), 8a" ms 3 ""
def cpubound.lease.ungrouped "8  most 8a / ceiling the CPU allows (every core busy)" ratio 3 ""
def busy.lease.grouped "8  share of the machine's cores busy, 8b" ratio 2 ""
def mcpu.lease.grouped "8  the machine's CPU per job (all processes), 8b" ms 3 ""
def cpubound.lease.grouped "8  most 8b / ceiling the CPU allows (every core busy)" ratio 3 ""
section "9. timers: schedule ticks ($N_TICKS, 1 a second), cancels ($N_CANCEL), watchdog (${WD_SECS}s)"
def tick.p50 "9a p50 tick -> its job created" ms 1 ""
def tick.max "9a max" ms 1 "$TGT_TICK_LATE"
def tick.min "9a min (never negative: not before the tick)" ms 1 ">= 0"
def lease.tick.p50 "9b p50 tick -> job, lock mode lease (lease session)" ms 1 ""
def lease.tick.max "9b max" ms 1 "$TGT_TICK_LATE"
def lease.tick.min "9b min (never negative)" ms 1 ">= 0"
def cancel.p50 "9c p50 pgjobd.cancel() -> outcome cancelled" ms 1 ""
def cancel.max "9c max" ms 1 "$TGT_CANCEL"
def watchdog.interval "9d mean interval of WATCHDOG=1 (aim: 500)" ms 1 ""
def watchdog.gap "9d longest gap between WATCHDOG=1" ms 1 "$TGT_WD_GAP"
section "10. many daemons on one server (max_connections $SCALE_MAX_CONN): $N_SCALE jobs 'sleep $SCALE_SLEEP', $((SCALE_DAEMONS * SCALE_SLOTS)) slots (at most $((SCALE_DAEMONS * SCALE_SLOTS / SCALE_SLEEP)) jobs/s)"
for m in transaction lease; do
	for s in many one; do
		if [ "$m.$s" = transaction.many ]; then l=10a; elif [ "$m.$s" = transaction.one ]; then l=10b; elif [ "$s" = many ]; then l=10c; else l=10d; fi
		if [ "$s" = many ]; then d="$SCALE_DAEMONS daemons x $SCALE_SLOTS slots"; else d="1 daemon x $((SCALE_DAEMONS * SCALE_SLOTS)) slots"; fi
		def "scale.tput.$m.$s" "$l $m, $d" jobs/s 1 ""
		def "scale.pgcpu_steady.$m.$s" "$l  PostgreSQL backends' CPU per job, steady" ms 3 ""
		def "scale.pgcpu.$m.$s" "$l  the same, whole run (connections too)" ms 3 ""
		def "scale.stmts_steady.$m.$s" "$l  SQL statements per job, steady" stmts 2 ""
		def "scale.stmts.$m.$s" "$l  the same, whole run" stmts 2 ""
		def "scale.sessions.$m.$s" "$l  sessions per daemon (steady state)" sessions 1 "$([ "$m" = lease ] && echo "$TGT_SCALE_LEASE_SESSIONS")"
		def "scale.claim_p99.$m.$s" "$l  p99 claim sent -> command start (metrics)" ms 2 ""
		def "scale.claim_exec.$m.$s" "$l  claim statement's execution, mean" ms 3 ""
		def "scale.claim_max.$m.$s" "$l  claim statement's execution, max" ms 2 ""
		def "scale.lockwaits.$m.$s" "$l  sessions waiting for a lock, mean of samples" sessions 2 ""
		def "scale.lockmax.$m.$s" "$l  the same, most in one sample" sessions 0 ""
	done
	l=$([ "$m" = lease ] && echo 10c/d || echo 10a/b)
	def "scale.pgcpu_ratio_steady.$m" "$l server CPU per job, $SCALE_DAEMONS daemons / 1, steady" ratio 2 "$TGT_SCALE_PGCPU"
	def "scale.pgcpu_ratio.$m" "$l  the same, whole run" ratio 2 ""
done
section "10. idle: $SCALE_DAEMONS daemons x $SCALE_QUEUES queues, nothing queued, poll_interval ${SCALE_POLL_S}s, ${SCALE_IDLE_SECS}s windows"
for m in transaction lease; do
	l=$([ "$m" = lease ] && echo 10f || echo 10e)
	def "scale.idle.sessions.$m" "$l $m: sessions per daemon" sessions 1 "$([ "$m" = lease ] && echo "$TGT_SCALE_LEASE_SESSIONS")"
	def "scale.idle.stmts.$m" "$l  statements a second at the server" stmts/s 1 ""
	def "scale.idle.stmts_daemon.$m" "$l  the same per daemon" stmts/s 2 ""
	def "scale.idle.claims.$m" "$l  claims per queue per poll_interval" calls 2 "$TGT_SCALE_IDLE_POLLS"
	def "scale.idle.other.$m" "$l  other stmts per daemon per poll_interval" stmts 2 "$TGT_SCALE_IDLE_OTHER"
	def "scale.idle.pgcpu.$m" "$l  the daemons' backends' CPU" ms/s 1 ""
	def "scale.notify.other.stmts.$m" "$l  NOTIFY for nobody's queue: statements each" stmts 3 "$TGT_SCALE_NOTIFY_OTHER"
	def "scale.notify.other.cpu.$m" "$l  NOTIFY for nobody's queue: backends' CPU each" us 1 ""
	def "scale.notify.waited.stmts.$m" "$l  NOTIFY for a waited queue: statements each" stmts 3 ""
	def "scale.notify.waited.cpu.$m" "$l  NOTIFY for a waited queue: backends' CPU each" us 1 ""
	def "scale.notify.waited.rate.$m" "$l   the same: more statements per daemon" stmts/s 2 ""
done

section "11. flow control (pgjobd.set_limits)"
for m in tx lease; do
	def "limits.burst.$m.none" "11a $m: burst, ungrouped, no limit" jobs/s 1 ""
	def "limits.burst.$m.limit" "11a $m:  concurrency limit = the slots ($CONCURRENCY)" jobs/s 1 ""
	def "limits.burst_ratio.$m" "11a $m:  limited / no limit" ratio 3 "$TGT_LIMIT_BURST"
	def "limits.pgcpu.$m.none" "11a $m:  PostgreSQL CPU per job, no limit" ms 3 ""
	def "limits.pgcpu.$m.limit" "11a $m:  PostgreSQL CPU per job, limited" ms 3 ""
	def "limits.stmts.$m.limit" "11a $m:  statements per job, limited" stmts 2 ""
done
def limits.rate.per_s "11b rate $LIMIT_RATE/1s, 3 daemons, ${LIMIT_RATE_SECS} s: starts a second" starts/s 2 ""
def limits.rate.ratio "11b  starts a second / $LIMIT_RATE" ratio 3 "$TGT_LIMIT_RATE"
def limits.rate.worst "11b  most starts in any 1 s (the commands' stamps)" starts 0 "<= $LIMIT_RATE"
def limits.rate.gave_back "11b  planned starts missed, given back" jobs 0 ""
def limits.claim_ms.none "11c claim server time per job, 1,000 groups, no limit" ms 4 ""
def limits.claim_ms.limit "11c  every limit set, none binding" ms 4 ""
def limits.claim_ratio "11c  with limits / without" ratio 3 "$TGT_LIMIT_CLAIM"
def limits.claim_ms.counts "11c  the concurrencies alone, no rate" ms 4 ""
def limits.claim_counts_ratio "11c  the concurrencies alone / without" ratio 3 ""
def limits.claim_call_ms.none "11c  ms a claim statement, no limit" ms 4 ""
def limits.claim_call_ms.limit "11c  ms a claim statement, every limit" ms 4 ""
def limits.claim_call_ratio "11c  ms a claim statement, every limit / none" ratio 3 ""
def limits.claim_jobs.none "11c  jobs a claim statement, no limit" jobs 2 ""
def limits.claim_jobs.limit "11c  jobs a claim statement, every limit" jobs 2 ""
def limits.claim_jobs.counts "11c  jobs a claim statement, the concurrencies alone" jobs 2 ""
def limits.claim_moves "11c  late starts that moved the rates on (every limit)" starts 0 ""
def limits.alone_ms.none "11c claim statement alone (psql), no limit: ms a job" ms 4 ""
def limits.alone_ms.limit "11c  every limit set, none binding" ms 4 ""
def limits.alone_ratio "11c  with limits / without" ratio 3 "$TGT_LIMIT_CLAIM"

# ---------------------------------------------------------------- the runs

for REP in $(seq 1 "$REPS"); do
	log "== repetition $REP of $REPS"
	only ceiling && log "1 ceiling" && bench_ceiling
	only throughput && log "2a throughput ungrouped" && bench_throughput ungrouped
	only throughput && log "2b throughput grouped" && bench_throughput grouped
	for m in tx lease; do
		for v in ungrouped grouped; do
			only burst && log "2c burst $v, $m" && bench_burst $v $m
		done
	done
	only pickup && log "3 pickup latency" && bench_pickup
	only pickup && log "3t pickup under strace" && bench_pickup_trace
	only steps && log "3b pickup step by step, transaction" && bench_pickup_steps tx
	only steps && log "3b pickup step by step, lease" && bench_pickup_steps lease
	only backlog && log "4 backlog small" && bench_backlog small
	only backlog && log "4 backlog large" && bench_backlog large
	only enqueue && log "5 enqueue" && bench_enqueue
	only footprint && log "6a footprint" && bench_footprint
	only strace && log "6d sends per job" && bench_strace
	only held && log "7 claims over retry-held groups" && bench_held
	for m in transaction lease; do
		for c in free held marked; do
			only held && log "7b backlog behind backed-off heads, $m, $c" && bench_backoff "$m" "$c"
		done
	done
	only lease && log "8a throughput ungrouped, lock mode lease" && bench_throughput ungrouped lease
	only lease && log "8b throughput grouped, lock mode lease" && bench_throughput grouped lease
	only lease && log "8c pickup latency, lock mode lease" && bench_pickup lease
	only lease && log "8t pickup under strace, lock mode lease" && bench_pickup_trace lease
	only lease && log "8d pickup latency floor, no daemon" && bench_floor
	only timers && log "9a schedule tick lateness" && bench_tick
	only timers && log "9b schedule tick lateness, lock mode lease" && bench_tick lease
	only timers && log "9c cancel latency" && bench_cancel
	only timers && log "9d watchdog pings" && bench_watchdog
	# (limits: the whole row; limit_burst, limit_rate, limit_claim: a part)
	for m in tx lease; do
		for l in none limit; do
			{ only limits || only limit_burst; } && log "11a burst, $m, $l" && bench_limit_burst "$m" "$l"
		done
	done
	{ only limits || only limit_rate; } && log "11b rate over 3 daemons" && bench_limit_rate
	for l in none limit counts; do
		{ only limits || only limit_claim; } && log "11c claims over 1,000 groups, $l" && bench_limit_claim "$l"
	done
	{ only limits || only limit_claim; } && log "11c the claim statement alone" && bench_limit_claim_alone
	if only scale; then
		log "10a many daemons, lock mode transaction" && bench_scale transaction many
		log "10b one daemon, as many slots, lock mode transaction" && bench_scale transaction one
		log "10c many daemons, lock mode lease" && bench_scale lease many
		log "10d one daemon, as many slots, lock mode lease" && bench_scale lease one
	fi
	if only scale || only idle; then
		log "10e idle daemons, lock mode transaction" && bench_scale_idle transaction
		log "10f idle daemons, lock mode lease" && bench_scale_idle lease
		# the other measurements run with the server's usual max_connections
		[ "$REP" -lt "$REPS" ] && scale_server 300
	fi
done

# Ratios between figures of different runs, per repetition.
derive() { # KEY NUM_KEY DEN_KEY
	local r num den
	for r in $(seq 1 "$REPS"); do
		num=$(awk -F'\t' -v k="$2" -v r="$r" '$1 == k && $2 == r { print $3 }' "$W/figs")
		den=$(awk -F'\t' -v k="$3" -v r="$r" '$1 == k && $2 == r { print $3 }' "$W/figs")
		[ -n "$num" ] && [ -n "$den" ] && REP=$r fig "$1" "$(ratio "$num" "$den")" >/dev/null
	done
}
derive ratio.ungrouped tput.ungrouped ceiling
derive ratio.grouped tput.grouped ceiling
derive ratio.lease.ungrouped tput.lease.ungrouped ceiling
derive ratio.lease.grouped tput.lease.grouped ceiling
for m in tx lease; do
	for v in ungrouped grouped; do
		derive "ratio.burst.$m.$v" "tput.burst.$m.$v" ceiling
	done
done
# What CPU alone allows 8a and 8b: with every core busy, at most cores / mcpu.lease.X
# jobs/s; the ceiling was cores * busy.ceiling / mcpu.ceiling spawns/s. Their ratio is
# mcpu.ceiling / (busy.ceiling * mcpu.lease.X).
for r in $(seq 1 "$REPS"); do
	for x in ungrouped grouped; do
		v=$(awk -F'\t' -v r="$r" -v m="mcpu.lease.$x" '$2 == r { f[$1] = $3 }
			END { if (f["busy.ceiling"] > 0 && f[m] > 0)
				printf "%.6f", f["mcpu.ceiling"] / (f["busy.ceiling"] * f[m]) }' "$W/figs")
		[ -n "$v" ] && REP=$r fig "cpubound.lease.$x" "$v" >/dev/null
	done
	for x in burst.tx.ungrouped burst.tx.grouped burst.lease.ungrouped burst.lease.grouped; do
		v=$(awk -F'\t' -v r="$r" -v m="mcpu.$x" '$2 == r { f[$1] = $3 }
			END { if (f["busy.ceiling"] > 0 && f[m] > 0)
				printf "%.6f", f["mcpu.ceiling"] / (f["busy.ceiling"] * f[m]) }' "$W/figs")
		[ -n "$v" ] && REP=$r fig "cpubound.$x" "$v" >/dev/null
	done
done
derive backlog.ratio backlog.large backlog.small
derive limits.burst_ratio.tx limits.burst.tx.limit limits.burst.tx.none
derive limits.burst_ratio.lease limits.burst.lease.limit limits.burst.lease.none
derive limits.claim_ratio limits.claim_ms.limit limits.claim_ms.none
derive limits.claim_counts_ratio limits.claim_ms.counts limits.claim_ms.none
derive limits.claim_call_ratio limits.claim_call_ms.limit limits.claim_call_ms.none
derive limits.alone_ratio limits.alone_ms.limit limits.alone_ms.none
for m in transaction lease; do
	derive "scale.pgcpu_ratio_steady.$m" "scale.pgcpu_steady.$m.many" "scale.pgcpu_steady.$m.one"
	derive "scale.pgcpu_ratio.$m" "scale.pgcpu.$m.many" "scale.pgcpu.$m.one"
done

BENCH_SECS=$(((($(now_ms) - BENCH_T0) + 500) / 1000))
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------- table and JSON

json_str() { # STRING -> a JSON string literal
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\t'/\\t}
	s=${s//$'\n'/\\n}
	printf '"%s"' "$s"
}

{
	echo "pgjobd bench, $(date -u '+%Y-%m-%d %H:%M UTC'), $REPS repetitions, ${BENCH_SECS}s$([ "$QUICK" = 1 ] && echo ", QUICK (sizes / 10)")"
	echo "machine:    $M_CORES cores, $M_CPU, ${M_MEM_MIB} MiB, kernel $M_KERNEL"
	echo "disk:       data on $DATA_FS, 8 KiB O_DSYNC write ${DSYNC_MS:-?} ms (bounds each commit)"
	echo "pgjobd:     $PGJOBD_DESCRIBE ($PGJOBD_VERSION)"
	echo "postgresql: $PG_VERSION, $PG_SETTINGS"
	echo "load avg:   $LOAD_START at start, $LOAD_END at end (other work on the machine adds noise)"
	echo
	awk -F'\t' -v reps="$REPS" '
		function med(k,    n, i, j, t, v) {
			n = split(vals[k], v, " ")
			for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
			lo = v[1]; hi = v[n]; cnt = n
			return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
		}
		function voided(k,    v) { for (v in void) if (index(k, v ".") == 1) return void[v]; return "" }
		FILENAME == ARGV[1] { void[$1] = (void[$1] == "" ? "" : void[$1] "; ") "rep " $2 ": " $3; next }
		FILENAME == ARGV[2] { vals[$1] = vals[$1] " " $3; next }
		$1 == "section" { rows[++nr] = "S\t" $2; next }
		{ rows[++nr] = $0 }
		END {
			printf "%-50s %11s %11s %11s  %-10s  %-9s  %s\n", "figure", "median", "min", "max", "unit", "target", "meets"
			for (i = 1; i <= nr; i++) {
				split(rows[i], f, "\t")
				if (f[1] == "S") { printf "%s\n", f[2]; continue }
				vd = voided(f[1])
				if (!(f[1] in vals)) { printf "%-50s %11s %11s %11s  %-10s  %-9s  %s\n", f[2], "-", "-", "-", f[3], f[5], (f[5] != "" && vd != "" ? "NO  (" vd ")" : ""); continue }
				m = med(f[1]); fmt = "%11." f[4] "f"
				meets = ""
				if (f[5] != "") { split(f[5], tg, " "); meets = (tg[1] == "<=" ? m <= tg[2] : m >= tg[2]) ? "yes" : "NO" }
				if (f[5] != "" && vd != "") meets = "NO  (" vd ")"
				printf "%-50s " fmt " " fmt " " fmt "  %-10s  %-9s  %s%s\n", f[2], m, lo, hi, f[3], f[5], meets, (cnt < reps ? "  (" cnt " of " reps " reps)" : "")
			}
		}' "$W/void" "$W/figs" "$W/defs"
	if [ ${#PROBLEMS[@]} -gt 0 ]; then
		echo
		echo "problems (figures affected are left out or based on fewer repetitions; a target marked"
		echo "NO (...) is not met whatever the median, e.g. because pickups were missing):"
		printf '  - %s\n' "${PROBLEMS[@]}"
	fi
} | tee "$OUT/table.txt"

{
	echo "{"
	echo "  \"date\": $(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)"),"
	echo "  \"duration_s\": $BENCH_SECS,"
	echo "  \"repetitions\": $REPS,"
	echo "  \"quick\": $([ "$QUICK" = 1 ] && echo true || echo false),"
	echo "  \"machine\": {\"cores\": $M_CORES, \"cpu\": $(json_str "$M_CPU"), \"memory_mib\": $M_MEM_MIB, \"kernel\": $(json_str "$M_KERNEL"), \"data_fs\": $(json_str "$DATA_FS"), \"dsync_write_ms\": ${DSYNC_MS:-null}, \"loadavg_start\": $(json_str "$LOAD_START"), \"loadavg_end\": $(json_str "$LOAD_END")},"
	echo "  \"pgjobd\": {\"describe\": $(json_str "$PGJOBD_DESCRIBE"), \"version\": $(json_str "$PGJOBD_VERSION")},"
	echo "  \"postgresql\": {\"version\": $(json_str "$PG_VERSION"), \"settings\": {$(
		for kv in $PG_SETTINGS; do printf '%s%s: %s' "$sep" "$(json_str "${kv%%=*}")" "$(json_str "${kv#*=}")"; sep=', '; done
	)}},"
	echo "  \"sizes\": {\"concurrency\": $CONCURRENCY, \"spawns\": $N_SPAWNS, \"jobs\": $N_JOBS, \"groups\": $N_GROUPS, \"pickup_inserts\": $N_PICKUP, \"pickup_pause_ms\": [$PICKUP_MIN_MS, $PICKUP_MAX_MS], \"backlog_small\": [$N_SMALL, $G_SMALL], \"backlog_large\": [$N_LARGE, $G_LARGE], \"backlog_large_measured\": $N_LARGE_STOP, \"enqueue_seconds\": $ENQ_SECS, \"enqueue_clients\": $ENQ_CLIENTS, \"enqueue_groups\": $ENQ_GROUPS, \"footprint_slots\": $FOOT_SLOTS, \"strace_jobs\": $N_STRACE, \"held_groups\": $N_HELD},"
	echo "  \"scale_sizes\": {\"daemons\": $SCALE_DAEMONS, \"slots\": $SCALE_SLOTS, \"sleep_s\": $SCALE_SLEEP, \"jobs\": $N_SCALE, \"idle_queues\": $SCALE_QUEUES, \"poll_s\": $SCALE_POLL_S, \"idle_window_s\": $SCALE_IDLE_SECS, \"notify_rate\": $SCALE_NOTIFY_RATE, \"max_connections\": $SCALE_MAX_CONN},"
	echo "  \"figures\": {"
	awk -F'\t' '
		BEGIN { CONVFMT = "%.10g"; OFMT = "%.10g" }
		function jstr(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); return "\"" s "\"" }
		function voided(k,    v) { for (v in void) if (index(k, v ".") == 1) return void[v]; return "" }
		FILENAME == ARGV[1] { void[$1] = (void[$1] == "" ? "" : void[$1] "; ") "rep " $2 ": " $3; next }
		FILENAME == ARGV[2] { vals[$1] = vals[$1] " " $3; next }
		$1 == "section" { next }
		{
			n = split(vals[$1], v, " ")
			for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
			list = ""; for (i = 1; i <= n; i++) list = list (i > 1 ? ", " : "") (v[i] + 0)
			if (n == 0) { m = "null"; lo = "null"; hi = "null" }
			else { m = (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) + 0; lo = v[1] + 0; hi = v[n] + 0 }
			tgt = "null"; meets = "null"
			if ($5 != "") {
				split($5, tg, " ")
				tgt = "{\"op\": " jstr(tg[1]) ", \"value\": " (tg[2] + 0) "}"
				if (n > 0) meets = (tg[1] == "<=" ? m <= tg[2] : m >= tg[2]) ? "true" : "false"
				if (voided($1) != "") meets = "false"
			}
			vd = voided($1)
			out[++no] = sprintf("    %s: {\"label\": %s, \"unit\": %s, \"median\": %s, \"min\": %s, \"max\": %s, \"values\": [%s], \"target\": %s, \"meets_target\": %s%s}",
				jstr($1), jstr($2), jstr($3), m, lo, hi, list, tgt, meets, (vd != "" ? ", \"target_void\": " jstr(vd) : ""))
		}
		END { for (i = 1; i <= no; i++) print out[i] (i < no ? "," : "") }' "$W/void" "$W/figs" "$W/defs"
	echo "  },"
	printf '  "problems": ['
	sep=
	for p in "${PROBLEMS[@]}"; do
		printf '%s\n    %s' "$sep" "$(json_str "$p")"
		sep=,
	done
	[ ${#PROBLEMS[@]} -gt 0 ] && printf '\n  '
	echo "]"
	echo "}"
} >"$OUT/results.json"
log "wrote $OUT/results.json and $OUT/table.txt"
exit 0
