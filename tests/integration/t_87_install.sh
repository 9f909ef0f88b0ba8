#!/usr/bin/env bash
# Installing as a service: `make install DESTDIR=...` lays out the binary, both units
# (with ExecStart rewritten for PREFIX/SYSCONFDIR; the daemon as pgjobd with only the
# capabilities to run commands as another user), the sysusers.d and tmpfiles.d files for
# the users pgjobd and pgjobd-run and their homes, the man pages and the example
# configuration (never overwriting one), `make uninstall` removes all but the
# configuration; the man pages render without warnings (groff -ww, man -l) and cover
# every configuration key, command, signal and exit status; `make deb` builds a package
# with all of it (contents, fields, conffile, maintainer scripts) that dpkg installs into a
# scratch root with its users and directories; the units pass
# `systemd-analyze verify` and keep their hardening (`systemd-analyze security`) when
# the tool can run here. Needs no PostgreSQL.
. "$(dirname "$0")/lib.sh"
require_pgjobd
make_tmp

# Prints the key table the daemon parses with (tests/integration/config-keys.c).
KEYS_BIN=${CONFIG_KEYS:-$(dirname "$PGJOBD")/tests/config-keys}
[ -x "$KEYS_BIN" ] || bail_out "config-keys not found at $KEYS_BIN (make build/tests/config-keys, or set CONFIG_KEYS)"

# Install from the build tree the tests run (build/ or build-asan/), never rebuild into it.
B=$(dirname "$PGJOBD")
[ -e "$B/main.o" ] || bail_out "$PGJOBD is not a build tree of $REPO_ROOT (no $B/main.o)"
unset MAKEFLAGS MFLAGS MAKELEVEL
mk() { make -s -C "$REPO_ROOT" B="$B" "$@"; }

# 1. DESTDIR with the default PREFIX (/usr/local).
dest=$T/dest
mk install DESTDIR="$dest" >"$T/install.log" 2>&1
ok $? "make install DESTDIR=..." || diag "$(cat "$T/install.log")"
(cd "$dest" && find . -type f -printf '%m %p\n' | sort -k2) >"$T/files.txt"
is "$(cat "$T/files.txt")" "640 ./etc/pgjobd/pgjobd.ini
755 ./usr/local/bin/pgjobd
644 ./usr/local/lib/systemd/system/pgjobd.service
644 ./usr/local/lib/systemd/system/pgjobd@.service
644 ./usr/local/lib/sysusers.d/pgjobd.conf
644 ./usr/local/lib/tmpfiles.d/pgjobd.conf
644 ./usr/local/share/man/man5/pgjobd.ini.5
644 ./usr/local/share/man/man8/pgjobd.8" "the expected files, with their modes"
cmp -s "$dest/usr/local/bin/pgjobd" "$PGJOBD"
ok $? "the binary is the one built"
cmp -s "$dest/etc/pgjobd/pgjobd.ini" "$REPO_ROOT/conf/pgjobd.ini"
ok $? "the configuration is the example"
# The example runs every queue's commands as pgjobd-run, which the install steps create;
# where it does not exist, nobody stands in for it.
example=$dest/etc/pgjobd/pgjobd.ini
is "$(grep -c '^\[queue\.' "$example")" "$(grep -c '^user = pgjobd-run$' "$example")" \
	"every queue of the example runs its commands as pgjobd-run"
if ! getent passwd pgjobd-run >/dev/null; then
	sed 's/^user = pgjobd-run$/user = nobody/' "$example" >"$T/example.ini"
	example=$T/example.ini
fi
timeout 20 "$dest/usr/local/bin/pgjobd" check -c "$example" >/dev/null 2>"$T/check.err"
isnt $? 2 "the installed example configuration is valid (check fails only to connect)" ||
	diag "$(cat "$T/check.err")"
like "$(grep '^ExecStart=' "$dest/usr/local/lib/systemd/system/pgjobd.service")" \
	'^ExecStart=/usr/local/bin/pgjobd -c /etc/pgjobd/pgjobd.ini$' "pgjobd.service: ExecStart"
like "$(grep '^ExecStart=' "$dest/usr/local/lib/systemd/system/pgjobd@.service")" \
	'^ExecStart=/usr/local/bin/pgjobd -c /etc/pgjobd/%i.ini$' "pgjobd@.service: ExecStart per instance"
# Commands run as another user: the daemon is pgjobd with exactly the capabilities that
# takes, and its home (~/.pgpass) is closed to them.
for u in pgjobd.service pgjobd@.service; do
	is "$(grep -E '^(User|AmbientCapabilities|CapabilityBoundingSet|StateDirectoryMode)=' \
		"$dest/usr/local/lib/systemd/system/$u" | tr '\n' ';')" \
		"User=pgjobd;AmbientCapabilities=CAP_SETUID CAP_SETGID CAP_KILL;StateDirectoryMode=0700;CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL;" \
		"$u: user pgjobd, only CAP_SETUID CAP_SETGID CAP_KILL, home 0700"
done
# The users and directories, created in a scratch root where the tools can run.
root=$T/sysroot
mkdir -p "$root/etc"
if command -v systemd-sysusers >/dev/null 2>&1 && command -v systemd-tmpfiles >/dev/null 2>&1 &&
	systemd-sysusers --root="$root" "$dest/usr/local/lib/sysusers.d/pgjobd.conf" >"$T/sysusers.log" 2>&1 &&
	systemd-tmpfiles --root="$root" --create "$dest/usr/local/lib/tmpfiles.d/pgjobd.conf" >"$T/tmpfiles.log" 2>&1; then
	is "$(cut -d: -f1,6,7 "$root/etc/passwd" | sort | tr '\n' ' ')" \
		"pgjobd-run:/var/lib/pgjobd-run:/usr/sbin/nologin pgjobd:/var/lib/pgjobd:/usr/sbin/nologin " \
		"sysusers.d: the users pgjobd and pgjobd-run"
	uid() { awk -F: -v u="$1" '$1 == u { print $3 }' "$root/etc/passwd"; }
	is "$(stat -c '%a %u' "$root/var/lib/pgjobd" "$root/var/lib/pgjobd-run" | tr '\n' ' ')" \
		"700 $(uid pgjobd) 750 $(uid pgjobd-run) " "tmpfiles.d: the daemon's home 0700, the commands' 0750"
else
	note "systemd-sysusers/systemd-tmpfiles cannot run here: $(cat "$T/sysusers.log" "$T/tmpfiles.log" 2>/dev/null | head -n3)"
	skip "systemd-sysusers or systemd-tmpfiles cannot run here" 2
fi

echo "; edited by the admin" >>"$dest/etc/pgjobd/pgjobd.ini"
mk install DESTDIR="$dest" >"$T/install2.log" 2>&1
ok $? "make install again"
tail -n1 "$dest/etc/pgjobd/pgjobd.ini" | grep -q 'edited by the admin'
ok $? "an existing configuration is not overwritten"
grep -q 'keeping the existing' "$T/install2.log"
ok $? "... and make says so"

mk uninstall DESTDIR="$dest" >"$T/uninstall.log" 2>&1
ok $? "make uninstall DESTDIR=..."
is "$(cd "$dest" && find . -type f | sort)" "./etc/pgjobd/pgjobd.ini" "uninstall leaves only the configuration"

# 2. PREFIX=/usr and the GNU spelling sysconfdir=.
dest2=$T/dest2
mk install DESTDIR="$dest2" PREFIX=/usr sysconfdir=/etc/alt >"$T/install3.log" 2>&1
ok $? "make install PREFIX=/usr sysconfdir=/etc/alt"
like "$(grep '^ExecStart=' "$dest2/usr/lib/systemd/system/pgjobd.service" 2>&1)" \
	'^ExecStart=/usr/bin/pgjobd -c /etc/alt/pgjobd/pgjobd.ini$' "ExecStart follows PREFIX and sysconfdir"
ok "$([ -x "$dest2/usr/bin/pgjobd" ] && [ -f "$dest2/usr/share/man/man8/pgjobd.8" ] &&
	[ -f "$dest2/usr/share/man/man5/pgjobd.ini.5" ] && [ -f "$dest2/etc/alt/pgjobd/pgjobd.ini" ]; echo $?)" \
	"binary, man pages and configuration under /usr and /etc/alt"

# 3. Man pages: no warnings from groff -ww nor man -l; the content is complete.
for page in pgjobd.8 pgjobd.ini.5; do
	f=$REPO_ROOT/man/$page
	out=$(groff -man -ww -z "$f" 2>&1)
	st=$?
	ok "$([ $st = 0 ] && [ -z "$out" ]; echo $?)" "groff -man -ww: $page without warnings" || diag "$out"
	out=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings=w -l "$f" 2>&1 >"$T/$page.txt")
	st=$?
	ok "$([ $st = 0 ] && [ -z "$out" ] && [ -s "$T/$page.txt" ]; echo $?)" "man -l: $page renders without warnings" ||
		diag "$out"
done
m8=$T/pgjobd.8.txt
m5=$T/pgjobd.ini.5.txt
keys=$("$KEYS_BIN")
nkeys=$(echo "$keys" | wc -w)
cmp_ok "$nkeys" -ge 19 "the key table was read ($nkeys keys)"
missing=
missing_conf=
for k in $keys; do
	grep -Eq "^ {7}$k = " "$m5" || missing="$missing $k"
	grep -Eq "^;? ?$k = " "$REPO_ROOT/conf/pgjobd.ini" || missing_conf="$missing_conf $k"
done
is "$missing" "" "pgjobd.ini(5) documents every key of the key table"
is "$missing_conf" "" "conf/pgjobd.ini shows every key (set or commented out)"
missing=
for w in check migrate enqueue status -c --config --group --data --priority --run-at --help \
	--version SIGTERM SIGINT SIGHUP READY=1 RELOADING=1 STOPPING=1 WATCHDOG=1 STATUS= \
	pgjobd.jobs pgjobd.queue_stats pgjobd.cancel pgjobd.pause pgjobd.resume dedupe_key \
	expires_at group_id run_at priority max_attempts timeout PGJOBD_JOB_ID PGJOBD_QUEUE \
	PGJOBD_GROUP_ID PGJOBD_ATTEMPT PGJOBD_MAX_ATTEMPTS PGJOBD_ARG_ JOURNAL_STREAM \
	pgjobd_jobs_started_total pgjobd_jobs_succeeded_total pgjobd_jobs_failed_total \
	pgjobd_jobs_retried_total pgjobd_jobs_interrupted_total pgjobd_jobs_running \
	pgjobd_claim_seconds pgjobd_job_duration_seconds pgjobd_db_reconnects_total \
	pgjobd_db_round_trips_total queued running succeeded failed cancelled lost_lock spawn; do
	grep -qF -- "$w" "$m8" || missing="$missing $w"
done
is "$missing" "" "pgjobd(8) covers commands, options, signals, notify, SQL, environment, metrics"
sed -n '/^EXIT STATUS/,/^[A-Z]/p' "$m8" >"$T/exit.txt"
ok "$(grep -Eq '^ {7}0 ' "$T/exit.txt" && grep -Eq '^ {7}1 ' "$T/exit.txt" &&
	grep -Eq '^ {7}2 ' "$T/exit.txt"; echo $?)" "pgjobd(8) lists exit statuses 0, 1 and 2"
# Every metric the daemon writes is documented: a daemon writes its metrics file from
# the start, while it waits for a database that is not there.
write_conf "$T/metrics.ini" <<EOF
[pgjobd]
database = host=$T/nosock dbname=none user=none connect_timeout=1
metrics_file = $T/metrics.prom

[queue.q]
command = true
EOF
start_daemon metrics "$T/metrics.ini"
wait_until 20 "grep -q '^# TYPE ' '$T/metrics.prom' 2>/dev/null"
ok $? "a daemon that cannot reach its database writes its metrics file"
stop_daemon "$DAEMON_PID" >/dev/null
names=$(awk '$1 == "#" && $2 == "TYPE" { print $3 }' "$T/metrics.prom" 2>/dev/null | sort -u)
cmp_ok "$(echo "$names" | wc -w)" -ge 10 "the metrics file names its metrics ($(echo "$names" | wc -w))"
undocumented=
for name in $names; do
	grep -qF "$name" "$m8" || undocumented="$undocumented $name"
done
is "$undocumented" "" "every metric the daemon writes is in pgjobd(8)"

# 4. make deb: a Debian package with dpkg-deb; installed into a scratch root where dpkg can.
if ! command -v dpkg-deb >/dev/null 2>&1; then
	skip "dpkg-deb not installed: no make deb" 7
else
	mk deb >"$T/deb.log" 2>&1
	ok $? "make deb" || diag "$(tail -n 20 "$T/deb.log")"
	deb=$(ls "$B"/deb/pgjobd_*.deb 2>/dev/null | head -n1)
	dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { print $1, $2, $6 }' | sort -k3 >"$T/deb-files.txt"
	is "$(cat "$T/deb-files.txt")" "-rw-r----- root/root ./etc/pgjobd/pgjobd.ini
-rwxr-xr-x root/root ./usr/bin/pgjobd
-rw-r--r-- root/root ./usr/lib/systemd/system-preset/90-pgjobd.preset
-rw-r--r-- root/root ./usr/lib/systemd/system/pgjobd.service
-rw-r--r-- root/root ./usr/lib/systemd/system/pgjobd@.service
-rw-r--r-- root/root ./usr/lib/sysusers.d/pgjobd.conf
-rw-r--r-- root/root ./usr/lib/tmpfiles.d/pgjobd.conf
-rw-r--r-- root/root ./usr/share/doc/pgjobd/changelog.Debian.gz
-rw-r--r-- root/root ./usr/share/doc/pgjobd/copyright
-rw-r--r-- root/root ./usr/share/man/man5/pgjobd.ini.5.gz
-rw-r--r-- root/root ./usr/share/man/man8/pgjobd.8.gz" \
		"dpkg-deb -c: the binary, units, preset, sysusers/tmpfiles, man pages, changelog, example configuration"
	is "$(dpkg-deb -f "$deb" Package Architecture Section | tr '\n' ' ')" \
		"Package: pgjobd Architecture: $(dpkg --print-architecture) Section: admin " "dpkg-deb -I: the fields"
	deps=$(dpkg-deb -f "$deb" Depends)
	ok "$([[ $deps == *libpq5* && $deps == *libev4* && $deps == *libyaml-0-2* && $deps == *libinih* ]]; echo $?)" \
		"Depends names libpq5, libev4, libyaml-0-2 and inih's library: $deps"
	is "$(dpkg-deb -I "$deb" conffiles)" "/etc/pgjobd/pgjobd.ini" "the configuration is a conffile"
	like "$(dpkg-deb -I "$deb" control) $(dpkg-deb -I "$deb" postinst)" 'systemd-sysusers.*systemd-tmpfiles.*daemon-reload' \
		"postinst: systemd-sysusers, systemd-tmpfiles, daemon-reload"
	if command -v lintian >/dev/null 2>&1; then
		lintian --no-tag-display-limit "$deb" >"$T/lintian.txt" 2>&1
		note "lintian: $(grep -c '^E:' "$T/lintian.txt") errors, $(grep -c '^W:' "$T/lintian.txt") warnings"
	fi
	# dpkg --root runs the maintainer scripts on this machine (--force-script-chrootless),
	# with DPKG_ROOT set: postinst creates the users and directories inside the root.
	sr=$T/debroot
	mkdir -p "$sr/var/lib/dpkg/info" "$sr/var/lib/dpkg/updates" "$sr/etc"
	: >"$sr/var/lib/dpkg/status"
	if command -v systemd-sysusers >/dev/null 2>&1 &&
		dpkg --root="$sr" --force-script-chrootless --force-depends --log=/dev/null -i "$deb" \
			>"$T/dpkg.log" 2>&1; then
		ok "$([ -x "$sr/usr/bin/pgjobd" ] && grep -q '^pgjobd:' "$sr/etc/passwd" &&
			grep -q '^pgjobd-run:' "$sr/etc/passwd" && [ -d "$sr/var/lib/pgjobd" ]; echo $?)" \
			"dpkg -i --root: installed, users and directories created by postinst"
		dpkg --root="$sr" --force-script-chrootless --force-depends --log=/dev/null -r pgjobd \
			>>"$T/dpkg.log" 2>&1
		ok "$([ ! -e "$sr/usr/bin/pgjobd" ] && [ -e "$sr/etc/pgjobd/pgjobd.ini" ]; echo $?)" \
			"dpkg -r --root: removed, the configuration kept" || diag "$(cat "$T/dpkg.log")"
	else
		note "dpkg --root cannot install here: $(tail -n3 "$T/dpkg.log" 2>/dev/null)"
		skip "dpkg --root --force-script-chrootless cannot run here" 2
	fi
fi

# 5. systemd-analyze, where it can run.
if ! command -v systemd-analyze >/dev/null 2>&1; then
	skip "systemd-analyze not installed" 3
	done_testing
	exit 0
fi
# verify needs ExecStart to exist: install with a PREFIX that is real on this machine.
pre=$T/prefix
mk install PREFIX="$pre" sysconfdir="$pre/etc" >"$T/install4.log" 2>&1 || bail_out "install PREFIX=$pre failed"
mkdir -p "$T/probe"
printf '[Unit]\nDescription=probe\n[Service]\nExecStart=/bin/true\n' >"$T/probe/probe.service"
if ! systemd-analyze verify --man=no "$T/probe/probe.service" >"$T/probe.log" 2>&1; then
	note "systemd-analyze verify cannot run here: $(head -n3 "$T/probe.log")"
	skip "systemd-analyze verify cannot run in this environment" 2
else
	for u in pgjobd.service pgjobd@.service; do
		out=$(cd "$pre/lib/systemd/system" &&
			MANPATH=$pre/share/man systemd-analyze verify "./$u" 2>&1)
		st=$?
		ok "$([ $st = 0 ] && [ -z "$out" ]; echo $?)" "systemd-analyze verify $u: no complaint" ||
			diag "$out"
	done
fi
if systemd-analyze security --offline=true "$REPO_ROOT/systemd/pgjobd.service" >"$T/security.txt" 2>&1; then
	score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$T/security.txt")
	note "systemd-analyze security --offline=true systemd/pgjobd.service: exposure $score"
	# 2.1, not lower: the unit deliberately keeps CAP_SETUID, CAP_SETGID and CAP_KILL
	# (commands run as another user than the daemon and its credentials) and a
	# delegated cgroup (each command in a cgroup of its own); both cost exposure
	# points and buy isolation that the score does not count.
	ok "$(awk -v s="${score:-99}" 'BEGIN { print (s <= 2.1) ? 0 : 1 }')" \
		"hardening kept: exposure level $score <= 2.1"
else
	skip "systemd-analyze security --offline is not supported here"
fi

done_testing
