#!/usr/bin/env bash
# tests/vm/run.sh - resource limits enforced for real, in a VM with its own kernel in the
# unified cgroup hierarchy (TAP; `make check-vm`; opt-in and heavy: not part of `make check`).
#
# Where the host (or a container sharing its kernel) is a cgroup v1 hybrid, the memory, pids
# and cpu controllers are bound to v1 and t_69_resources.sh part F skips. This boots a
# Debian 12 VM under qemu (KVM when /dev/kvm works, else TCG) with systemd in the unified
# hierarchy (systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all psi=1) and runs t_69 there.
#
# Made once and kept in $VM_CACHE (default build/vm):
#   root/      a Debian 12 root: a copy of tests/systemd/run.sh's debootstrap cache when there
#              is one, else debootstrap; plus linux-image-cloud-amd64 (its initramfs has the
#              virtio modules), procps, stress-ng, and the service that runs tests/vm/guest.sh
#   base.img   that root as an ext4 image (mkfs.ext4 -d); booted with snapshot=on, so every
#              run starts from the same state; vmlinuz, initrd.img: the kernel qemu boots
# Each run: payload.img (ext4, tests/ and the binaries built here: the host must be Debian 12
# as the guest is), booted as the second disk; the guest's output comes back on its second
# serial port (out.log), its console on the first (console.log).
# Skipped (1..0 # SKIP why) without root, qemu, mkfs.ext4 -d, the built binaries, or a mirror.
set -u
REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${B:-$REPO_ROOT/build}
CACHE=${VM_CACHE:-$B/vm}
NSPAWN_CACHE=${NSPAWN_CACHE:-$B/nspawn}
SUITE=bookworm
INCLUDE=systemd,systemd-sysv,dbus,postgresql,libpq5,libev4,libinih1,libyaml-0-2
EXTRA="linux-image-cloud-amd64 initramfs-tools procps stress-ng psmisc"
VM_MEM=${VM_MEM:-2048}
VM_CPUS=${VM_CPUS:-2}
VM_TIMEOUT=${VM_TIMEOUT:-900}
VM_TESTS=${VM_TESTS:-tests/integration/t_69_resources.sh}

n=0
failed=0
ok() { # ok STATUS DESCRIPTION
	n=$((n + 1))
	if [ "$1" -eq 0 ]; then echo "ok $n - $2"; else
		echo "not ok $n - $2"
		failed=$((failed + 1))
	fi
}
diag() { sed 's/^/# /'; }
skip_all() {
	echo "1..0 # SKIP $*"
	exit 0
}

[ "$(id -u)" = 0 ] || skip_all "needs root (chroot, mkfs.ext4 -d of a root)"
for c in qemu-system-x86_64 mkfs.ext4 chroot unshare; do
	command -v "$c" >/dev/null || skip_all "$c is not installed (apt-get install qemu-system-x86 e2fsprogs)"
done
mkfs.ext4 2>&1 | grep -q -- '-d ' || skip_all "mkfs.ext4 has no -d (e2fsprogs >= 1.43)"
for f in pgjobd tests/notify-sink tests/chaos-proxy tests/config-keys tests/claim-sql tests/pgjobd-next; do
	[ -x "$B/$f" ] || skip_all "no $B/$f: run make first (make check-vm builds them)"
done
grep -q 'bookworm' /etc/os-release 2>/dev/null ||
	skip_all "the binaries built here run in a Debian 12 guest only when the host is Debian 12"

mirror=$(sed -n 's/^URIs: *\([^ ]*debian\/\?\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ { print $2; exit }' \
	/etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

# in_root CMD...: runs CMD in the root with /proc, /sys and /dev, in a mount namespace of
# its own (nothing stays mounted on the host).
in_root() {
	unshare -m --propagation private sh -c '
		r=$1; shift
		mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" && mount -t sysfs sys "$r/sys" &&
		exec chroot "$r" "$@"' in_root "$CACHE/root" "$@"
}

mkdir -p "$CACHE"
# Bump ROOT_VERSION when what is made in the root below changes.
ROOT_VERSION=1
stamp=$CACHE/.complete-$(echo "$ROOT_VERSION $INCLUDE $EXTRA" | md5sum | cut -c1-8)
if [ ! -e "$stamp" ]; then
	rm -rf "$CACHE/root" "$CACHE"/.complete-* "$CACHE/base.img"
	nspawn_base=$NSPAWN_CACHE/base-$SUITE-$(echo "$INCLUDE" | md5sum | cut -c1-8)
	if [ -e "$nspawn_base/.complete" ]; then
		echo "# root: a copy of $nspawn_base"
		cp -a "$nspawn_base" "$CACHE/root" || skip_all "cannot copy $nspawn_base"
	else
		echo "# root: debootstrap $SUITE from $mirror (once)"
		command -v debootstrap >/dev/null || skip_all "debootstrap is not installed"
		debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$CACHE/root" "$mirror" \
			>"$CACHE/debootstrap.log" 2>&1 ||
			skip_all "debootstrap from $mirror failed (see $CACHE/debootstrap.log)"
	fi
	R=$CACHE/root
	cp /etc/resolv.conf "$R/etc/resolv.conf"
	rm -f "$R/etc/apt/sources.list"
	printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
		"$mirror" "$SUITE" "$SUITE" >"$R/etc/apt/sources.list.d/debian.sources"
	echo 'do_symlinks = yes' >"$R/etc/kernel-img.conf"
	echo "# root: apt-get install $EXTRA"
	# shellcheck disable=SC2086
	if ! in_root sh -c "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends $EXTRA && apt-get clean" >"$CACHE/apt.log" 2>&1; then
		tail -5 "$CACHE/apt.log" | diag
		skip_all "apt-get install in the VM's root failed (no mirror? see $CACHE/apt.log)"
	fi
	echo pgjobd-vm >"$R/etc/hostname"
	printf '/dev/vda / ext4 defaults 0 1\n' >"$R/etc/fstab"
	# No system-wide PostgreSQL: the tests start their own.
	in_root systemctl mask postgresql.service postgresql@15-main.service >/dev/null 2>&1
	cat >"$R/etc/systemd/system/pgjobd-vm.service" <<-'UNIT'
		[Unit]
		Description=pgjobd: tests/vm/guest.sh from the payload disk, then power off
		After=local-fs.target systemd-journald.service
		[Service]
		Type=oneshot
		ExecStart=/bin/sh -c 'mkdir -p /mnt/payload && mount -o ro /dev/vdb /mnt/payload && exec /mnt/payload/tests/vm/guest.sh'
		ExecStopPost=/bin/systemctl poweroff --no-block
		StandardOutput=tty
		StandardError=tty
		TTYPath=/dev/ttyS1
		TimeoutStartSec=infinity
		[Install]
		WantedBy=multi-user.target
	UNIT
	in_root systemctl enable pgjobd-vm.service >/dev/null 2>&1 || skip_all "cannot enable the guest's service"
	touch "$stamp"
	rm -f "$CACHE/base.img"
fi
if [ ! -e "$CACHE/base.img" ]; then
	echo "# base.img from $CACHE/root"
	cp -L "$CACHE/root/vmlinuz" "$CACHE/vmlinuz" && cp -L "$CACHE/root/initrd.img" "$CACHE/initrd.img" ||
		skip_all "no kernel in $CACHE/root"
	mkfs.ext4 -q -F -L pgjobd-vm -d "$CACHE/root" "$CACHE/base.img.new" 4G >"$CACHE/mkfs.log" 2>&1 ||
		skip_all "mkfs.ext4 -d failed (see $CACHE/mkfs.log)"
	mv "$CACHE/base.img.new" "$CACHE/base.img"
fi

# The payload: tests/ and the binaries, as the guest's /mnt/payload.
P=$CACHE/payload
rm -rf "$P" "$CACHE/payload.img" && mkdir -p "$P/build/tests"
cp -a "$REPO_ROOT/tests" "$P/" || skip_all "cannot copy tests/"
for f in pgjobd tests/notify-sink tests/chaos-proxy tests/config-keys tests/claim-sql tests/pgjobd-next; do
	cp "$B/$f" "$P/build/$f"
done
echo "$VM_TESTS" >"$P/vm-tests"
mkfs.ext4 -q -F -L payload -d "$P" "$CACHE/payload.img" 256M >"$CACHE/mkfs-payload.log" 2>&1 ||
	skip_all "mkfs.ext4 -d of the payload failed (see $CACHE/mkfs-payload.log)"

# KVM when a probe with -cpu host starts; else TCG (minutes slower, and its timing is the
# emulator's: a busy host delays the guest's timers). Where this was written, /dev/kvm is
# kvm_pvm (nested, no VMX): -cpu host fails (MSR 0x10a) and without arch-capabilities a
# stock Debian kernel prints nothing: PVM runs only kernels built as PVM guests.
accel=(-machine q35 -accel tcg)
how="TCG (no usable /dev/kvm)"
[ -e /dev/kvm ] || how="TCG (no /dev/kvm)"
if [ -w /dev/kvm ] && qemu-system-x86_64 -machine q35 -accel kvm -cpu host -nodefaults -display none \
	-S -monitor none -daemonize -pidfile "$CACHE/kvm-probe.pid" 2>"$CACHE/kvm-probe.log"; then
	kill "$(cat "$CACHE/kvm-probe.pid")" 2>/dev/null
	accel=(-machine q35 -accel kvm -cpu host)
	how="KVM"
elif [ -s "$CACHE/kvm-probe.log" ]; then
	how="TCG (KVM probe: $(head -1 "$CACHE/kvm-probe.log"))"
fi
echo "# boot: $how, $VM_CPUS CPUs, $VM_MEM MiB, kernel $(basename "$(readlink "$CACHE/root/vmlinuz")")"
rm -f "$CACHE/out.log" "$CACHE/console.log"
t0=$(date +%s)
timeout "$VM_TIMEOUT" qemu-system-x86_64 "${accel[@]}" -smp "$VM_CPUS" -m "$VM_MEM" \
	-nodefaults -display none -no-reboot \
	-kernel "$CACHE/vmlinuz" -initrd "$CACHE/initrd.img" \
	-append "root=/dev/vda rw console=ttyS0 systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all psi=1 panic=-1" \
	-drive file="$CACHE/base.img",if=virtio,format=raw,snapshot=on \
	-drive file="$CACHE/payload.img",if=virtio,format=raw,readonly=on \
	-serial file:"$CACHE/console.log" -serial file:"$CACHE/out.log" \
	-nic none >"$CACHE/qemu.log" 2>&1
qst=$?
secs=$(($(date +%s) - t0))
tr -d '\r' <"$CACHE/out.log" >"$CACHE/out.txt" 2>/dev/null
echo "# qemu exited $qst after $secs s"

[ -s "$CACHE/out.txt" ] && grep -q '^# vm: kernel' "$CACHE/out.txt"
ok $? "the VM boots and runs tests/vm/guest.sh ($how)" || {
	tail -5 "$CACHE/qemu.log" | diag
	tail -30 "$CACHE/console.log" | tr -d '\r' | diag
}
grep '^# vm:' "$CACHE/out.txt" | grep -v '^# vm: ----'
grep -q '^# vm: /sys/fs/cgroup is cgroup2fs' "$CACHE/out.txt" &&
	grep -q '^# vm: v1 hierarchies: 0$' "$CACHE/out.txt"
ok $? "the guest's systemd runs in the unified cgroup hierarchy, no cgroup v1 mounted"
grep -q '^# vm: root subtree_control: .*cpu.*memory.*pids' "$CACHE/out.txt"
ok $? "the root cgroup gives its children cpu, memory and pids"
grep -q '^VM-END 0$' "$CACHE/out.txt"
ok $? "$VM_TESTS pass in the VM" || grep -E '^(not ok|Bail out|# (Failed|got|expected))' "$CACHE/out.txt" | diag
grep -E '^ok .* # (SKIP|skip)' "$CACHE/out.txt" | diag
! grep -qE '^ok [0-9]+ .*# (SKIP|skip) F:' "$CACHE/out.txt" && grep -qE '^ok [0-9]+ - F: ' "$CACHE/out.txt"
ok $? "t_69 part F (enforcement) ran, not skipped"
echo "# figures measured in the VM:"
grep -E '^# (D|E|F):|^# test cgroup|^# vm: (control|cpu some)' "$CACHE/out.txt"
echo "# full output: $CACHE/out.txt; console: $CACHE/console.log"
echo "1..$n"
[ "$failed" -eq 0 ]
