#!/usr/bin/env bash
# tests/vm/guest.sh - runs inside the VM tests/vm/run.sh boots (a systemd service at boot,
# its output on the second serial port, the host's file). Not meant for a host.
#
# The payload disk (/dev/vdb, mounted read-only at /mnt/payload) holds tests/ and the
# binaries built on the host. This copies them to /var/tmp/pgjobd, gives the root cgroup's
# children the cpu, memory and pids controllers, and runs t_69_resources.sh with prove.
# The lines the host reads: "# vm: ..." facts, prove's own output, "VM-END <status>".
set -u
echo "# vm: kernel $(uname -r), $(nproc) CPUs, $(awk '/^MemTotal/ { print int($2 / 1024) }' /proc/meminfo) MiB"
echo "# vm: /sys/fs/cgroup is $(stat -fc %T /sys/fs/cgroup); root controllers: $(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
echo "# vm: cmdline: $(cat /proc/cmdline)"
echo "# vm: v1 hierarchies: $(awk '$3 == "cgroup" { n++ } END { print n + 0 }' /proc/mounts)"
# systemd enables only what its units need; t_69 makes its cgroup under the root.
echo '+cpu +memory +pids' >/sys/fs/cgroup/cgroup.subtree_control ||
	echo "# vm: could not enable cpu, memory, pids in the root cgroup"
echo "# vm: root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
# A control without pgjobd: the kernel's own cpu.max 20% on a 10 s busy loop, and how busy
# the guest is (PSI) before the tests; under TCG the emulation itself raises both.
echo "# vm: cpu some avg10 before the tests: $(awk '/^some/ { print $2 }' /proc/pressure/cpu)"
ctl=/sys/fs/cgroup/vm-control
if mkdir "$ctl" 2>/dev/null; then
	echo '20000 100000' >"$ctl/cpu.max"
	sh -c "echo \$\$ >$ctl/cgroup.procs && exec timeout 10 sh -c 'while :; do :; done'"
	u=$(awk '/^usage_usec/ { print int($2 / 1000) }' "$ctl/cpu.stat")
	echo "# vm: control: cpu.max 20000 100000 (no pgjobd), 10 s busy loop: $u ms of CPU;" \
		"$(grep -E '^nr_(periods|throttled)' "$ctl/cpu.stat" | tr '\n' ' ')"
	rmdir "$ctl"
fi
rm -rf /var/tmp/pgjobd && cp -a /mnt/payload /var/tmp/pgjobd || {
	echo "VM-END copy-failed"
	exit 0
}
cd /var/tmp/pgjobd || exit 0
B=$PWD/build
export PGJOBD=$B/pgjobd NOTIFY_SINK=$B/tests/notify-sink CHAOS_PROXY=$B/tests/chaos-proxy \
	CONFIG_KEYS=$B/tests/config-keys CLAIM_SQL=$B/tests/claim-sql PGJOBD_NEXT=$B/tests/pgjobd-next
tests=${VM_TESTS:-$(cat /mnt/payload/vm-tests 2>/dev/null)}
st=0
for t in ${tests:-tests/integration/t_69_resources.sh}; do
	echo "# vm: $t"
	rm -rf /dev/shm/pgjobd-test.*
	PGJOBD_KEEP_TMP=1 prove --nocolor -v "$t" 2>&1 && continue
	st=1
	# The whole logs of the daemons it started, without the per-slot state lines.
	for f in /dev/shm/pgjobd-test.*/*.log; do
		[ -s "$f" ] || continue
		echo "# vm: ---- $f"
		grep -v 'msg="\(slot\|db\) state"' "$f" | tail -n 300 | sed 's/^/# vm-log: /'
	done
done
echo "# vm: load after the tests: $(cat /proc/loadavg)"
echo "VM-END $st"
