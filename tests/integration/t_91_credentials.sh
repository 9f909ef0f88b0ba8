#!/usr/bin/env bash
# A command cannot reach the daemon's database credentials (pgjobd(8),
# SECURITY MODEL). The setup is the shipped one: the daemon runs as an
# unprivileged user that holds only CAP_SETUID, CAP_SETGID and CAP_KILL (setpriv stands
# in for the unit's User= and AmbientCapabilities=, with no_new_privs as
# NoNewPrivileges=yes), from its home directory (mode 0700, as StateDirectoryMode=), with
# a password in ~/.pgpass (0600), PGPASSWORD in its environment and password= in the
# configuration file (0640, group of the daemon). The queue runs its command as another
# user (`user = nobody`). The command then tries what a job script did to steal the
# daemon's identity: read ~/.pgpass and the configuration file, read /proc/PID/environ of
# the daemon and of its supervisor, find PGPASSWORD in its own environment, list the
# daemon's fds, open its memory, copy its database sockets with pidfd_getfd (with
# python3), plant ~/.pgpass entries or ~/.postgresql/ files for the daemon's next
# connect. Each must fail, and no secret may appear in the job's result, error or the
# daemon's log. A process of the daemon's own uid (another command run as that user, say)
# cannot read the two environments or copy the sockets either: both are non-dumpable.
# Without the capabilities, the daemon refuses to start (exit 2, naming them); with them,
# it still stops the other user's commands (timeout; the supervisor after kill -9).
#
# The server uses trust authentication: the passwords only have to be there to be stolen.
#
# T91_COMMAND_USER=daemon runs the same attack against the old default instead (no
# `user`: commands run as the daemon's user, which holds no capability): the test then
# fails, which shows what it detects.
#
# Needs root (to start the daemon as another user) and setpriv with ambient capabilities
# (util-linux >= 2.31, Linux >= 4.3); skipped, never failed, without them. `check` and
# `reload` run without the capabilities refuse the file as the daemon does.
. "$(dirname "$0")/lib.sh"
require_pgjobd

mode=${T91_COMMAND_USER:-other}
CMD_USER=nobody
[ "$(id -u)" = 0 ] || skip_all "needs root to run the daemon as another user"
command -v setpriv >/dev/null 2>&1 || skip_all "setpriv (util-linux) is not installed"
id -u "$CMD_USER" >/dev/null 2>&1 || skip_all "no user $CMD_USER for the commands"
CMD_UID=$(id -u "$CMD_USER")

# The daemon's user: a free uid without a passwd entry (nothing on the machine changes).
DUID=
for ((u = 47000 + $$ % 900; u < 48000; u++)); do
	if ! getent passwd "$u" >/dev/null && ! getent group "$u" >/dev/null &&
		! pgrep -U "$u" >/dev/null; then
		DUID=$u
		break
	fi
done
[ -n "$DUID" ] || skip_all "no free uid in 47000-47999 for the daemon"

caps=+setuid,+setgid,+kill
as_daemon_caps=(setpriv --reuid="$DUID" --regid="$DUID" --clear-groups --no-new-privs
	--inh-caps=-all,$caps --ambient-caps=-all,$caps --bounding-set=-all,$caps --)
as_daemon_plain=(setpriv --reuid="$DUID" --regid="$DUID" --clear-groups --no-new-privs
	--inh-caps=-all --bounding-set=-all --)
probe=$("${as_daemon_caps[@]}" grep -E '^Cap(Eff|Amb):' /proc/self/status 2>&1 | tr -s '\t\n' '  ')
[ "$probe" = "CapEff: 00000000000000e0 CapAmb: 00000000000000e0 " ] ||
	skip_all "setpriv cannot give an unprivileged user ambient capabilities here ($probe)"

# python3 with os.pidfd_open and ctypes, on the commands' PATH, for the pidfd_getfd attempts.
PY=0
env -i PATH=/usr/local/bin:/usr/bin:/bin python3 -c 'import os, ctypes; os.pidfd_open' 2>/dev/null && PY=1

shared_cluster # its "pgrep -U" is no psql -U: no role of its own
pg_start
make_tmp
ENV_SECRET=t91-environ-secret-$RANDOM$RANDOM
PGPASS_SECRET=t91-pgpass-secret-$RANDOM$RANDOM
INI_SECRET=t91-ini-secret-$RANDOM$RANDOM
DHOME=$T/dhome
mkdir -m 0700 "$DHOME" "$DHOME/.postgresql"
printf '*:*:*:*:%s\n' "$PGPASS_SECRET" >"$DHOME/.pgpass"
chmod 0600 "$DHOME/.pgpass"
chown -R "$DUID:$DUID" "$DHOME"
pgpass_before=$(cat "$DHOME/.pgpass")

# pidfd_getfd on every fd below 64 of a process: exit 0 and "copied FD->TARGET..." when it
# got any, else exit 1 and the errors.
cat >"$T/pidfd.py" <<'EOF'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_getfd = 438  # the same number on every architecture
try:
    pfd = os.pidfd_open(int(sys.argv[1]))
except OSError as e:
    print("pidfd_open:", e.strerror)
    sys.exit(1)
got, errs = [], set()
for fd in range(64):
    r = libc.syscall(SYS_pidfd_getfd, pfd, fd, 0)
    if r >= 0:
        got.append("%d->%s" % (fd, os.readlink("/proc/self/fd/%d" % r)))
        os.close(r)
    else:
        errs.add(os.strerror(ctypes.get_errno()))
if got:
    print("copied", " ".join(got))
    sys.exit(0)
print(",".join(sorted(errs)))
sys.exit(1)
EOF
chmod 0644 "$T/pidfd.py"

# The attack. One line per attempt: "NAME: got WHAT" or "NAME: refused WHY".
cat >"$T/steal.sh" <<EOF
#!/bin/bash
dhome='$DHOME'
ini='$T/d.ini'
py='$T/pidfd.py'
EOF
cat >>"$T/steal.sh" <<'EOF'
dpid=$PGJOBD_ARG_dpid
gpid=$PGJOBD_ARG_gpid
try() {
	local name=$1 out
	shift
	if out=$("$@" 2>&1); then
		printf '%s: got %s\n' "$name" "$(printf '%s' "$out" | tr '\0\n' '  ' | head -c 300)"
	else
		printf '%s: refused %s\n' "$name" "$(printf '%s' "$out" | tr '\0\n' '  ' | head -c 300)"
	fi
}
echo "uid: $(id -u)"
echo "caps: $(grep -E '^Cap(Inh|Prm|Eff|Amb):' /proc/self/status | tr -s '\t\n' '  ')"
try pgpass cat "$dhome/.pgpass"
try ini cat "$ini"
try daemon_environ cat "/proc/$dpid/environ"
try guard_environ cat "/proc/$gpid/environ"
try own_environ printenv PGPASSWORD
try daemon_fds ls -l "/proc/$dpid/fd"
try daemon_mem sh -c "exec 3<'/proc/$dpid/mem'"
try write_pgpass sh -c "echo '*:*:*:*:planted' >>'$dhome/.pgpass'"
try write_postgresql sh -c "echo planted >'$dhome/.postgresql/root.crt'"
try write_home touch "$dhome/.planted"
if [ "$PGJOBD_ARG_py" = 1 ]; then
	try daemon_pidfd python3 "$py" "$dpid"
	try guard_pidfd python3 "$py" "$gpid"
fi
exit 0
EOF
chmod 0755 "$T/steal.sh"

if [ "$mode" = daemon ]; then
	note "T91_COMMAND_USER=daemon: the old default, commands run as the daemon's user"
	user_line=
	as_daemon=("${as_daemon_plain[@]}")
else
	user_line="user = $CMD_USER"
	as_daemon=("${as_daemon_caps[@]}")
fi
write_conf "$T/d.ini" <<EOF
$(conf_header database="$DB_CONNINFO password=$INI_SECRET")

[queue.steal]
command = '$T/steal.sh'
timeout = 60s
$user_line

[queue.slow]
command = sleep 300 & echo \$! >'$T/cmd/slow.pids'; wait
timeout = 1s
kill_grace = 1s
max_attempts = 1
working_dir = $T/cmd
$user_line

[queue.hang]
command = sleep 300 & echo \$! >'$T/cmd/hang.pids'; wait
working_dir = $T/cmd
$user_line
EOF
# Where the commands leave their pids: writable by the commands' user only.
install -d -m 0700 -o "$([ "$mode" = daemon ] && echo "$DUID" || echo "$CMD_UID")" "$T/cmd"
chown "root:$DUID" "$T/d.ini"
chmod 0640 "$T/d.ini"
pgjobd_migrate "$T/d.ini" >"$T/migrate.log" 2>&1 || bail_out "pgjobd migrate failed"

# start_daemon runs $PGJOBD through env: this wrapper makes it the daemon's user, in its
# home, with the capabilities, keeping the pid (every step execs).
REAL_PGJOBD=$PGJOBD
{
	echo '#!/bin/sh'
	echo "cd '$DHOME' || exit 1"
	printf 'exec'
	printf ' %q' "${as_daemon[@]}" "$REAL_PGJOBD"
	echo ' "$@"'
} >"$T/as-daemon"
chmod 0755 "$T/as-daemon"

# 1. Without the capabilities, a queue with another user is refused at start.
if [ "$mode" != daemon ]; then
	(cd "$DHOME" && HOME=$DHOME timeout 20 "${as_daemon_plain[@]}" "$REAL_PGJOBD" -c "$T/d.ini") \
		>"$T/nocaps.log" 2>&1
	is "$?" 2 "without CAP_SETUID, CAP_SETGID and CAP_KILL the daemon does not start (exit 2)"
	grep -q 'cannot run commands as another user.*queue=steal user=nobody missing="CAP_SETUID CAP_SETGID CAP_KILL"' \
		"$T/nocaps.log"
	ok $? "... and says which capabilities are missing" || diag "$(cat "$T/nocaps.log")"
	# check and reload, run the same way, refuse the file as the daemon does.
	(cd "$DHOME" && HOME=$DHOME PGPASSWORD=$ENV_SECRET timeout 20 "${as_daemon_plain[@]}" \
		"$REAL_PGJOBD" check -c "$T/d.ini") >"$T/nocaps-check.log" 2>&1
	is "$?" 2 "check as the daemon's user without the capabilities: exit 2, as the daemon"
	grep -q 'cannot run commands as another user.*missing="CAP_SETUID CAP_SETGID CAP_KILL"' \
		"$T/nocaps-check.log" && grep -q "would refuse $T/d.ini" "$T/nocaps-check.log"
	ok $? "... naming the missing capabilities" || diag "$(cat "$T/nocaps-check.log")"
	sleep 300 &
	target=$!
	(cd "$DHOME" && timeout 20 "${as_daemon_plain[@]}" "$REAL_PGJOBD" reload --pid "$target" \
		-c "$T/d.ini") >"$T/nocaps-reload.log" 2>&1
	is "$?:$(ps -o stat= -p "$target" | cut -c1)" "2:S" \
		"reload without the capabilities: exit 2, nothing signalled" ||
		diag "$(cat "$T/nocaps-reload.log")"
	kill "$target" 2>/dev/null
	wait "$target" 2>/dev/null
fi

# 2. The daemon as the shipped unit runs it.
PGJOBD=$T/as-daemon start_daemon d "$T/d.ini" HOME="$DHOME" PGPASSWORD="$ENV_SECRET"
d=$DAEMON_PID
wait_until 15 "[ -n \"\$(pgrep -P $d -U $DUID)\" ]" || bail_out "the daemon started no supervisor"
g=$(pgrep -P "$d" -U "$DUID" | head -n1)
note "daemon pid $d, supervisor pid $g, uid $DUID; commands as $CMD_USER ($CMD_UID)"
is "$(awk '/^Uid:/ { print $2 }' /proc/"$d"/status)" "$DUID" "the daemon runs as its own unprivileged uid"
is "$(stat -c %u /proc/"$d"/environ)/$(stat -c %u /proc/"$g"/environ)" 0/0 \
	"the daemon and its supervisor are non-dumpable (their /proc files belong to root)"

id=$(psql_q "INSERT INTO pgjobd.jobs (queue, data) VALUES ('steal', jsonb_build_object('dpid', $d, 'gpid', $g, 'py', $PY)) RETURNING id")
wait_until 60 "[ \"\$(job_field $id status)\" = succeeded ]"
ok $? "the job ran to its end" || diag "status: $(job_field "$id" "status || ' ' || coalesce(error::text, '')")"
report=$(job_field "$id" "result->>'stdout'")
note "what the command got:
$report"

if [ "$mode" = daemon ]; then
	is "$(grep '^uid:' <<<"$report")" "uid: $DUID" "the command ran as the daemon's user (old default)"
else
	is "$(grep '^uid:' <<<"$report")" "uid: $CMD_UID" "the command ran as $CMD_USER, not as the daemon"
fi
is "$(grep '^caps:' <<<"$report")" \
	"caps: CapInh: 0000000000000000 CapPrm: 0000000000000000 CapEff: 0000000000000000 CapAmb: 0000000000000000 " \
	"the command holds no capability"
attempts=(pgpass ini daemon_environ guard_environ own_environ daemon_fds daemon_mem
	write_pgpass write_postgresql write_home)
[ "$PY" = 1 ] && attempts+=(daemon_pidfd guard_pidfd)
# Refused by the kernel's access checks (EACCES, EPERM), not for some other reason such as
# a wrong path: that would prove nothing.
denied='(Permission denied|Operation not permitted)'
for a in "${attempts[@]}"; do
	want="^$a: refused .*$denied"
	[ "$a" = own_environ ] && want="^$a: refused *$" # printenv: not set
	like "$(grep "^$a: " <<<"$report")" "$want" "the command gets nothing from: $a"
done
[ "$PY" = 1 ] || skip "python3 with os.pidfd_open not on the commands' PATH: no pidfd_getfd attempt"

# The whole row (result, error and any column a later schema adds, such as a history).
everything=$(psql_q "SELECT row_to_json(j) FROM pgjobd.jobs j WHERE id = $id")
[ -n "$everything" ] || bail_out "cannot read job $id back"
leaked=
for s in "$ENV_SECRET" "$PGPASS_SECRET" "$INI_SECRET"; do
	grep -qF -- "$s" <<<"$everything" && leaked="$leaked ${s%-*}"
done
is "$leaked" "" "no secret anywhere in the job's row"
is "$(cat "$DHOME/.pgpass")" "$pgpass_before" "~/.pgpass of the daemon is unchanged"
is "$(find "$DHOME" -mindepth 1 | sort | tr '\n' ' ')" "$DHOME/.pgpass $DHOME/.postgresql " \
	"nothing was planted in the daemon's home"

# 3. Another process of the daemon's own uid (without capabilities): non-dumpable.
as_same_uid() { "${as_daemon_plain[@]}" env -i PATH=/usr/local/bin:/usr/bin:/bin "$@" 2>&1; }
out=$(as_same_uid cat /proc/"$d"/environ)
like "$?:$out" "^1:.*Permission denied" "a process of the daemon's uid cannot read the daemon's /proc/PID/environ"
out2=$(as_same_uid cat /proc/"$g"/environ)
like "$?:$out2" "^1:.*Permission denied" "... nor the supervisor's"
out3=
if [ "$PY" = 1 ]; then
	out3=$(as_same_uid python3 "$T/pidfd.py" "$d")
	like "$?:$out3" "^1:Operation not permitted$" "... nor copy the daemon's sockets with pidfd_getfd"
else
	skip "python3 with os.pidfd_open not available"
fi
grep -qF -- "$ENV_SECRET" <<<"$out$out2$out3"
isnt $? 0 "PGPASSWORD did not leak to a process of the daemon's uid"

# 4. The daemon still stops commands of another user: its timeout, then the supervisor
# after a kill -9 of the daemon (CAP_KILL, inherited by the supervisor).
id=$(psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('slow') RETURNING id")
wait_until 30 "[ \"\$(job_field $id status)\" = failed ]"
ok $? "a command past its timeout is stopped"
is "$(job_field "$id" "error->>'reason'")" timeout "... with reason timeout"
cp "$T/cmd/slow.pids" "$T/slow.pids" 2>/dev/null # for the cleanup, should it be alive
all_dead "$T/slow.pids"
ok $? "... and its process group is gone"

pid_alive "$d"
ok $? "the daemon is still running"
stop_daemon "$d"
is "$?" 0 "the daemon stops cleanly (exit 0)"

PGJOBD=$T/as-daemon start_daemon d2 "$T/d.ini" HOME="$DHOME" PGPASSWORD="$ENV_SECRET"
d=$DAEMON_PID
psql_q "INSERT INTO pgjobd.jobs (queue) VALUES ('hang')" >/dev/null
wait_until 30 "[ -s '$T/cmd/hang.pids' ]" || bail_out "the hang job did not start"
cp "$T/cmd/hang.pids" "$T/hang.pids"
pid_alive "$(cat "$T/hang.pids")"
ok $? "a command runs"
kill -KILL "$d"
wait "$d" 2>/dev/null
forget_daemon "$d"
wait_until 15 "all_dead '$T/hang.pids'"
ok $? "after kill -9 of the daemon, the supervisor kills the command of the other user"

leaked=
for s in "$ENV_SECRET" "$PGPASS_SECRET" "$INI_SECRET"; do
	grep -qF -- "$s" "$T/d.log" "$T/d2.log" && leaked="$leaked ${s%-*}"
done
is "$leaked" "" "no secret in the daemon's log"
done_testing
