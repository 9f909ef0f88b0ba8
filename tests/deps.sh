#!/usr/bin/env bash
# tests/deps.sh - install the Debian packages pgjobd needs to build, run and test, only
# when one is missing (apt-get update + install --no-install-recommends; sudo when not root).
# Extra package names given as arguments are added to the list (tests/bench/run.sh
# asks for strace this way).
set -euo pipefail

packages=(
	build-essential pkg-config libpq-dev libev-dev libinih-dev libyaml-dev
	postgresql postgresql-client
	tzdata    # schedules in time zones (tests/unit/test_cron.c)
	perl      # prove
	procps    # pgrep/pkill
	psmisc
	util-linux # flock, runuser
	clang-format # make format-check
	groff-base man-db # t_87_install: groff -ww and man -l on man/
	systemd   # t_87_install: systemd-analyze verify and security on the units
	pgbouncer # t_29_pooler: PgBouncer in transaction and session mode
	debootstrap systemd-container # make check-systemd: a Debian root booted with systemd-nspawn
	"$@"      # extra packages a caller needs (tests/bench/run.sh: strace)
)

missing=()
for p in "${packages[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

sudo=
if [ "$(id -u)" != 0 ]; then
	sudo=sudo
fi
echo "deps.sh: installing ${missing[*]}" >&2
$sudo apt-get update
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
