#!/usr/bin/env bash
# The host's limits are the host's fault, not the jobs':
#  A. RLIMIT_NPROC (`ulimit -u`) too low for the commands: the daemon runs as an
#     unprivileged user (root is exempt from the limit), so clone fails with EAGAIN. No job
#     fails: each start the host refused is given back (attempts not counted), the daemon
#     backs off, saying so once per episode, and every job succeeds; statements and log
#     lines stay bounded. The start-up warning names the limit.
#  B. RLIMIT_NOFILE (`ulimit -n 64`) with concurrency 32: sessions and pipes cannot all
#     be had. No job fails, all succeed, no busy loop (statements/s and log lines/s
#     bounded); the start-up warning names the limit.
#  C. A real spawn failure (working_dir missing) still fails the attempt with reason spawn.
. "$(dirname "$0")/lib.sh"
require_pgjobd

skip_all() {
	echo "1..0 # SKIP $*"
	TAP_PLANNED=0
	TAP_DONE=1
	exit 0
}
[ "$(id -u)" = 0 ] || skip_all "needs root to run the daemon as another user"
command -v setpriv >/dev/null 2>&1 || skip_all "setpriv (util-linux) is not installed"
# The daemon's user for A: a free uid without a passwd entry, so that no other process
# counts against its RLIMIT_NPROC.
DUID=
for ((u = 48000 + $$ % 900; u < 49000; u++)); do
	if ! getent passwd "$u" >/dev/null && ! getent group "$u" >/dev/null &&
		! pgrep -U "$u" >/dev/null; then
		DUID=$u
		break
	fi
done
[ -n "$DUID" ] || skip_all "no free uid in 48000-48999 for the daemon"

shared_cluster
pg_start
make_tmp
W=$T/w # the daemon's and its commands' files, writable by DUID
mkdir -m 0777 "$W"

conf_header >"$T/migrate.ini"
# transactions committed in this test's database so far
xacts() { psql_q "SELECT pg_stat_force_next_flush(); SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()" 2>/dev/null | tail -1; }

# ---- A: ulimit -u, in both lock modes
# daemon + supervisor + 2 commands: the other 6 slots' starts are refused
NPROC=4
run_nproc() {
	local mode=$1 q=u_$1 x0 x1 l0 l1 t0 ms A
	write_conf "$T/a.$mode.ini" <<EOF
$(conf_header log_level=info)

[queue.$q]
command = exec sleep 0.3
concurrency = 8
max_attempts = 1
lock_mode = $mode
working_dir = $W
EOF
	chmod 644 "$T/a.$mode.ini"
	setpriv --reuid="$DUID" --regid="$DUID" --clear-groups --inh-caps=-all --bounding-set=-all -- \
		bash -c "ulimit -u $NPROC && exec \"\$0\" -c \"\$1\"" "$PGJOBD" "$T/a.$mode.ini" >>"$T/a.$mode.log" 2>&1 </dev/null &
	A=$!
	DAEMON_PIDS+=("$A")
	wait_until 10 "workers_alive 1" || bail_out "A $mode: daemon did not register"
	like "$(grep 'RLIMIT_NPROC' "$T/a.$mode.log")" "too low" "A $mode: start-up warns that RLIMIT_NPROC is too low"
	x0=$(xacts)
	l0=$(wc -l <"$T/a.$mode.log")
	t0=$(now_ms)
	psql_q "INSERT INTO pgjobd.jobs (queue) SELECT '$q' FROM generate_series(1, 40)" >/dev/null
	wait_until 90 "[ \"\$(count_jobs \"queue = '$q' AND status IN ('succeeded', 'failed')\")\" = 40 ]"
	ok $? "A $mode: every job ended"
	ms=$(($(now_ms) - t0))
	x1=$(xacts)
	l1=$(wc -l <"$T/a.$mode.log")
	note "A $mode: 40 jobs in $ms ms: $((x1 - x0)) transactions ($(((x1 - x0) * 1000 / ms))/s), $((l1 - l0)) log lines ($(((l1 - l0) * 1000 / ms))/s)"
	note "A $mode: $(grep -c 'reason=spawn' "$T/a.$mode.log") spawn failures logged; $(grep -c 'host refused' "$T/a.$mode.log") back-off lines"
	is "$(count_jobs "queue = '$q' AND status = 'failed'")" 0 "A $mode: no job failed for the host's fault"
	is "$(count_jobs "queue = '$q' AND status = 'succeeded' AND attempts = 1")" 40 \
		"A $mode: all 40 succeeded, each at attempt 1 (refused starts are not attempts)"
	is "$(count_jobs "queue = '$q' AND jsonb_array_length(history) <> 1")" 0 \
		"A $mode: one history entry per job (a refused start leaves none)"
	# 40 jobs need about 80 transactions and 80 start/finish lines; a busy loop makes
	# thousands. Refused starts cost at most one claim and one give-back per slot per pause
	# (250 ms at least): under 100 transactions/s however slow the machine (about 40 here).
	cmp_ok "$(((x1 - x0) * 1000 / ms))" -le 150 "A $mode: statements/s bounded"
	cmp_ok "$((l1 - l0))" -le 200 "A $mode: log lines bounded"
	cmp_ok "$(grep -c 'host refused' "$T/a.$mode.log")" -le 3 "A $mode: the refusals are told once per episode"
	stop_daemon "$A" >/dev/null
}
pgjobd_migrate "$T/migrate.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
run_nproc transaction
run_nproc lease

# ---- B: ulimit -n 64, concurrency 32
write_conf "$T/b.ini" <<EOF
$(conf_header log_level=info)

[queue.n]
command = exec sleep 1
concurrency = 32
max_attempts = 1
EOF
bash -c "ulimit -n 64 && exec \"\$0\" -c \"\$1\"" "$PGJOBD" "$T/b.ini" >>"$T/b.log" 2>&1 </dev/null &
B=$!
DAEMON_PIDS+=("$B")
wait_until 10 "workers_alive 1" || bail_out "daemon b did not register"
like "$(grep 'RLIMIT_NOFILE' "$T/b.log")" "too low" "B: start-up warns that RLIMIT_NOFILE is too low"
sleep 2 # the slots' sessions that can be had are up, the others backing off
x0=$(xacts)
l0=$(wc -l <"$T/b.log")
t0=$(now_ms)
psql_q "INSERT INTO pgjobd.jobs (queue) SELECT 'n' FROM generate_series(1, 64)" >/dev/null
wait_until 90 "[ \"\$(count_jobs \"queue = 'n' AND status IN ('succeeded', 'failed')\")\" = 64 ]"
ok $? "B: every job ended"
ms=$(($(now_ms) - t0))
x1=$(xacts)
l1=$(wc -l <"$T/b.log")
note "B: 64 jobs in $ms ms: $((x1 - x0)) transactions ($(((x1 - x0) * 1000 / ms))/s), $((l1 - l0)) log lines ($(((l1 - l0) * 1000 / ms))/s)"
note "B: $(grep -c 'Too many open files' "$T/b.log") lines say 'Too many open files'; most frequent:"
grep -o 'msg="[^"]*"' "$T/b.log" | sort | uniq -c | sort -rn | head -4 | while read -r line; do note "   $line"; done
is "$(count_jobs "queue = 'n' AND status = 'failed'")" 0 "B: no job failed for the host's fault"
is "$(count_jobs "queue = 'n' AND status = 'succeeded' AND attempts = 1")" 64 \
	"B: all 64 succeeded, each at attempt 1"
cmp_ok "$((x1 - x0))" -le 3000 "B: statements bounded"
cmp_ok "$((l1 - l0))" -le 600 "B: log lines bounded"
cmp_ok "$(grep -c 'host refused' "$T/b.log")" -le 3 "B: the refusals are told once per episode"
# and idle, with the limit still there: no loop either
x0=$(xacts)
l0=$(wc -l <"$T/b.log")
sleep 5
x1=$(xacts)
l1=$(wc -l <"$T/b.log")
note "B: idle 5 s: $((x1 - x0)) transactions, $((l1 - l0)) log lines"
cmp_ok "$((x1 - x0))" -le 500 "B: idle: statements bounded"
cmp_ok "$((l1 - l0))" -le 50 "B: idle: log lines bounded"
stop_daemon "$B" >/dev/null

# ---- C: a real spawn failure still fails the attempt
write_conf "$T/c.ini" <<EOF
$(conf_header log_level=info)

[queue.c]
command = true
max_attempts = 1
working_dir = $T/missing
EOF
mkdir "$T/missing"
start_daemon c "$T/c.ini"
C=$DAEMON_PID
wait_until 10 "workers_alive 1" || bail_out "daemon c did not register"
rmdir "$T/missing"
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('c') RETURNING id")
wait_until 20 "[ \"\$(job_field $id status)\" = failed ]"
ok $? "C: a job whose working_dir is missing fails"
is "$(job_field "$id" "error->>'reason'")" spawn "C: with reason spawn"
stop_daemon "$C" >/dev/null
done_testing
