#!/usr/bin/env bash
# tests/demo.sh - the README's quick start: install what is missing, build, start a
# throwaway PostgreSQL (tests/integration/lib.sh), run pgjobd with the queues of
# conf/pgjobd.ini, enqueue demo jobs with plain INSERTs and show the jobs table until
# every job has finished (at most 60 s). Everything is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

bash tests/deps.sh
make

# lib.sh without TAP output: its cleanup trap still stops the daemon and PostgreSQL.
PGJOBD_LIB_MODE=quiet
PGJOBD=$repo/build/pgjobd
. tests/integration/lib.sh
set +eu # lib.sh's helpers test exit statuses themselves and allow unset variables

echo "== starting a throwaway PostgreSQL"
empty_database # the demo shows pgjobd migrate creating the schema
pg_start
echo "   socket directory $T/sock, database pgjobd_test"

# The example configuration with the database line replaced and without its `user`
# lines: the demo's daemon runs as you, without the capabilities to switch users (the
# service runs commands as pgjobd-run, see README.md, "Install as a service").
conf=$T/pgjobd.ini
if [ -r conf/pgjobd.ini ]; then
	awk -v db="database = $DB_CONNINFO" '
		/^[ \t]*\[/ { section = $0; gsub(/[ \t]/, "", section) }
		section == "[pgjobd]" && /^[ \t]*database[ \t]*[=:]/ { next }
		section ~ /^\[queue\./ && /^[ \t]*user[ \t]*[=:]/ { next }
		{ print }
		$0 ~ /^[ \t]*\[pgjobd\][ \t]*$/ { print db }
	' conf/pgjobd.ini >"$conf"
else
	cat >"$conf" <<EOF
$(conf_header log_level=info)

[queue.demo]
command = cat
concurrency = 2

[queue.demo_fail]
command = echo "attempt \$PGJOBD_ATTEMPT failing on purpose" >&2; exit 3
max_attempts = 3
backoff = 1s
backoff_max = 4s

[queue.demo_group]
command = sleep 1; echo "group \$PGJOBD_GROUP_ID step \$PGJOBD_ARG_step done"
concurrency = 4

[queue.demo_long]
command = sleep "\$PGJOBD_ARG_seconds"; echo "slept \$PGJOBD_ARG_seconds s under a lease"
lock_mode = lease
EOF
fi

echo "== pgjobd migrate"
"$PGJOBD" migrate -c "$conf" || exit 1
"$PGJOBD" check -c "$conf" || exit 1
echo "== starting pgjobd -c $conf (log: $T/pgjobd.log)"
start_daemon pgjobd "$conf"
daemon=$DAEMON_PID

echo "== enqueueing demo jobs"
psql -X -q -v ON_ERROR_STOP=1 <<'SQL' || exit 1
INSERT INTO pgjobd.jobs (queue, data) VALUES ('demo', '{"msg": "hello"}');
INSERT INTO pgjobd.jobs (queue, data) VALUES ('demo', '{"msg": "world", "n": [1, 2, 3]}');
INSERT INTO pgjobd.jobs (queue, group_id, data) VALUES
	('demo_group', 'customer-42', '{"step": 1}'),
	('demo_group', 'customer-7', '{"step": 1}'),
	('demo_group', 'customer-42', '{"step": 2}'),
	('demo_group', 'customer-7', '{"step": 2}'),
	('demo_group', 'customer-42', '{"step": 3}');
INSERT INTO pgjobd.jobs (queue) VALUES ('demo_fail');
INSERT INTO pgjobd.jobs (queue, data) VALUES ('demo_long', '{"seconds": 3}');
SQL

show() {
	psql -X -q -P pager=off -c "SELECT id, queue, group_id AS group, status, attempts,
		left(coalesce(result::text, error->>'reason', ''), 60) AS \"result / error\"
		FROM pgjobd.jobs ORDER BY id"
}
pending() { psql_q "SELECT count(*) FROM pgjobd.jobs WHERE status IN ('queued', 'running')"; }
deadline=$(($(now_ms) + 60000))
status=0
while :; do
	echo "== $(date +%T)"
	show
	[ "$(pending)" = 0 ] && break
	if [ "$(now_ms)" -ge "$deadline" ]; then
		echo "demo: jobs still unfinished after 60 s" >&2
		status=1
		break
	fi
	if ! pid_alive "$daemon"; then
		echo "demo: pgjobd exited; its log:" >&2
		cat "$T/pgjobd.log" >&2
		exit 1
	fi
	sleep 1 # display cadence only
done

echo "== pgjobd.queue_stats"
psql -X -q -P pager=off -c "SELECT * FROM pgjobd.queue_stats" || true
echo "== stopping pgjobd (SIGTERM)"
stop_daemon "$daemon" || status=1
echo "== last lines of the pgjobd log"
tail -n 15 "$T/pgjobd.log"
[ $status = 0 ] && echo "== demo finished; the throwaway PostgreSQL is removed"
exit $status
