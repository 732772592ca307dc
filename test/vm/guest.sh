# Sourced by the /init (PID 1) of every test VM: test/vm/init.sh (the real-LVM
# tier) and test/vm/drbd/init.sh (the real-DRBD tier). hack/vm-test-lvm.sh and
# hack/vm-test-drbd.sh pack it as /meshvol/guest.sh beside the test binary.
#
# The guests are debootstrapped Debian with no init system and no udev, like
# the node agent's container: this mounts the kernel filesystems and gives the
# init scripts the few helpers they share.
#
# The console (ttyS0) gets the kernel's messages; the second serial port
# (ttyS1) gets only what the host parses, and the last line there is always
# "meshvol-vm: exit N".
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

out=/dev/ttyS1
say() { echo "meshvol-vm: $*" >"$out"; }

poweroff_now() {
	sync
	# No init system to ask: the kernel's own power-off. qemu runs with
	# -no-reboot, so a panic (init exiting) also ends it.
	echo o >/proc/sysrq-trigger
	sleep 30
}

# fail reports why the guest cannot run its tests (exit 125: the host tells
# a broken guest from failed tests) and powers off.
fail() {
	say "$*"
	say "exit 125"
	poweroff_now
}

# load_modules loads each module in turn; the first one that fails ends the run.
load_modules() {
	for m in "$@"; do
		modprobe "$m" 2>"$out" || fail "modprobe $m failed"
	done
}

# wait_disk waits up to 10 s for /dev/vda (virtio_blk probes the disk
# asynchronously); $1 says what the disk is for when it never appears.
wait_disk() {
	i=0
	while [ ! -b /dev/vda ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
	[ -b /dev/vda ] || fail "no /dev/vda: $1"
}
