#!/usr/bin/env bash
# A pooler between pgjobd and PostgreSQL (PgBouncer, as Debian packages it). In
# transaction mode it hands one server session to several clients, while pgjobd keeps
# state in its sessions (prepared statements, LISTEN, a transaction-mode job's open
# transaction): `pgjobd check` says so and exits 2, and the daemon refuses to start (exit
# 2, the same advice), claiming nothing, with the server's own error text where a
# statement failed, never a bare PGRES_PIPELINE_ABORTED; also while other clients keep the
# pool busy. In session mode each client has a server session of its own: check says ok,
# and jobs of both lock modes run through it.
. "$(dirname "$0")/lib.sh"
require_pgjobd

skip_all() {
	echo "1..0 # SKIP $*"
	TAP_PLANNED=0
	TAP_DONE=1
	exit 0
}

BOUNCER=$(command -v pgbouncer || ls /usr/sbin/pgbouncer 2>/dev/null)
[ -n "$BOUNCER" ] || skip_all "pgbouncer is not installed (tests/deps.sh installs it)"

own_cluster # pgbouncer reaches the server through its socket directory
pg_start

plan 19

# bouncer_start NAME MODE: a PgBouncer in $T/NAME (Unix socket only, port 6432, auth_type
# trust for the server's user), pool_mode MODE, in front of this file's server; its
# conninfo in $BOUNCER_DB. Run as the server's user under root (pgbouncer refuses root).
bouncer_start() {
	local dir=$T/$1
	mkdir -p "$dir"
	echo "\"$PGUSER\" \"\"" >"$dir/userlist.txt"
	cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$T/sock port=$PG_PORT
[pgbouncer]
listen_addr =
listen_port = 6432
unix_socket_dir = $dir
auth_type = trust
auth_file = $dir/userlist.txt
pool_mode = $2
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
max_client_conn = 200
default_pool_size = 20
EOF
	[ "$(id -u)" = 0 ] && chown -R "$PG_USER" "$dir"
	as_pg "$BOUNCER" "$dir/pgbouncer.ini" >"$dir/stderr.log" 2>&1 &
	echo $! >"$T/$1.pid" # the cleanup kills it (and whatever names $T)
	BOUNCER_DB="host=$dir port=6432 dbname=$PGDATABASE user=$PGUSER"
	wait_until 20 "psql -X -qAt -d '$BOUNCER_DB' -c 'SELECT 1' >/dev/null 2>&1"
}

# daemon_conf FILE CONNINFO: one queue of each lock mode.
daemon_conf() {
	write_conf "$1" <<EOF
$(conf_header database="$2")

[queue.tx]
command = echo tx
lock_mode = transaction

[queue.ls]
command = echo ls
lock_mode = lease
EOF
}

# ---------------------------------------------------------------- transaction mode

bouncer_start txpool transaction
ok $? "pgbouncer in transaction mode answers" || diag "$(cat "$T/txpool/stderr.log")"
daemon_conf "$T/tx.ini" "$BOUNCER_DB"

timeout 30 "$PGJOBD" check -c "$T/tx.ini" >"$T/check-tx.out" 2>&1
is "$?" 2 "check through a transaction pooler: exit 2" || diag "$(cat "$T/check-tx.out")"
like "$(cat "$T/check-tx.out")" 'pooler in transaction or statement mode' "check names the pooler's mode"
like "$(cat "$T/check-tx.out")" 'connect directly or through a session-mode pooler' \
	"... and what to do"

read -r -d '' J1 J2 < <(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('tx'), ('ls') RETURNING id")
start_daemon tx "$T/tx.ini"
d=$DAEMON_PID
wait_daemon_exit "$d" 30
is "$DAEMON_STATUS" 2 "the daemon through a transaction pooler exits 2 (a configuration error: no restart)"
grep -q 'level=error msg="the database connection goes through a pooler in transaction or statement mode; pgjobd needs a session: connect directly or through a session-mode pooler"' "$T/tx.log"
ok $? "its log says why and what to do" || diag "$(grep -v level=debug "$T/tx.log")"
is "$(grep -c 'PGRES_PIPELINE_ABORTED' "$T/tx.log")" 0 "no bare PGRES_PIPELINE_ABORTED in its log"
is "$(grep -c 'terminating running commands\|msg="ready"' "$T/tx.log")" 0 \
	"it never became ready, and terminated nothing"
is "$(psql_q "SELECT string_agg(status || '/' || attempts, ' ' ORDER BY id) FROM pgjobd.jobs
               WHERE id IN (${J1:-0}, ${J2:-0})")" "queued/0 queued/0" "nothing was claimed"

# Other clients busy on the pool while the daemon starts (as on a pooler that apps share):
# they take the server session the listener just left, so the probe may be given another.
# Five starts: each refuses, never ready.
( while [ ! -e "$T/quiet" ]; do psql -X -qAt -d "$BOUNCER_DB" -c "SELECT pg_sleep(0.002)" >/dev/null 2>&1; done ) &
busy1=$!
( while [ ! -e "$T/quiet" ]; do psql -X -qAt -d "$BOUNCER_DB" -c "SELECT 1" -c "SELECT 2" >/dev/null 2>&1; done ) &
busy2=$!
statuses=""
readies=0
for i in 1 2 3 4 5; do
	start_daemon "txbusy$i" "$T/tx.ini"
	wait_daemon_exit "$DAEMON_PID" 30
	statuses+="$DAEMON_STATUS "
	readies=$((readies + $(grep -c 'msg="ready"' "$T/txbusy$i.log")))
done
touch "$T/quiet"
wait "$busy1" "$busy2"
is "$statuses" "2 2 2 2 2 " "with other clients busy on the pool, five starts through it each exit 2" ||
	diag "$(grep -h 'level=error\|pooler' "$T"/txbusy*.log | head -20)"
is "$readies" 0 "... none of them ever ready"
is "$(psql_q "SELECT string_agg(status || '/' || attempts, ' ' ORDER BY id) FROM pgjobd.jobs
               WHERE id IN (${J1:-0}, ${J2:-0})")" "queued/0 queued/0" "... and nothing was claimed"

# ---------------------------------------------------------------- session mode

bouncer_start sesspool session
ok $? "pgbouncer in session mode answers" || diag "$(cat "$T/sesspool/stderr.log")"
daemon_conf "$T/sess.ini" "$BOUNCER_DB"
timeout 30 "$PGJOBD" check -c "$T/sess.ini" >"$T/check-sess.out" 2>&1
is "$?" 0 "check through a session pooler: exit 0" || diag "$(cat "$T/check-sess.out")"
like "$(cat "$T/check-sess.out")" 'ok \(2 queues' "... and says ok"

start_daemon sess "$T/sess.ini"
d=$DAEMON_PID
wait_until 30 "[ \"\$(count_jobs \"id IN (${J1:-0}, ${J2:-0}) AND status = 'succeeded'\")\" = 2 ] || ! pid_alive $d"
is "$(psql_q "SELECT string_agg(queue || ':' || status || '/' || attempts || ':' || (result->>'stdout'), ' '
                                ORDER BY id) FROM pgjobd.jobs WHERE id IN (${J1:-0}, ${J2:-0})")" \
	"tx:succeeded/1:tx ls:succeeded/1:ls" "through a session pooler, a job of each lock mode runs once and succeeds" ||
	diag "$(grep -v level=debug "$T/sess.log")"
J3=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('tx') RETURNING id")
wait_until 20 "[ \"\$(job_field ${J3:-0} status)\" = succeeded ]"
ok $? "a job enqueued later runs too (the wake-up reaches it through the pooler)"
grep -q 'msg="connected through a pooler in session mode"' "$T/sess.log"
ok $? "the daemon saw the pooler and judged it fine"
stop_daemon "$d"
is "$?" 0 "SIGTERM: exit 0"
