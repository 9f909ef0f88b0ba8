#!/usr/bin/env bash
# tests/stress.sh - one integration test file run as COPIES copies at once, for ROUNDS
# rounds, each round through tests/integration/run.sh (one server, each copy its own
# database, or its own server when the file needs one). CI's check-asan runs eight files
# at once on two cores; a fault file that is reliable alone can fail there once in a
# few dozen runs. Eight copies of that file concentrate the load on its own windows and
# find such a failure in minutes. `make stress` calls it with the sanitizer build.
#
#     bash tests/stress.sh [-n COPIES] [-r ROUNDS] FILE
#
# COPIES defaults to 8, ROUNDS to 5. It stops at the first round with a failure, keeps
# that round's output and says where; with PGJOBD_KEEP_TMP=1 each copy's directory
# (daemon logs, the server's data) is kept too. PGJOBD (and NOTIFY_SINK, CHAOS_PROXY,
# ...) as for a single file. Exit status: 0 when every round passed, 1 on a failure, 2 on
# a usage error.
set -u
copies=8 rounds=5
while [ $# -gt 0 ]; do
	case $1 in
	-n) copies=${2:-} && shift 2 ;;
	-r) rounds=${2:-} && shift 2 ;;
	-*) echo "stress.sh: unknown option $1" >&2 && exit 2 ;;
	*) break ;;
	esac
done
for v in "$copies" "$rounds"; do
	case $v in '' | *[!0-9]* | 0) echo "stress.sh: -n and -r take a number above 0" >&2 && exit 2 ;; esac
done
[ $# = 1 ] && [ -f "$1" ] || { echo "usage: bash tests/stress.sh [-n COPIES] [-r ROUNDS] FILE" >&2 && exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
file=$1
base=$(basename "$file" .sh)
dir=$(mktemp -d "${TMPDIR:-/tmp}/pgjobd-stress.XXXXXX") || exit 2
# The copies find lib.sh (which finds the repository through its own real path) here.
ln -s "$root/tests/integration/lib.sh" "$dir/lib.sh"
for i in $(seq 1 "$copies"); do
	cp "$file" "$dir/${base}_$i.sh"
done
start=$(date +%s)
for r in $(seq 1 "$rounds"); do
	log=$dir/round-$r.log
	# The copies' times stay out of the suite's prove state (the order of later runs);
	# room on the shared server for the heaviest file's sessions (about 105) in each copy.
	PGJOBD_PROVE_STATE=$dir/prove.state PGJOBD_TEST_MAX_CONNECTIONS=$((copies * 150 + 100)) \
		bash "$root/tests/integration/run.sh" -j "$copies" "$dir/${base}"_*.sh >"$log" 2>&1
	status=$?
	if [ "$status" != 0 ]; then
		echo "round $r of $rounds: FAILED (exit $status); its output: $log"
		grep -E '^#   Failed test|^Dubious|^not ok' "$log" | sed 's/^/  /'
		grep -E '^(# )?kept ' "$log" | sed 's/^/  /'
		exit 1
	fi
	echo "round $r of $rounds: $copies copies of $base passed ($(($(date +%s) - start)) s so far)"
done
rm -rf "$dir"
echo "$base: $((copies * rounds)) runs, all passed"
