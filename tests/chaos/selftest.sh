#!/usr/bin/env bash
# tests/chaos/selftest.sh - check.awk against small hand-written records: a clean run passes,
# and every kind of violation is found where one was planted (so the chaos run's checks can
# fail). Needs no PostgreSQL; TAP on stdout; `make chaos` runs it first.
set -u
CHECK=$(cd "$(dirname "$0")" && pwd)/check.awk
D=$(mktemp -d "${TMPDIR:-/tmp}/pgjobd-chaos-selftest.XXXXXX") || exit 1
trap 'rm -rf "$D"' EXIT
n=0
failed=0

# A clean history: group g1 runs jobs 1, 2 (2 needs 2 attempts) then 4 (from a transaction
# committed before the one of 3, so 4 goes first), job 3 last; job 5 is ungrouped and runs
# beside them; one fault. Each case below starts from it and changes one thing.
base() {
	cat >"$D/faults.txt" <<'EOF'
F kill9 a:1 99.5 99.5
EOF
	cat >"$D/enqueue.txt" <<'EOF'
C 1 1 cg g1
C 1 2 cg g1
C 1 5 cu -
C 2 4 cg g1
C 3 3 cg g1
EOF
	cat >"$D/jobs.txt" <<'EOF'
J 1 cg g1 succeeded 1
J 2 cg g1 succeeded 2
J 3 cg g1 succeeded 2
J 4 cg g1 succeeded 1
J 5 cu - succeeded 2
EOF
	: >"$D/daemons.txt"
	echo "D stop a 0 200.0" >"$D/daemons.txt"
	: >"$D/procs.txt"
	cat >"$D/events.txt" <<'EOF'
START cg 1 g1 1 - 100.000000 11
END cg 1 g1 1 - 100.500000 11 ok
START cu 5 - 1 - 100.100000 51
START cg 2 g1 1 - 100.600000 21
END cg 2 g1 1 - 101.000000 21 fail
START cg 2 g1 2 - 101.300000 22
END cg 2 g1 2 - 101.900000 22 ok
START cu 5 - 2 - 102.000000 52
END cu 5 - 2 - 102.500000 52 ok
START cg 4 g1 1 - 102.000000 41
END cg 4 g1 1 - 102.400000 41 ok
START cg 3 g1 1 - 102.600000 31
END cg 3 g1 1 - 103.000000 31 ok
EOF
}

# run_check [VAR=VALUE...]: check.awk over $D's files; output in $D/out, status in $rc.
run_check() {
	LC_ALL=C sort -s -k7,7n -k1,1 "$D/events.txt" >"$D/events.sorted"
	awk -v kinds="kill9 stop" -v expect_kinds="kill9 stop" -v window=6 "$@" -f "$CHECK" \
		"$D/faults.txt" "$D/enqueue.txt" "$D/jobs.txt" "$D/daemons.txt" "$D/procs.txt" \
		pass=1 "$D/events.sorted" pass=2 "$D/events.sorted" >"$D/out" 2>&1
	rc=$?
}

ok() {
	n=$((n + 1))
	if [ "$1" = 0 ]; then
		echo "ok $n - $2"
	else
		echo "not ok $n - $2"
		failed=$((failed + 1))
		sed 's/^/# /' "$D/out"
	fi
}

# expect NAME KIND COUNT: the run fails and reports exactly COUNT violations, all of KIND.
expect() {
	local name=$1 kind=$2 count=$3
	run_check
	[ "$rc" = 1 ] &&
		grep -Eq "^$kind +$count\$" "$D/out" &&
		grep -q "^faults=[0-9]* violations=$count\$" "$D/out"
	ok $? "$name: $count $kind"
}

base
run_check
[ "$rc" = 0 ] && grep -q '^faults=1 violations=0$' "$D/out"
ok $? "a clean history passes"
grep -q 'attempts without a START: 1 in 1 job(s)' "$D/out"
ok $? "an attempt without START (job 3: one START, two attempts) is counted, not failed"

base
echo "CLASH cg 3 g1 1 - 102.700000 32" >>"$D/events.txt"
expect "a CLASH line" clash 1

base
sed -i 's/^START cg 3 g1 1 - 102.600000 31$/START cg 3 g1 1 - 102.300000 31/' "$D/events.txt"
expect "a START before the previous run of the group ended" overlap 1

base
# The stale run of job 2 (no END: killed) is seen only by flock; with an END it overlaps.
sed -i 's/^START cg 2 g1 2 - 101.300000 22$/START cg 2 g1 2 - 100.800000 22/' "$D/events.txt"
expect "a retry of a job while its previous run still runs" overlap 1

base
sed -i 's/^START cu 5 - 2 - 102.000000 52$/START cu 5 - 2 - 100.200000 52/' "$D/events.txt"
echo "END cu 5 - 1 - 100.900000 51 fail" >>"$D/events.txt"
expect "two runs of one ungrouped job at once" overlap 1

base
# Job 3 (committed last) runs before job 4.
sed -i -e 's/ 102.000000 41$/ 102.600000 41/' -e 's/ 102.400000 41 ok$/ 103.000000 41 ok/' \
	-e 's/ 102.600000 31$/ 102.000000 31/' -e 's/ 103.000000 31 ok$/ 102.400000 31 ok/' \
	"$D/events.txt"
expect "a lower id committed later starts first" commit-order 1

base
# Job 4 (its own, later transaction) runs before jobs 1 and 2: both are overtaken.
sed -i -e 's/ 102.000000 41$/ 99.000000 41/' -e 's/ 102.400000 41 ok$/ 99.500000 41 ok/' \
	"$D/events.txt"
expect "a higher id committed later starts first" order 2

base
# Within one transaction, id order: job 2 before job 1.
sed -i -e 's/^START cg 1 g1 1 - 100.000000 11$/START cg 1 g1 1 - 101.950000 11/' \
	-e 's/^END cg 1 g1 1 - 100.500000 11 ok$/END cg 1 g1 1 - 101.980000 11 ok/' "$D/events.txt"
expect "a higher id of the same transaction starts first" order 1

base
# Job 4 (committed before job 3) fails its first attempt; job 3 starts while job 4 waits for
# its retry.
sed -i -e 's/^J 4 cg g1 succeeded 1$/J 4 cg g1 succeeded 2/' "$D/jobs.txt"
sed -i -e 's/ 102.400000 41 ok$/ 102.400000 41 fail/' "$D/events.txt"
printf '%s\n' "START cg 4 g1 2 - 103.500000 42" "END cg 4 g1 2 - 103.800000 42 ok" >>"$D/events.txt"
expect "a job committed later, with a lower id, starts while the one before waits for a retry" commit-order 1

base
# Job 2's retry comes after job 4 (later in the group) started.
sed -i -e 's/^START cg 2 g1 2 - 101.300000 22$/START cg 2 g1 2 - 102.450000 22/' \
	-e 's/^END cg 2 g1 2 - 101.900000 22 ok$/END cg 2 g1 2 - 102.550000 22 ok/' "$D/events.txt"
expect "a retry after a later job of the group started" holdback 1

base
sed -i -e 's/^\(START cg [0-9]* g1 [0-9]\) - \(.*\)$/\1 F \2/' "$D/events.txt"
sed -i -e 's/ F 100.000000 / 5 100.000000 /' -e 's/ F 100.600000 / 6 100.600000 /' \
	-e 's/ F 101.300000 / 7 101.300000 /' -e 's/ F 102.000000 / 7 102.000000 /' \
	-e 's/ F 102.600000 / 9 102.600000 /' "$D/events.txt"
expect "a fencing token that does not increase" fence 1

base
sed -i 's/^J 3 cg g1 succeeded 2$/J 3 cg g1 running 2/' "$D/jobs.txt"
expect "a job still running at the end" unfinished 1

base
sed -i '/^J 5 /d' "$D/jobs.txt"
sed -i '/ cu 5 /d' "$D/events.txt"
expect "a committed job missing from the table" lost 1

base
echo "J 6 cu - failed 0" >>"$D/jobs.txt"
expect "a job nobody enqueued" unknown 1

base
sed -i 's/^END cg 3 g1 1 - 103.000000 31 ok$/END cg 3 g1 1 - 103.000000 31 fail/' "$D/events.txt"
expect "succeeded without an END ok" noend 1

base
sed -i 's/^J 2 cg g1 succeeded 2$/J 2 cg g1 succeeded 1/' "$D/jobs.txt"
expect "fewer attempts than STARTs" attempts 1

base
echo "P 4242 sleep_1.2" >>"$D/procs.txt"
expect "a process left behind" leftover 1

base
echo "D exit b 139 101.0" >>"$D/daemons.txt"
expect "a daemon that exited on its own" exit 1

base
echo "D stop b 1 200.0" >>"$D/daemons.txt"
expect "a daemon whose SIGTERM status is not 0" stop 1

base
: >"$D/events.txt"
: >"$D/jobs.txt"
: >"$D/enqueue.txt"
expect "nothing ran" trivial 1

base
: >"$D/faults.txt"
expect "no fault injected when faults were asked for" trivial 1

base
echo "CLASH cg 3 g1 1 - 102.700000 32" >>"$D/events.txt"
run_check -v window=1
grep -Eq '^kill9 +1( +0)+$' "$D/out" && grep -Eq '^\(none\) +1( +0)+$' "$D/out"
ok $? "a violation long after a fault is not counted against it"
grep -q '^not injected this time: stop$' "$D/out"
ok $? "a fault kind asked for but not injected is named"
echo "F stop b:2 100.0 102.0 2000ms" >>"$D/faults.txt"
run_check -v window=1
grep -Eq '^stop +1 +1( +0)+$' "$D/out" && grep -q 'near: stop(b:2)@-2.7s' "$D/out"
ok $? "a violation within the window after a fault is counted against it"

base
# Job 3 runs on daemon a (pid 500), which is stopped meanwhile; a command of daemon b (pid 600)
# finds the lock taken. The fault on b does not count: b did not hold the lock.
printf '%s\n' "D start a 500 99.0" "D start b 600 99.0" >>"$D/daemons.txt"
sed -i 's/^START cg 3 g1 1 - 102.600000 31$/START cg 3 g1 1 - 102.600000 31 500/' "$D/events.txt"
echo "CLASH cg 3 g1 2 - 102.700000 32 600" >>"$D/events.txt"
# A kill of an earlier process of daemon a does not count either.
printf '%s\n' "F stop a:500 102.650000 102.900000 250ms" "F kill9 b:600 102.680000 102.680000" \
	"F kill9 a:400 102.610000 102.610000" >>"$D/faults.txt"
run_check
grep -Eq '^ +1  stop$' "$D/out" && grep -q 'holder: job 3 attempt 1 since 0.1 s, stop (daemon a)$' "$D/out"
ok $? "a clash is laid at the door of what the lock holder's daemon went through"

echo "1..$n"
exit $((failed > 0))
