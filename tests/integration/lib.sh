# tests/integration/lib.sh - harness for pgjobd's integration tests (bash; sourced).
#
# Each test file is a standalone TAP producer:
#
#     #!/usr/bin/env bash
#     . "$(dirname "$0")/lib.sh"
#     plan 3                        # or call done_testing at the end
#     pg_start                      # a throwaway database, $T a temporary directory
#     is "$(psql_q 'select 1')" 1 "psql works"
#     ...
#
# Run alone (`prove t_XX.sh`), a file starts a PostgreSQL server of its own in $T. Run by
# tests/integration/run.sh (`make check-integration`: every file, several at once), it gets
# a database of its own on one server that the run shares (see own_cluster below).
#
# What it provides:
#   TAP         plan N | done_testing | ok STATUS NAME (0 = pass, like an exit status)
#               ok_cmd NAME CMD... | is GOT WANT NAME | isnt | like GOT ERE NAME | unlike
#               cmp_ok A OP B NAME (numeric: -lt -le -eq -ne -ge -gt) | pass | fail
#               skip REASON [COUNT] (checks not run: "ok N # SKIP REASON")
#               skip_all REASON (before anything else: the whole file, "1..0 # SKIP REASON")
#               diag MSG (stderr) | note MSG (stdout) | bail_out MSG
#   PostgreSQL  pg_start | pg_restart | pg_stop | psql_q SQL | sql_lit STRING
#               pg_start_relayed (a server of its own behind a TCP relay: $RELAY, $RELAY_PORT)
#               PGHOST/PGPORT/PGUSER/PGDATABASE are exported for psql only; the daemon
#               gets an explicit conninfo in its config ($DB_CONNINFO, see conf_header).
#               pg_start gives the file a database of its own with schema pgjobd at the
#               newest version, migrated by $PGJOBD; empty_database (before pg_start): one
#               without it. own_cluster | shared_cluster (before pg_start): a server of the
#               file's own, or a database on the server run.sh shares (see own_cluster below)
#               test_role NAME (a role name no other file uses)
#   Daemon      conf_header [key=value...] | write_conf FILE <<EOF | pgjobd_migrate CONF
#               start_daemon NAME CONF [VAR=VALUE...]  (sets $DAEMON_PID; never call it
#               inside $(...): the pid must stay a child of the test shell)
#               start_daemons NAME... <<EOF  (one configuration, several daemons: ${DAEMONS[NAME]})
#               stop_daemon PID [TIMEOUT]  (SIGTERM, wait; returns the daemon's exit status)
#               pid_alive PID (false for zombies) | all_dead PIDFILE | require_pgjobd
#   Waiting     wait_until SECONDS 'shell condition'  (polls every 50 ms; 1 on timeout)
#               holds_for SECONDS 'shell condition'  (true all along; 1 once it is not)
#   Jobs        job_field ID EXPR | count_jobs WHERE | make_mark_script FILE LOG
#               check_markers [--lenient] LOG | max_parallel LOG | make_sleeper_script FILE
#
# Cleanup (trap on EXIT): SIGKILL every daemon it started, stop PostgreSQL, kill leftovers
# whose command line mentions $T and every pid listed in $T/*.pid and $T/*.pids; if anything failed,
# print the last 80 lines of every log in $T (on a shared server, pg.log holds this database's
# lines of the server's log); drop the file's database and roles from a shared server; remove $T
# (kept, with the database, when PGJOBD_KEEP_TMP=1).
#
# PGJOBD_LIB_MODE=quiet (set before sourcing) turns the TAP part off: no plan, no summary,
# the exit status is left alone (tests/demo.sh uses it).
#
# PostgreSQL refuses to run as root: under root the server runs as $PG_USER (default
# `postgres`, else `nobody`) through runuser, and $T is made traversable for it.

LIB_DIR=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO_ROOT=$(cd "$LIB_DIR/../.." && pwd)
PGJOBD=${PGJOBD:-$REPO_ROOT/build/pgjobd}
case $PGJOBD in /*) ;; *) PGJOBD=$PWD/$PGJOBD ;; esac
export PGJOBD
LIB_MODE=${PGJOBD_LIB_MODE:-tap}

T=
DB_CONNINFO=
PG_BINDIR=${PG_BINDIR:-}
PG_PORT=5432
PG_RUNNING=0
DAEMON_PIDS=()
DAEMON_PID=
TAP_N=0
TAP_FAILED=0
TAP_PLANNED=
TAP_DONE=0
TAP_SKIPPED=0
TAP_SKIP_WHY=()

# Never let a test's daemons talk to a real systemd.
unset NOTIFY_SOCKET WATCHDOG_USEC WATCHDOG_PID LISTEN_FDS LISTEN_PID

# ---------------------------------------------------------------- TAP

plan() {
	TAP_PLANNED=$1
	[ "$LIB_MODE" = tap ] && echo "1..$1"
	return 0
}

done_testing() {
	if [ -z "$TAP_PLANNED" ]; then
		TAP_PLANNED=$TAP_N
		echo "1..$TAP_N"
	fi
	TAP_DONE=1
}

# diag MSG...: each argument (and each line in it) as a "# " comment on stderr.
diag() {
	local arg line
	for arg in "$@"; do
		while IFS= read -r line; do printf '# %s\n' "$line" >&2; done <<<"$arg"
	done
}

note() {
	local line
	while IFS= read -r line; do printf '# %s\n' "$line"; done <<<"$*"
}

# ok STATUS NAME: passes when STATUS is 0 (an exit status), e.g. `[ -e f ]; ok $? "f exists"`.
ok() {
	local status=$1 name=${2:-}
	TAP_N=$((TAP_N + 1))
	if [ "$status" = 0 ]; then
		echo "ok $TAP_N - $name"
		return 0
	fi
	TAP_FAILED=$((TAP_FAILED + 1))
	echo "not ok $TAP_N - $name"
	local i=1
	while [ "${BASH_SOURCE[$i]:-}" = "${BASH_SOURCE[0]}" ]; do i=$((i + 1)); done
	diag "  Failed test '$name' at ${BASH_SOURCE[$i]:-?} line ${BASH_LINENO[$((i - 1))]:-?}"
	return 1
}

pass() { ok 0 "$1"; }
fail() { ok 1 "$1"; }

# skip REASON [COUNT]: COUNT checks (default 1) that cannot run here, each an "ok N #
# SKIP REASON" line: TAP's skip, never a pass in disguise. prove shows such lines only
# with -v, so the file's end says on stderr how many it skipped and why, and under
# run.sh each skip is also recorded for the run's summary ($PGJOBD_TEST_CLUSTER/skips:
# FILE COUNT REASON, tab-separated).
skip() {
	local reason=$1 n=${2:-1} i
	for ((i = 0; i < n; i++)); do
		TAP_N=$((TAP_N + 1))
		echo "ok $TAP_N # SKIP $reason"
	done
	TAP_SKIPPED=$((TAP_SKIPPED + n))
	TAP_SKIP_WHY+=("$n: $reason")
	skip_record "$n" "$reason"
}

# skip_all REASON: the whole file cannot run here (before its plan and first check):
# "1..0 # SKIP REASON", which prove prints as "skipped: REASON"; recorded as skip does.
skip_all() {
	echo "1..0 # SKIP $1"
	skip_record all "$1"
	TAP_PLANNED=0
	TAP_DONE=1
	exit 0
}

skip_record() {
	[ -n "${PGJOBD_TEST_CLUSTER:-}" ] && [ -d "$PGJOBD_TEST_CLUSTER" ] || return 0
	printf '%s\t%s\t%s\n' "$(basename "$0")" "$1" "${2//$'\n'/ }" >>"$PGJOBD_TEST_CLUSTER/skips"
}

# ok_cmd NAME CMD...: runs CMD; passes when it exits 0 (its output is shown on failure).
ok_cmd() {
	local name=$1 out status
	shift
	out=$("$@" 2>&1)
	status=$?
	ok "$status" "$name" || diag "  command: $*" "  exit status: $status" "  output: $out"
	return "$status"
}

is() {
	local got=$1 want=$2 name=${3:-}
	[ "$got" = "$want" ]
	ok $? "$name" || diag "       got: '$got'
  expected: '$want'"
}

isnt() {
	local got=$1 bad=$2 name=${3:-}
	[ "$got" != "$bad" ]
	ok $? "$name" || diag "       got: '$got'
  expected anything else"
}

# like GOT ERE NAME: GOT matches the extended regular expression ERE (bash =~).
like() {
	local got=$1 re=$2 name=${3:-}
	[[ $got =~ $re ]]
	ok $? "$name" || diag "                  '$got'
    doesn't match '$re'"
}

unlike() {
	local got=$1 re=$2 name=${3:-}
	! [[ $got =~ $re ]]
	ok $? "$name" || diag "                  '$got'
          matches '$re'"
}

# cmp_ok A OP B NAME, OP one of -lt -le -eq -ne -ge -gt (integers).
cmp_ok() {
	local a=$1 op=$2 b=$3 name=${4:-}
	[ "$a" "$op" "$b" ] 2>/dev/null
	ok $? "$name" || diag "  '$a' $op '$b' is false"
}

bail_out() {
	echo "Bail out! $*"
	TAP_FAILED=$((TAP_FAILED + 1))
	exit 255
}

# ---------------------------------------------------------------- time, processes

now_ms() {
	local t=${EPOCHREALTIME/./}
	echo $((10#$t / 1000))
}

# seconds (integer or decimal, e.g. 0.5) -> milliseconds
secs_to_ms() {
	local s=$1 int frac
	int=${s%%.*}
	frac=
	[ "$int" != "$s" ] && frac=${s#*.}
	frac=${frac}000
	frac=${frac:0:3}
	echo $((10#${int:-0} * 1000 + 10#$frac))
}

# wait_until SECONDS 'shell condition': evaluate the condition every 50 ms until it
# succeeds (returns 0) or SECONDS have passed (returns 1, with a diagnostic).
wait_until() {
	local secs=$1 cond=$2 deadline
	deadline=$(($(now_ms) + $(secs_to_ms "$secs")))
	while :; do
		if eval "$cond"; then
			return 0
		fi
		if [ "$(now_ms)" -ge "$deadline" ]; then
			[ "$LIB_MODE" = tap ] && diag "wait_until: timed out after ${secs}s waiting for: $cond"
			return 1
		fi
		sleep 0.05
	done
}

# holds_for SECONDS 'shell condition': evaluate the condition every 50 ms for SECONDS;
# returns 1 (quietly) the first time it is false, 0 when it held all along. It proves an
# absence only as well as SECONDS cover the time the thing would take to happen: wait for
# a positive event first where there is one (the daemon logged that it acted, a session
# finished its claim), and keep SECONDS short.
holds_for() {
	local secs=$1 cond=$2 deadline
	deadline=$(($(now_ms) + $(secs_to_ms "$secs")))
	while :; do
		eval "$cond" || return 1
		[ "$(now_ms)" -ge "$deadline" ] && return 0
		sleep 0.05
	done
}

# pid_alive PID: the process exists and is not a zombie (PID 1 may not reap quickly).
pid_alive() {
	local pid=$1 line state
	[ -n "$pid" ] || return 1
	IFS= read -r line 2>/dev/null </proc/"$pid"/stat || return 1
	state=${line##*) }
	state=${state%% *}
	[ "$state" != Z ] && [ "$state" != X ]
}

# all_dead FILE: FILE lists pids (one or more, whitespace-separated) and none is alive;
# false while FILE is missing or empty (the processes have not recorded themselves yet).
all_dead() {
	local p
	[ -s "$1" ] || return 1
	for p in $(cat "$1"); do pid_alive "$p" && return 1; done
	return 0
}

# ---------------------------------------------------------------- PostgreSQL

find_pg_bindir() {
	local d
	if [ -n "$PG_BINDIR" ] && [ -x "$PG_BINDIR/initdb" ]; then
		echo "$PG_BINDIR"
		return 0
	fi
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) \
		"$(pg_config --bindir 2>/dev/null)" \
		"$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")" \
		/usr/local/pgsql/bin /usr/pgsql-*/bin; do
		if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# Runs a PostgreSQL server program as the unprivileged user when we are root.
as_pg() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u "$PG_USER" -- "$@"
	else
		"$@"
	fi
}

pg_opts() {
	echo "-c listen_addresses='' -c unix_socket_directories=$T/sock -c fsync=off -c max_connections=200 -c port=$PG_PORT"
}

# test_tmpdir: where scratch directories go: $PGJOBD_TEST_TMPDIR, else /dev/shm when it is
# a tmpfs we may write to, else /tmp. On a tmpfs the servers' data directories and every
# file the tests make and remove cost no disk filesystem's bookkeeping: the whole suite
# takes a sixth less CPU (119 s against 143 s on a 2-core VM with /tmp on ext4).
test_tmpdir() {
	if [ -n "${PGJOBD_TEST_TMPDIR:-}" ]; then
		echo "$PGJOBD_TEST_TMPDIR"
	elif [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ]; then
		echo /dev/shm
	else
		echo /tmp
	fi
}

make_tmp() {
	[ -n "$T" ] && return 0
	T=$(mktemp -d "$(test_tmpdir)/pgjobd-test.XXXXXX") || bail_out "mktemp failed"
	export T
	chmod 755 "$T"
}

# own_cluster / shared_cluster (before pg_start): which server this file uses.
#  - shared: tests/integration/run.sh (what `make check-integration` runs) starts one
#    server for the whole run, with a database pgjobd_template migrated by the binary
#    under test, and names its directory in $PGJOBD_TEST_CLUSTER. pg_start then starts no
#    server: it creates this file's own database from the template (CREATE DATABASE ...
#    TEMPLATE; from template0 after empty_database), which cleanup drops again. $T/sock is
#    a symbolic link to the server's socket directory, so "host=$T/sock" reaches it as
#    before; PGDATABASE and $DB_CONNINFO name the file's database (never spell the name
#    out: it is pgjobd_<file>_<pid>).
#  - own: initdb (or a copy of run.sh's freshly initialised data directory) and pg_ctl in
#    $T, database pgjobd_test, migrated by $PGJOBD unless empty_database was called (or
#    there is no $PGJOBD). A file run on its own (prove FILE) always gets one.
# A file that must own its server calls own_cluster: it stops or restarts the server,
# changes its settings or its authentication, measures what the server does for all
# databases at once (WAL), or creates roles or databases (cluster-wide: names would
# collide with another file's, and pgjobd's roles would exist for every later file; a
# role named by test_role is safe). pg_stat_activity, pg_locks and pg_terminate_backend
# show and reach every file's sessions on a shared server: filter by datname =
# current_database() (pg_locks: by database, or through pg_stat_activity), then call
# shared_cluster. A file that calls neither is scanned for the marks of the above
# ($OWN_CLUSTER_RE) and gets a server of its own when one is there (a note says which).
OWN_CLUSTER_RE='pg_restart|pg_stop|pg_ctl|pg_opts|pg_hba|ALTER SYSTEM|pg_reload_conf|(CREATE|ALTER|DROP) (ROLE|USER|DATABASE)|setup_roles|--grant|pg_stat_activity|pg_locks|pg_terminate_backend|pg_cancel_backend|pgjobd_test|PGUSER=| -U '
CLUSTER_MODE=
PG_SHARED=0
DB_TAG=
DB_EMPTY=0
own_cluster() { CLUSTER_MODE=own; }
shared_cluster() { CLUSTER_MODE=shared; }
empty_database() { DB_EMPTY=1; }

# pick_cluster: settles CLUSTER_MODE to own or shared.
pick_cluster() {
	local why
	if [ -z "${PGJOBD_TEST_CLUSTER:-}" ] || [ ! -S "$PGJOBD_TEST_CLUSTER/sock/.s.PGSQL.$PG_PORT" ]; then
		CLUSTER_MODE=own # no shared server: run alone
	elif [ -z "$CLUSTER_MODE" ] && [ "$LIB_MODE" != tap ]; then
		CLUSTER_MODE=own # tests/demo.sh, tests/chaos/run.sh
	elif [ -z "$CLUSTER_MODE" ]; then
		why=$(grep -oE -m1 -- "$OWN_CLUSTER_RE" "$0" 2>/dev/null | head -n1)
		if [ -n "$why" ]; then
			CLUSTER_MODE=own
			note "a server of its own: $(basename "$0") mentions '$why' (see own_cluster in lib.sh)"
		else
			CLUSTER_MODE=shared
		fi
	fi
}

# pg_client_bindir: where psql is: $PG_BINDIR, else (a server build without the client
# programs, as tests/pg-versions.sh installs) the newest of Debian's.
pg_client_bindir() {
	local d
	for d in "$PG_BINDIR" $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		[ -x "$d/psql" ] && echo "$d" && return 0
	done
	return 1
}

# pg_bin_major: the major version of the server in $PG_BINDIR (e.g. 16).
pg_bin_major() {
	"$PG_BINDIR/pg_ctl" --version | sed -n 's/^pg_ctl (PostgreSQL) \([0-9][0-9]*\).*/\1/p'
}

# pg_setup: finds initdb and pg_ctl ($PG_BINDIR) and, under root, the user the server runs
# as ($PG_USER). $PG_BINDIR, then the directory of psql when it is another, go first in
# PATH: Debian's /usr/bin/psql is a Perl wrapper that costs 20 ms of CPU per call, and the
# suite calls psql thousands of times.
pg_setup() {
	local client
	PG_BINDIR=$(find_pg_bindir) || bail_out "initdb/pg_ctl not found (install postgresql, or set PG_BINDIR)"
	export PG_BINDIR # the files of a run.sh run: the shared server's
	client=$(pg_client_bindir) || client=$PG_BINDIR
	local want="$PG_BINDIR:"
	[ "$client" = "$PG_BINDIR" ] || want="$PG_BINDIR:$client:"
	case "$PATH:" in
	"$want"*) ;;
	*) export PATH="$want$PATH" ;;
	esac
	if [ "$(id -u)" = 0 ]; then
		PG_USER=${PG_USER:-postgres}
		id -u "$PG_USER" >/dev/null 2>&1 || PG_USER=nobody
		# $T must be traversable by the server's user (mktemp makes it 0700).
		as_pg test -x "$T" || bail_out "$T is not reachable by user $PG_USER (set PGJOBD_TEST_TMPDIR)"
	fi
}

# pg_initdb DIR: a new data directory DIR. Under run.sh, a copy of the one it initialised
# (a tenth of initdb's time).
pg_initdb() {
	local dir=$1 fresh=${PGJOBD_TEST_CLUSTER:+$PGJOBD_TEST_CLUSTER/initdb}
	# (of the same major version: a file may start another server than run.sh's)
	if [ -n "$fresh" ] && [ -f "$fresh/PG_VERSION" ] &&
		[ "$(stat -c %U "$fresh")" = "${PG_USER:-$(id -un)}" ] &&
		[ "$(cat "$fresh/PG_VERSION")" = "$(pg_bin_major)" ]; then
		cp -a "$fresh" "$dir" && return 0
		rm -rf "$dir"
	fi
	mkdir -p "$dir"
	[ "$(id -u)" = 0 ] && chown "$PG_USER" "$dir"
	chmod 700 "$dir"
	if ! as_pg "$PG_BINDIR/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --locale=C \
		>"$T/initdb.log" 2>&1; then
		cat "$T/initdb.log" >&2
		bail_out "initdb failed"
	fi
}

pg_start() {
	make_tmp
	pick_cluster
	if [ "$CLUSTER_MODE" = shared ]; then
		pg_start_shared
		return
	fi
	pg_setup
	pg_initdb "$T/pg"
	mkdir -p "$T/sock"
	: >"$T/pg.log"
	if [ "$(id -u)" = 0 ]; then
		chown "$PG_USER" "$T/sock" "$T/pg.log"
	fi
	as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -o "$(pg_opts)" start >/dev/null ||
		bail_out "pg_ctl start failed (see $T/pg.log)"
	PG_RUNNING=1
	export PGHOST=$T/sock PGPORT=$PG_PORT PGUSER=postgres PGDATABASE=pgjobd_test
	unset PGPASSWORD PGSERVICE PGOPTIONS PGAPPNAME PGSSLMODE PGHOSTADDR
	PGDATABASE=postgres psql -X -qAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE pgjobd_test" >/dev/null ||
		bail_out "CREATE DATABASE failed"
	# The daemon's config names its database explicitly; the PG* variables above are
	# for psql in the tests only.
	DB_CONNINFO="host=$T/sock port=$PG_PORT dbname=pgjobd_test user=postgres"
	# As the shared server's template is (run.sh): a file sees the same database alone.
	if [ "$DB_EMPTY" != 1 ] && [ -x "$PGJOBD" ]; then
		printf '[pgjobd]\ndatabase = %s\n' "$DB_CONNINFO" >"$T/.pg_start.ini"
		"$PGJOBD" migrate -c "$T/.pg_start.ini" >"$T/.pg_start.out" 2>&1 ||
			bail_out "pgjobd migrate failed: $(cat "$T/.pg_start.out")"
	fi
}

# lease_kept MARKS LOG STARTS: what a lease-mode fault must leave behind: every job of the
# database in one attempt with one history entry, STARTS command starts in MARKS (see
# make_mark_script), and no lease lost or outcome given up in the daemon's LOG.
lease_kept() {
	is "$(count_jobs "attempts <> 1")" 0 "every job in one attempt"
	is "$(awk '$1 == "start"' "$1" | wc -l | tr -d ' ')" "$3" "each command started once"
	is "$(psql_q "SELECT count(*) FROM pgjobd.jobs WHERE jsonb_array_length(history) <> 1")" 0 \
		"one history entry each"
	if grep -q "lease lost\|lease could not be extended\|giving up" "$2"; then
		fail "no lease was lost, no outcome given up"
		diag "$(grep "lease lost\|lease could not be extended\|giving up" "$2")"
	else
		pass "no lease was lost, no outcome given up"
	fi
}

# pg_start_relayed: pg_start, with a server of the file's own that listens on TCP on the
# loopback address as well, and a TCP relay to it (tests/chaos/proxy.c, $CHAOS_PROXY):
# $RELAY is the relay's pid (SIGSTOP: a network partition, SIGCONT heals it, SIGUSR1 cuts
# every connection, SIGUSR2 black-holes every connection it carries for good),
# "host=127.0.0.1 port=$RELAY_PORT" reaches the server through it.
pg_start_relayed() {
	[ -x "${CHAOS_PROXY:-}" ] || bail_out "CHAOS_PROXY (build/tests/chaos-proxy) not found; run make"
	own_cluster
	PG_PORT=$("$CHAOS_PROXY" --free-port) || bail_out "no free port"
	pg_opts() {
		echo "-c listen_addresses=127.0.0.1 -c unix_socket_directories=$T/sock -c fsync=off" \
			"-c max_connections=200 -c port=$PG_PORT"
	}
	pg_start
	"$CHAOS_PROXY" "$T/relay.port" "$PG_PORT" 2>>"$T/relay.log" </dev/null &
	RELAY=$!
	DAEMON_PIDS+=("$RELAY")
	wait_until 10 "[ -s '$T/relay.port' ]" || bail_out "the relay did not start"
	RELAY_PORT=$(cat "$T/relay.port")
}

# The shared server's template database (see tests/integration/run.sh).
PG_TEMPLATE=pgjobd_template

pg_start_shared() {
	local base template=$PG_TEMPLATE
	[ "$DB_EMPTY" = 1 ] && template=template0
	base=$(basename "$0" .sh | tr 'A-Z' 'a-z' | tr -c 'a-z0-9_\n' _)
	DB_TAG=${base:0:40}_$$
	ln -s "$PGJOBD_TEST_CLUSTER/sock" "$T/sock" || bail_out "cannot link $T/sock"
	export PGHOST=$T/sock PGPORT=$PG_PORT PGUSER=postgres PGDATABASE=pgjobd_$DB_TAG
	unset PGPASSWORD PGSERVICE PGOPTIONS PGAPPNAME PGSSLMODE PGHOSTADDR
	# A database of that name can only be one a killed run of the same pid left behind.
	PGDATABASE=postgres psql -X -qAt -v ON_ERROR_STOP=1 \
		-c "DROP DATABASE IF EXISTS \"$PGDATABASE\" WITH (FORCE)" \
		-c "CREATE DATABASE \"$PGDATABASE\" TEMPLATE $template" >"$T/.createdb.out" 2>&1 ||
		bail_out "CREATE DATABASE $PGDATABASE TEMPLATE $template failed: $(cat "$T/.createdb.out")"
	PG_SHARED=1
	DB_CONNINFO="host=$T/sock port=$PG_PORT dbname=$PGDATABASE user=postgres"
}

# test_role NAME: a role name for this file: NAME_<file>_<pid>. On a shared server the
# cleanup drops every role so named (roles are cluster-wide).
test_role() { echo "${1}_${DB_TAG:-own}"; }

# pg_drop_shared: the end of a file on a shared server: its database and roles go.
pg_drop_shared() {
	[ "$PG_SHARED" = 1 ] || return 0
	PG_SHARED=0
	PGDATABASE=postgres psql -X -qAt -c "DROP DATABASE IF EXISTS \"pgjobd_$DB_TAG\" WITH (FORCE)" \
		>/dev/null 2>&1
	local r
	for r in $(PGDATABASE=postgres psql -X -qAt -c "SELECT quote_ident(rolname) FROM pg_roles
			WHERE right(rolname, $((${#DB_TAG} + 1))) = '_$DB_TAG'" 2>/dev/null); do
		PGDATABASE=postgres psql -X -qAt -c "DROP ROLE $r" >/dev/null 2>&1
	done
}

# needs_own NAME: stops a file that does NAME on the shared server.
needs_own() {
	[ "$PG_SHARED" = 1 ] && bail_out "$1 on the shared server: call own_cluster before pg_start"
	return 0
}

pg_restart() {
	needs_own pg_restart
	as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$T/pg" -l "$T/pg.log" -m fast -o "$(pg_opts)" restart >/dev/null
}

pg_stop() {
	needs_own pg_stop
	[ "$PG_RUNNING" = 1 ] || return 0
	as_pg "$PG_BINDIR/pg_ctl" -w -D "$T/pg" -m fast stop >/dev/null
	local s=$?
	[ $s = 0 ] && PG_RUNNING=0
	return $s
}

# psql_q SQL: run SQL, print the result unaligned without headers (-qAt).
psql_q() {
	psql -X -qAt -v ON_ERROR_STOP=1 -c "$1"
}

# sql_lit STRING: STRING as an SQL string literal (standard_conforming_strings is on).
sql_lit() {
	local s=${1//\'/\'\'}
	printf "'%s'" "$s"
}

job_field() { psql_q "SELECT $2 FROM pgjobd.jobs WHERE id = $1"; }
count_jobs() { psql_q "SELECT count(*) FROM pgjobd.jobs WHERE $1"; }
# unfinished QUEUE: t while QUEUE has a queued or running job. Four probes of the partial
# indexes (jobs_ready_free, jobs_ready_grouped, jobs_held: grouped jobs held back by a
# head that waits out a backoff, jobs_running): cheap on any backlog, and no sequential
# scan of jobs (t_44_burst_plans counts them).
unfinished() {
	psql_q "SELECT EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue = '$1' AND status = 'queued' AND group_id IS NULL)
		OR EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue = '$1' AND status = 'queued' AND group_id IS NOT NULL AND held_until IS NULL)
		OR EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue = '$1' AND status = 'queued' AND held_until IS NOT NULL)
		OR EXISTS (SELECT 1 FROM pgjobd.jobs WHERE queue = '$1' AND status = 'running')"
}

# ---------------------------------------------------------------- daemon

require_pgjobd() {
	[ -x "$PGJOBD" ] || bail_out "pgjobd binary not found at $PGJOBD (run make, or set PGJOBD)"
}

# claim_prepared: the SQL that sets a session up as the daemon's claiming sessions are and
# prepares the daemon's claim statement as qc, printed by the program's own code
# (tests/integration/claim-sql.c, $CLAIM_SQL). Fails (a message on stderr) without it.
claim_prepared() {
	local bin=${CLAIM_SQL:-$(dirname "$PGJOBD")/tests/claim-sql}
	if [ ! -x "$bin" ]; then
		echo "claim-sql not found at $bin (make build/tests/claim-sql, or set CLAIM_SQL)" >&2
		return 1
	fi
	"$bin"
}

# conf_header [key=value...]: the [pgjobd] section for the throwaway server; arguments
# override the defaults or add keys.
conf_header() {
	local -A kv=([database]="$DB_CONNINFO" [poll_interval]=200ms [log_level]=debug)
	local keys=(database poll_interval log_level) a k
	for a in "$@"; do
		k=${a%%=*}
		[ -n "${kv[$k]+x}" ] || keys+=("$k")
		kv[$k]=${a#*=}
	done
	echo "[pgjobd]"
	for k in "${keys[@]}"; do
		echo "$k = ${kv[$k]}"
	done
}

# write_conf FILE <<EOF ... EOF: write stdin to FILE (the heredoc usually starts with
# $(conf_header)).
write_conf() {
	cat >"$1"
}

pgjobd_migrate() {
	"$PGJOBD" migrate -c "$1"
}

# start_daemon NAME CONF [VAR=VALUE...]: run "$PGJOBD" -c CONF in the background with
# stdout+stderr to $T/NAME.log (appended), extra environment VAR=VALUE. The pid is in
# $DAEMON_PID and $T/NAME.pid, and is killed at cleanup.
start_daemon() {
	local name=$1 conf=$2
	shift 2
	if [ "${BASH_SUBSHELL:-0}" != 0 ]; then
		echo "start_daemon: called in a subshell; use \$DAEMON_PID instead of \$(...)" >&2
		exit 1
	fi
	# (The child drops the test's traps first: a signal that came before its exec
	# would otherwise run the test's cleanup in it.)
	(
		trap - EXIT INT TERM
		exec env "$@" "$PGJOBD" -c "$conf" >>"$T/$name.log" 2>&1 </dev/null
	) &
	DAEMON_PID=$!
	DAEMON_PIDS+=("$DAEMON_PID")
	echo "$DAEMON_PID" >"$T/$name.pid"
	[ "$LIB_MODE" = tap ] && note "started daemon $name: pid $DAEMON_PID, log $T/$name.log"
	return 0
}

# start_daemons NAME... <<EOF ... EOF: several daemons with one configuration: $T/NAME.ini
# is conf_header followed by stdin (the queue sections) for each NAME; the first one's is
# migrated (to $T/migrate.log), then each daemon is started (start_daemon NAME) and its pid
# kept in ${DAEMONS[NAME]}.
declare -A DAEMONS=()
start_daemons() {
	local body n
	body=$(cat)
	for n in "$@"; do
		printf '%s\n\n%s\n' "$(conf_header)" "$body" >"$T/$n.ini"
	done
	pgjobd_migrate "$T/$1.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"
	for n in "$@"; do
		start_daemon "$n" "$T/$n.ini"
		DAEMONS[$n]=$DAEMON_PID
	done
}

# restart_daemon NAME: stop the daemon start_daemons started as NAME and start it again
# with $T/NAME.ini, as the test has changed it since (one daemon of several with a
# setting of its own).
restart_daemon() {
	stop_daemon "${DAEMONS[$1]}" >/dev/null
	start_daemon "$1" "$T/$1.ini"
	DAEMONS[$1]=$DAEMON_PID
}

# stop_daemon PID [TIMEOUT]: SIGTERM, wait up to TIMEOUT s (default 30) for the exit,
# then SIGKILL. Returns the daemon's exit status (137 if it had to be killed).
stop_daemon() {
	local pid=$1 timeout=${2:-30} status
	kill -TERM "$pid" 2>/dev/null
	if ! wait_until "$timeout" "! pid_alive $pid"; then
		kill -KILL "$pid" 2>/dev/null
	fi
	wait "$pid" 2>/dev/null
	status=$?
	forget_daemon "$pid"
	return $status
}

# wait_daemon_exit PID TIMEOUT: wait for a daemon that was told to stop; sets
# DAEMON_STATUS to its exit status (or 999 when it was still running after TIMEOUT).
wait_daemon_exit() {
	local pid=$1 timeout=$2
	if wait_until "$timeout" "! pid_alive $pid"; then
		wait "$pid" 2>/dev/null
		DAEMON_STATUS=$?
		forget_daemon "$pid"
	else
		DAEMON_STATUS=999
	fi
}

forget_daemon() {
	local p keep=()
	for p in "${DAEMON_PIDS[@]}"; do
		[ "$p" != "$1" ] && keep+=("$p")
	done
	DAEMON_PIDS=("${keep[@]}")
}

# ---------------------------------------------------------------- job helpers

# make_mark_script FILE LOG: a bash job script that appends "start G ID ATTEMPT PID" and
# "end G ID ATTEMPT PID" lines to LOG (G is the group, "-" for none). For a grouped job it
# first takes flock -n on $T/lock.G: if another command of that group still runs (or any
# process it left behind), it logs "overlap G ID" and fails. Data keys: sleep (seconds,
# or "rand" for 10-90 ms), gate (then wait, up to 5 minutes, until the file $T/gate.GATE
# exists), fail_attempts (exit 1 while ATTEMPT <= N).
make_mark_script() {
	cat >"$1" <<EOF
#!/bin/bash
log='$2'
g=\${PGJOBD_GROUP_ID:-}
id=\$PGJOBD_JOB_ID
att=\$PGJOBD_ATTEMPT
if [ -n "\$g" ]; then
	exec 9>>'$T'/lock."\$g"
	if ! flock -n 9; then echo "overlap \$g \$id \$att \$\$" >>"\$log"; exit 1; fi
fi
echo "start \${g:--} \$id \$att \$\$" >>"\$log"
s=\${PGJOBD_ARG_sleep:-0}
[ "\$s" = rand ] && s=0.0\$((RANDOM % 9 + 1))
sleep "\$s"
if [ -n "\${PGJOBD_ARG_gate:-}" ]; then
	for _ in \$(seq 6000); do [ -e '$T'/gate."\$PGJOBD_ARG_gate" ] && break; sleep 0.05; done
fi
echo "end \${g:--} \$id \$att \$\$" >>"\$log"
if [ "\${PGJOBD_ARG_fail_attempts:-0}" -ge "\$att" ]; then exit 1; fi
echo '{"ok": true}'
EOF
	chmod +x "$1"
}

# make_sleeper_script FILE: a job script that runs until it is killed: it appends its
# shell's pid to $T/sh.pids and writes it to $T/sh.ID.pid (ID: the job's id), starts a
# grandchild (sleep 300 &) whose pid goes to $T/gc.pids and $T/gc.ID.pid, and waits for
# it. `all_dead $T/gc.pids` then tells whether a kill reached the whole process group;
# the cleanup kills whatever these files name. Run it with exec (`command = exec /bin/sh
# FILE`), so that the shell whose pid it records is the command's.
make_sleeper_script() {
	cat >"$1" <<EOF
#!/bin/sh
echo \$\$ >>'$T/sh.pids'
echo \$\$ >'$T/sh.'"\$PGJOBD_JOB_ID".pid
sleep 300 &
echo \$! >>'$T/gc.pids'
echo \$! >'$T/gc.'"\$PGJOBD_JOB_ID".pid
wait
EOF
	chmod +x "$1"
}

# make_limit_script FILE DIR: a job script that measures flow control from the commands'
# side (pgjobd(8), "Flow control"). Under flock on DIR/limit.lock it records its pid (with
# its start time, so that a pid taken since by another process is not counted), queue
# and group in DIR/pids, then counts how many of the recorded commands of its
# queue, and of its group, are alive now (itself included; a zombie has ended and is
# not counted), and appends "start QUEUE GROUP JOB ATTEMPT NS NQUEUE NGROUP TICKS" to
# DIR/starts (NS: its start, CLOCK_REALTIME ns, its first instruction: bash's
# EPOCHREALTIME, no fork, before the lock; TICKS: when pgjobd made its process, by the
# kernel, in clock ticks since boot: /proc/PID/stat's starttime). A command killed by
# SIGKILL is not counted once dead, which a decrement at exit would miss. Then it sleeps
# data's `sleep` (default 0.3 s) and exits 1 while its attempt is at most data's
# `fail_attempts`. Run it with exec, so that the recorded pid is the command's.
make_limit_script() {
	cat >"$1" <<EOF
#!/bin/bash
t=\${EPOCHREALTIME/[.,]/}000
d='$2'
q=\$PGJOBD_QUEUE g=\${PGJOBD_GROUP_ID:--}
# starttime: field 22 of /proc/PID/stat (the 20th after the command's name), so that a
# recorded pid that another process has taken since is not counted.
stat_of() { local l; IFS= read -r l </proc/\$1/stat 2>/dev/null || return 1; set -- \${l##*) }; st=\$1 start=\${20}; }
alive() { stat_of "\$1" && [ "\$st" != Z ] && [ "\$start" = "\$2" ]; }
exec 8>>"\$d/limit.lock"
flock 8
stat_of \$\$
echo "\$\$ \$start \$q \$g" >>"\$d/pids"
nq=0 ng=0
while read -r p ps pq pg; do
	[ "\$pq" = "\$q" ] && alive "\$p" "\$ps" || continue
	nq=\$((nq + 1))
	[ "\$pg" = "\$g" ] && ng=\$((ng + 1))
done <"\$d/pids"
echo "start \$q \$g \$PGJOBD_JOB_ID \$PGJOBD_ATTEMPT \$t \$nq \$ng \$start" >>"\$d/starts"
exec 8>&-
sleep "\${PGJOBD_ARG_sleep:-0.3}"
[ "\$PGJOBD_ATTEMPT" -le "\${PGJOBD_ARG_fail_attempts:-0}" ] && exit 1
exit 0
EOF
	chmod +x "$1"
}

# limit_max STARTS QUEUE [group]: the most commands of QUEUE (or of one of its groups)
# seen alive at once by make_limit_script; 0 when none started.
limit_max() {
	local col=7
	[ "${3:-}" = group ] && col=8
	awk -v q="$2" -v c="$col" '$1 == "start" && $2 == q && $c > m { m = $c } END { print m + 0 }' "$1"
}

# rate_worst STARTS QUEUE PERIOD_MS [group] [spawn]: the most starts of QUEUE (or of any
# one of its groups) within one window of PERIOD_MS, by the commands' own stamps (a window
# ending at each start); with "spawn", by when pgjobd made their processes (the kernel's
# start times, in ticks of 10 ms: a window can look up to a tick shorter than it was).
rate_worst() {
	local per_group=0 col=6 unit=1e6
	[ "${4:-}" = group ] && per_group=1
	[ "${4:-}" = spawn ] || [ "${5:-}" = spawn ] && col=9 unit=$(awk -v t="$(getconf CLK_TCK)" 'BEGIN { print t / 1000 }')
	awk -v q="$2" -v g="$per_group" -v c="$col" '$1 == "start" && $2 == q { print (g ? $3 : "-"), $c }' "$1" |
		sort -k1,1 -k2,2n | awk -v p="$3" -v u="$unit" '
		$1 != pk { n = 0; pk = $1 }
		{ ts[n] = $2 / u; c = 0
		  for (j = n; j >= 0 && ts[n] - ts[j] < p; j--) c++
		  n++
		  if (c > w) w = c }
		END { print w + 0 }'
}

# check_markers [--lenient] LOG: prints every problem found in a marker log and returns
# 1 if there was any:
#  - an "overlap" line (flock saw two commands of one group at once);
#  - per group, starts and ends do not alternate (skipped with --lenient, for tests that
#    kill commands, which then write no "end");
#  - per group, the sequence of started job ids (consecutive repeats, i.e. retries,
#    collapsed) is not strictly increasing.
check_markers() {
	local lenient=0
	[ "$1" = --lenient ] && { lenient=1; shift; }
	[ -r "$1" ] || { echo "no marker log $1"; return 1; }
	awk -v lenient=$lenient '
		$1 == "overlap" { print "line " NR ": overlap in group " $2 " (job " $3 ")"; bad = 1; next }
		$2 == "-" { next }
		$1 == "start" {
			if (!lenient && ($2 in run)) { print "line " NR ": job " $3 " started while job " run[$2] " of group " $2 " runs"; bad = 1 }
			run[$2] = $3
			if (($2 in last) && $3 != last[$2]) {
				if (($2 SUBSEP $3) in seen) { print "line " NR ": group " $2 ": job " $3 " started again after job " last[$2]; bad = 1 }
				else if ($3 + 0 < last[$2] + 0) { print "line " NR ": group " $2 ": job " $3 " started after job " last[$2]; bad = 1 }
			}
			seen[$2, $3] = 1
			last[$2] = $3
			next
		}
		$1 == "end" {
			if (!lenient && run[$2] != $3) { print "line " NR ": end of job " $3 " but group " $2 " runs job " run[$2]; bad = 1 }
			delete run[$2]
			next
		}
		END { exit bad }
	' "$1"
}

# mark_started LOG ID ATTEMPT: LOG (a marker log) shows attempt ATTEMPT of job ID started.
mark_started() { grep -q "^start [^ ]* $2 $3 " "$1" 2>/dev/null; }

# mark_pid LOG ID ATTEMPT: the pid of the command that ran attempt ATTEMPT of job ID.
mark_pid() { awk -v id="$2" -v a="$3" '$1 == "start" && $3 == id && $4 == a { p = $5 } END { print p }' "$1"; }

# workers_alive N: at least N daemons are registered in pgjobd.workers and alive.
workers_alive() { [ "$(psql_q "SELECT count(*) FROM pgjobd.workers WHERE alive_until > now()")" -ge "$1" ]; }

# queues_waiting QUEUE...: each QUEUE has a claimer registered in pgjobd.waiting, so that
# a job inserted now wakes it. Wake-ups are hints (sql/README): a producer's INSERT that
# runs while a claimer's first claim is in flight sends none, and the job waits for the
# poll. A test with a long poll_interval that expects a wake-up waits for this first.
queues_waiting() {
	local q n=0
	for q in "$@"; do
		n=$((n + $(psql_q "SELECT count(*) > 0 FROM pgjobd.waiting WHERE queue = $(sql_lit "$q")" | grep -c t)))
	done
	[ "$n" = $# ]
}

# max_parallel LOG: the largest number of ungrouped ("-") commands running at once.
max_parallel() {
	awk '$2 == "-" && $1 == "start" { n++; if (n > m) m = n } $2 == "-" && $1 == "end" { n-- } END { print m + 0 }' "$1"
}

# ---------------------------------------------------------------- cleanup

cleanup() {
	local status=$? p f
	trap - EXIT
	for p in "${DAEMON_PIDS[@]}"; do
		kill -KILL "$p" 2>/dev/null
	done
	for p in "${DAEMON_PIDS[@]}"; do
		wait "$p" 2>/dev/null
	done
	if [ "$PG_RUNNING" = 1 ]; then
		as_pg "$PG_BINDIR/pg_ctl" -D "$T/pg" -m immediate stop >/dev/null 2>&1
	fi
	if [ -n "$T" ] && [ -d "$T" ]; then
		# Leftovers: processes naming $T (daemons' helpers, job shells) and pids that
		# tests recorded in $T/*.pid.
		pkill -KILL -f -- "$T/" 2>/dev/null
		for f in "$T"/*.pid "$T"/*.pids; do
			[ -f "$f" ] || continue
			for p in $(cat "$f" 2>/dev/null); do
				case $p in *[!0-9]* | '') continue ;; esac
				[ "$p" -gt 1 ] && [ "$p" != $$ ] && kill -KILL "$p" 2>/dev/null
			done
		done
	fi
	if [ "$LIB_MODE" = tap ]; then
		if [ "$TAP_DONE" != 1 ] && [ -z "$TAP_PLANNED" ]; then
			echo "1..$TAP_N"
			diag "the test script ended without a plan or done_testing (status $status)"
			TAP_FAILED=$((TAP_FAILED + 1))
		elif [ -n "$TAP_PLANNED" ] && [ "$TAP_PLANNED" != "$TAP_N" ]; then
			diag "planned $TAP_PLANNED tests but ran $TAP_N (status $status)"
			TAP_FAILED=$((TAP_FAILED + 1))
		fi
		[ "$status" != 0 ] && [ "$TAP_FAILED" = 0 ] && TAP_FAILED=1
	else
		[ "$status" != 0 ] && TAP_FAILED=1
	fi
	if [ "$PG_SHARED" = 1 ]; then
		# The shared server's log, this database's lines (run.sh puts "db=NAME" in them).
		if [ "$TAP_FAILED" != 0 ] && [ -d "$T" ]; then
			grep -aF "db=$PGDATABASE " "$PGJOBD_TEST_CLUSTER/pg.log" 2>/dev/null | tail -n 80 >"$T/pg.log"
		fi
		[ "${PGJOBD_KEEP_TMP:-0}" = 1 ] || pg_drop_shared
	fi
	if [ "$TAP_FAILED" != 0 ] && [ -n "$T" ] && [ -d "$T" ]; then
		for f in "$T"/*.log; do
			[ -s "$f" ] || continue
			[ "${f##*/}" = initdb.log ] && continue
			diag "---- last 80 lines of $f ----"
			diag "$(tail -n 80 "$f")"
		done
	fi
	if [ -n "$T" ] && [ -d "$T" ]; then
		if [ "${PGJOBD_KEEP_TMP:-0}" = 1 ]; then
			diag "kept $T"
		else
			rm -rf "$T"
		fi
	fi
	if [ "$LIB_MODE" = tap ]; then
		if [ "$TAP_SKIPPED" != 0 ]; then
			local why=${TAP_SKIP_WHY[0]} w
			for w in "${TAP_SKIP_WHY[@]:1}"; do why="$why; $w"; done
			diag "$(basename "$0"): skipped $TAP_SKIPPED of $TAP_N checks ($why)"
		fi
		[ "$TAP_FAILED" != 0 ] && diag "failed $TAP_FAILED of $TAP_N tests"
		[ "$TAP_FAILED" -gt 254 ] && TAP_FAILED=254
		exit "$TAP_FAILED"
	fi
	exit "$status"
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
