#!/usr/bin/env bash
# tests/systemd/run.sh - the Debian package under a real systemd (TAP; `make check-systemd`).
#
# Builds nothing itself: DEB names the package `make deb` built. A minimal Debian 12 root
# (debootstrap from the mirror apt uses here, with systemd, dbus, PostgreSQL and the
# package's libraries, but not procps) is made once and kept in $NSPAWN_CACHE; each run
# boots it with `systemd-nspawn -b` on a private network, with a throwaway overlay over the
# cached root (--volatile=overlay), and drives it with nsenter (no machined on the host):
#   - dpkg -i; the preset; `systemctl enable --now` reaches active through READY=1
#   - an unmigrated database does not make the unit restart forever
#   - a job enqueued by psql runs as pgjobd-run in a cgroup of its own
#   - `systemctl reload` applies a new queue and fails for a bad file (STATUS= says so
#     when the daemon itself refuses one)
#   - resource limits: enforced in the unit's cgroup where it offers memory, pids and cpu
#     (oom, tasks_max_hit, cpu_max 20%), else refused at reload, naming queue and key
#   - the watchdog restarts a stopped daemon (SIGSTOP)
#   - `systemctl stop` lets a running job finish
#   - an upgrade of the package restarts the daemon
#   - purge removes what the package made
# Skipped (1..0 # SKIP why) where the machine cannot do this: not root, no systemd-nspawn
# or debootstrap, no mirror, or a container that does not boot.
set -u
REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${B:-$REPO_ROOT/build}
CACHE=${NSPAWN_CACHE:-$B/nspawn}
DEB=${DEB:-$(ls "$B"/deb/pgjobd_*.deb 2>/dev/null | head -1)}
SUITE=bookworm
INCLUDE=systemd,systemd-sysv,dbus,postgresql,libpq5,libev4,libinih1,libyaml-0-2
T=$(mktemp -d /tmp/pgjobd-sysd.XXXXXX)
started=$(date +%s)

n=0
failed=0
ok() { # ok STATUS DESCRIPTION [TODO-REASON]
	n=$((n + 1))
	local todo=${3:+ # TODO $3}
	if [ "$1" -eq 0 ]; then
		echo "ok $n - $2$todo"
	else
		echo "not ok $n - $2$todo"
		[ -n "${3:-}" ] || failed=$((failed + 1))
	fi
}
diag() { sed 's/^/# /'; }
skip_all() {
	echo "1..0 # SKIP $*"
	rm -rf "$T"
	exit 0
}

[ "$(id -u)" = 0 ] || skip_all "needs root (debootstrap, systemd-nspawn)"
for c in systemd-nspawn debootstrap nsenter dpkg-deb; do
	command -v "$c" >/dev/null || skip_all "$c is not installed (tests/deps.sh installs it)"
done
[ -n "$DEB" ] && [ -f "$DEB" ] || skip_all "no package: run make deb first (or set DEB)"

# The mirror apt is configured with (deb822 or one-line sources).
mirror=$(sed -n 's/^URIs: *\([^ ]*debian\/\?\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ { print $2; exit }' \
	/etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

base=$CACHE/base-$SUITE-$(echo "$INCLUDE" | md5sum | cut -c1-8)
if [ ! -e "$base/.complete" ]; then
	rm -rf "$base" && mkdir -p "$CACHE"
	echo "# debootstrap $SUITE from $mirror into $base (once; kept for later runs)"
	if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$base" "$mirror" \
		>"$CACHE/debootstrap.log" 2>&1; then
		tail -5 "$CACHE/debootstrap.log" | diag
		skip_all "debootstrap from $mirror failed (see $CACHE/debootstrap.log)"
	fi
	echo pgjobd-ci >"$base/etc/hostname"
	touch "$base/.complete"
fi

# Boot. nspawn without machined: no registration, no scope of its own.
mkdir -p "$T/deb"
cp "$DEB" "$T/deb/pgjobd.deb"
machine=pgjobd-ci-$$
systemd-nspawn -D "$base" --volatile=overlay --private-network --register=no --keep-unit \
	-M "$machine" --bind-ro="$T/deb:/mnt/deb" -b >"$T/console.log" 2>&1 </dev/null &
nspawn=$!
cleanup() {
	if kill -0 "$nspawn" 2>/dev/null; then
		kill "$nspawn" 2>/dev/null # nspawn asks the container's systemd to power off
		for _ in $(seq 1 100); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$nspawn" 2>/dev/null
	fi
	rm -rf "$T"
}
trap cleanup EXIT

leader=
for _ in $(seq 1 100); do
	leader=$(pgrep -P "$nspawn" -x systemd | head -1)
	[ -n "$leader" ] && break
	kill -0 "$nspawn" 2>/dev/null || break
	sleep 0.1
done
if [ -z "$leader" ]; then
	tail -5 "$T/console.log" | diag
	skip_all "systemd-nspawn -b did not start the container's systemd here: $(tail -1 "$T/console.log")"
fi
ct() { timeout 120 nsenter -t "$leader" -a -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
state=
for _ in $(seq 1 300); do
	state=$(ct systemctl is-system-running 2>/dev/null)
	case $state in running | degraded) break ;; esac
	sleep 0.1
done
case $state in running | degraded) ;; *)
	tail -5 "$T/console.log" | diag
	skip_all "the container's systemd did not finish booting (state '$state')"
	;;
esac
ct systemctl is-active --quiet postgresql@15-main || skip_all "PostgreSQL did not start in the container"
echo "# booted in $(($(date +%s) - started)) s (state $state)"

psql_su() { ct runuser -u postgres -- psql -X -q -At -v ON_ERROR_STOP=1 -d pgjobd "$@"; }
prop() { ct systemctl show -P "$1" pgjobd.service; }
# wait_for SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
	local end=$(($(date +%s) + $1))
	shift
	until "$@"; do
		[ "$(date +%s)" -lt "$end" ] || return 1
		sleep 0.2
	done
}
job_status() { psql_su -c "SELECT status FROM pgjobd.jobs WHERE id = $1"; }
job_is() { [ "$(job_status "$1")" = "$2" ]; }

# --- the package ------------------------------------------------------------------
ct test ! -e /usr/bin/kill && ct test ! -e /bin/kill
ok $? "the container has no procps (/bin/kill), as a minimal Debian"
ct sh -c 'mkdir -p /etc/systemd/system-preset && echo "enable pgjobd.service" >/etc/systemd/system-preset/50-site.preset'
ct dpkg -i /mnt/deb/pgjobd.deb >"$T/dpkg.log" 2>&1
ok $? "dpkg -i installs the package" || diag <"$T/dpkg.log"
[ "$(ct systemctl is-enabled pgjobd.service)" = enabled ]
ok $? "a fresh install follows the systemd preset (the site's 'enable pgjobd.service')"
ct test -f /etc/pgjobd/admin.ini && ct id pgjobd-run >/dev/null
ok $? "the package made /etc/pgjobd/admin.ini and the user pgjobd-run"
ct zcat /usr/share/man/man8/pgjobd.8.gz | grep -q '/usr/lib/systemd/system/pgjobd.service' &&
	! ct zcat /usr/share/man/man8/pgjobd.8.gz | grep -q '/usr/local/lib'
ok $? "the packaged man page names the /usr paths the package uses"
ct test -s /usr/share/doc/pgjobd/changelog.Debian.gz
ok $? "the package has a changelog"

# The database, as a new administrator makes it (peer authentication for pgjobd).
ct runuser -u postgres -- psql -X -q -c "CREATE ROLE pgjobd LOGIN" -c "CREATE DATABASE pgjobd OWNER pgjobd" \
	>/dev/null || skip_all "cannot create the database in the container"
ct sh -c 'cat >/etc/pgjobd/pgjobd.ini' <<'EOF'
[pgjobd]
database = dbname=pgjobd
shutdown_grace = 30s

[queue.t]
command = id -un >/var/lib/pgjobd-run/who; cat /proc/self/cgroup >/var/lib/pgjobd-run/cgroup; sleep "${PGJOBD_ARG_sleep:-0}"
user = pgjobd-run
EOF

# --- unmigrated database: no restart loop -------------------------------------------
ct systemctl start pgjobd.service >/dev/null 2>&1
sleep 8
restarts=$(prop NRestarts)
st=$(prop ExecMainStatus)
echo "# unmigrated: NRestarts=$restarts ExecMainStatus=$st ActiveState=$(prop ActiveState)"
[ "${restarts:-99}" = 0 ] && [ "$st" = 3 ] && [ "$(prop ActiveState)" != active ]
ok $? "an unmigrated database stops the unit with exit status 3, no restart loop"
ct systemctl stop pgjobd.service >/dev/null 2>&1
ct systemctl reset-failed pgjobd.service >/dev/null 2>&1

ct runuser -u pgjobd -- pgjobd migrate -c /etc/pgjobd/pgjobd.ini >"$T/migrate.log" 2>&1
ok $? "pgjobd migrate as the daemon's user" || diag <"$T/migrate.log"

# --- start --------------------------------------------------------------------------
t0=$(date +%s%N)
ct systemctl enable --now pgjobd.service >"$T/start.log" 2>&1
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ $rc -eq 0 ] && [ "$(prop ActiveState)/$(prop SubState)" = active/running ]
ok $? "systemctl enable --now: active (running), $ms ms" || { diag <"$T/start.log"; ct journalctl -u pgjobd --no-pager | tail -20 | diag; }
ct journalctl -u pgjobd --no-pager -o cat | grep -q 'msg="ready"'
ok $? "the daemon said ready (Type=notify: start returned after READY=1)"
wait_for 10 eval '[[ "$(prop StatusText)" == *running*queued* ]]'
ok $? "STATUS= is shown by systemctl: '$(prop StatusText)'"

# --- a job --------------------------------------------------------------------------
id=$(psql_su -c "INSERT INTO pgjobd.jobs (queue) VALUES ('t') RETURNING id")
wait_for 20 job_is "$id" succeeded
ok $? "a job enqueued by psql succeeds (job $id: $(job_status "$id"))"
[ "$(ct cat /var/lib/pgjobd-run/who)" = pgjobd-run ]
ok $? "its command ran as pgjobd-run"
cg=$(ct cat /var/lib/pgjobd-run/cgroup | sed -n 's/^0:://p')
echo "# the command's cgroup: $cg"
[[ $cg == /system.slice/pgjobd.service/job-* ]]
ok $? "in a cgroup of its own below the unit's"

# --- reload -------------------------------------------------------------------------
ct sh -c 'printf "\n[queue.t2]\ncommand = echo two\nuser = pgjobd-run\n" >>/etc/pgjobd/pgjobd.ini'
ct systemctl reload pgjobd.service >"$T/reload.log" 2>&1
ok $? "systemctl reload works without procps" || { diag <"$T/reload.log"; ct journalctl -u pgjobd --no-pager | tail -5 | diag; }
id2=$(psql_su -c "INSERT INTO pgjobd.jobs (queue) VALUES ('t2') RETURNING id")
wait_for 20 job_is "$id2" succeeded
ok $? "the reloaded file's new queue runs a job"
pid_before=$(prop MainPID)
ct sh -c 'printf "concurency = 2\n" >>/etc/pgjobd/pgjobd.ini'
ct systemctl reload pgjobd.service >"$T/reload.log" 2>&1
rc=$?
[ $rc -ne 0 ] && [ "$(prop ActiveState)" = active ] && [ "$(prop MainPID)" = "$pid_before" ]
ok $? "a bad file makes systemctl reload fail (exit $rc); the daemon runs on"
ct journalctl -u pgjobd --no-pager -o cat >"$T/journal.txt"
grep -q "concurency" "$T/journal.txt" && grep -q "has errors: the daemon was not asked to reload" "$T/journal.txt"
ok $? "the journal names the bad key, and that ExecReload (pgjobd reload) refused the file"
ct systemctl kill -s HUP --kill-whom=main pgjobd.service
wait_for 10 eval '[[ "$(prop StatusText)" == *"reload failed: /etc/pgjobd/pgjobd.ini:"*concurency* ]]'
ok $? "a SIGHUP the daemon refuses shows in STATUS=: '$(prop StatusText)'"
ct sed -i '/^concurency/d' /etc/pgjobd/pgjobd.ini
ct systemctl reload pgjobd.service >/dev/null 2>&1
wait_for 10 eval '[[ "$(prop StatusText)" != *"reload failed"* ]]'
ok $? "a good reload clears it: '$(prop StatusText)'"

# --- resources (pgjobd.ini(5), Resources) ------------------------------------------
# The unit's cgroup (Delegate=yes): with memory, pids and cpu it enforces memory_max
# (reason oom), tasks_max (tasks_max_hit) and cpu_max; without (a host whose controllers
# are on cgroup v1, as a hybrid one), a queue asking for them is refused at reload.
mainpid=$(prop MainPID)
ucg=$(ct sh -c "sed -n 's/^0:://p' /proc/$mainpid/cgroup")
ucg_dir=
for m in /sys/fs/cgroup /sys/fs/cgroup/unified; do
	ct test -e "$m$ucg/cgroup.controllers" && { ucg_dir=$m$ucg; break; }
done
have=$([ -n "$ucg_dir" ] && ct cat "$ucg_dir/cgroup.controllers")
missing=
for c in memory pids cpu; do
	case " $have " in *" $c "*) ;; *) missing="${missing:+$missing, }$c" ;; esac
done
echo "# the unit's cgroup: ${ucg_dir:-none found} (controllers: '$have')"
ct sh -c 'cat >>/etc/pgjobd/pgjobd.ini' <<'EOF'

[queue.res_mem]
command = dd if=/dev/zero of=/dev/null bs=256M count=1
memory_max = 32MiB
max_attempts = 1
user = pgjobd-run

[queue.res_tasks]
command = for i in $(seq 1 40); do sleep 3 & done; wait
tasks_max = 8
max_attempts = 1
user = pgjobd-run

[queue.res_cpu]
command = timeout 10 sh -c 'while :; do :; done'; exit 0
cpu_max = 20%
timeout = 60s
max_attempts = 1
user = pgjobd-run
EOF
ct systemctl reload pgjobd.service >/dev/null 2>&1
if [ -n "$missing" ]; then
	wait_for 10 eval '[[ "$(prop StatusText)" == *"reload failed: a resource limit cannot be enforced"* ]]'
	ok $? "no $missing controller in the unit's cgroup: a reload with memory_max, tasks_max, cpu_max is refused: '$(prop StatusText)'"
	ct journalctl -u pgjobd --no-pager -o cat | grep 'cannot enforce a resource limit' >"$T/res.txt"
	grep -q 'queue=res_mem key=memory_max' "$T/res.txt" && grep -q 'queue=res_tasks key=tasks_max' "$T/res.txt" &&
		grep -q 'queue=res_cpu key=cpu_max' "$T/res.txt"
	ok $? "the journal names each queue and key, and why" || diag <"$T/res.txt"
	n=$((n + 1))
	echo "ok $n # SKIP enforcement (oom, tasks_max_hit, cpu_max 20%): the container's cgroup v2 offers no $missing controller (cgroup.controllers: '$have'; the host binds them to cgroup v1)"
else
	wait_for 10 eval 'ct journalctl -u pgjobd --no-pager -o cat | grep -q "controllers enabled"'
	ok $? "the daemon enabled the controllers for the commands' cgroups"
	m=$(psql_su -c "INSERT INTO pgjobd.jobs (queue) VALUES ('res_mem') RETURNING id")
	tk=$(psql_su -c "INSERT INTO pgjobd.jobs (queue) VALUES ('res_tasks') RETURNING id")
	cp=$(psql_su -c "INSERT INTO pgjobd.jobs (queue) VALUES ('res_cpu') RETURNING id")
	ended() { [ "$(psql_su -c "SELECT count(*) FROM pgjobd.jobs WHERE id IN ($m, $tk, $cp) AND status IN ('succeeded', 'failed')")" = 3 ]; }
	wait_for 60 ended
	r=$(psql_su -c "SELECT (error->>'reason') || ' ' || coalesce(error->>'memory_peak_kb', '-') FROM pgjobd.jobs WHERE id = $m")
	[[ $r == "oom "[0-9]* ]]
	ok $? "memory_max 32MiB, 256 MiB asked: reason oom with memory_peak_kb ($r)"
	[ "$(psql_su -c "SELECT error->>'tasks_max_hit' FROM pgjobd.jobs WHERE id = $tk")" = true ]
	ok $? "tasks_max 8, 40 processes asked: tasks_max_hit"
	cpu_ms=$(psql_su -c "SELECT history->-1->>'cpu_ms' FROM pgjobd.jobs WHERE id = $cp")
	echo "# cpu_max 20%: ${cpu_ms:-?} ms of CPU over 10 s"
	[ "${cpu_ms:-0}" -ge 1600 ] && [ "${cpu_ms:-0}" -le 2400 ]
	ok $? "cpu_max 20%: 16 to 24 % of a CPU over 10 s (${cpu_ms:-?} ms)"
fi
ct sed -i '/^\[queue\.res_mem\]/,$d' /etc/pgjobd/pgjobd.ini # (keeps its owner and mode)
ct systemctl reload pgjobd.service >/dev/null 2>&1
wait_for 10 eval '[[ "$(prop StatusText)" != *"reload failed"* ]]'
ok $? "the file without those queues reloads again: '$(prop StatusText)'"

# --- watchdog -----------------------------------------------------------------------
ct sh -c 'mkdir -p /etc/systemd/system/pgjobd.service.d && printf "[Service]\nWatchdogSec=3s\n" >/etc/systemd/system/pgjobd.service.d/wd.conf'
ct systemctl daemon-reload
ct systemctl restart pgjobd.service
pid=$(prop MainPID)
r0=$(prop NRestarts)
ct sh -c "kill -STOP $pid"
wait_for 30 eval '[ "$(prop NRestarts)" -gt "$r0" ] && [ "$(prop ActiveState)" = active ] && [ "$(prop MainPID)" != "$pid" ] && [ "$(prop MainPID)" != 0 ]'
ok $? "the watchdog restarts a stopped daemon (pid $pid -> $(prop MainPID))"
ct journalctl -u pgjobd --no-pager | grep -q -i "watchdog timeout"
ok $? "systemd logged the watchdog timeout"

# --- stop drains --------------------------------------------------------------------
id3=$(psql_su -c "INSERT INTO pgjobd.jobs (queue, data) VALUES ('t', '{\"sleep\": 3}') RETURNING id")
wait_for 20 job_is "$id3" running
t0=$(date +%s%N)
ct systemctl stop pgjobd.service
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$(job_status "$id3")" = succeeded ] && [ $ms -ge 1500 ]
ok $? "systemctl stop waits for the running job, which succeeds ($ms ms, job $(job_status "$id3"))"

# --- upgrade ------------------------------------------------------------------------
ct systemctl start pgjobd.service
pid=$(prop MainPID)
mkdir -p "$T/up" && dpkg-deb -R "$DEB" "$T/up/root" &&
	sed -i 's/^Version: \(.*\)$/Version: \1+ci1/' "$T/up/root/DEBIAN/control" &&
	dpkg-deb --root-owner-group -Zxz --build "$T/up/root" "$T/deb/pgjobd-up.deb" >/dev/null
ct dpkg -i /mnt/deb/pgjobd-up.deb >"$T/dpkg.log" 2>&1
rc=$?
new=$(prop MainPID)
[ $rc -eq 0 ] && [ "$new" != "$pid" ] && [ "$new" != 0 ] && [ "$(prop ActiveState)" = active ]
ok $? "an upgrade restarts the daemon (pid $pid -> $new)" || diag <"$T/dpkg.log"

# --- purge --------------------------------------------------------------------------
ct rm -f /etc/systemd/system-preset/50-site.preset
ct dpkg --purge pgjobd >"$T/dpkg.log" 2>&1
ok $? "dpkg --purge" || diag <"$T/dpkg.log"
left=$(ct sh -c 'for f in /etc/pgjobd /var/lib/pgjobd /var/lib/pgjobd-run /usr/bin/pgjobd \
	/etc/systemd/system/multi-user.target.wants/pgjobd.service /usr/lib/systemd/system/pgjobd.service; do
	[ -e "$f" ] || [ -L "$f" ] && echo "$f"; done')
[ -z "$left" ] && [ "$(prop LoadState)" = not-found ]
ok $? "purge removes what the package made${left:+ (left: $(echo $left))}"

echo "1..$n"
echo "# $(($(date +%s) - started)) s in all"
[ $failed -eq 0 ]
