#!/bin/sh
# PID 1 of the real-LVM test VM (hack/vm-test-lvm.sh packs it as /init).
#
# The guest has no init system and no udev: the node agent's container has
# neither, and lvm2 must work without them. It loads the disk and
# device-mapper modules, runs the test binary against the virtio disk
# /dev/vda, and powers off.
#
# The second serial port (ttyS1) gets the facts below, the go test -v output,
# and a last line "meshvol-vm: exit N" with the test binary's status.
. /meshvol/guest.sh

# lvm2's lock files and run directory; /run is empty in the image.
mkdir -p /run/lock/lvm /run/lvm /tmp

# dm_snapshot is in the image but not loaded here: lvm2 loads it on demand
# for snapshots, as it would on a node, and the tests see that work.
load_modules virtio_pci virtio_blk dm_mod dm_thin_pool
wait_disk "the PV disk did not appear"

say "kernel $(uname -r), $(lvm version | sed -n 's/^ *LVM version: *//p') (lvm2), $(dmsetup version | sed -n 's/^Driver version: *//p') (dm driver), thin_check $(thin_check --version)"
say "udev: $(if [ -e /run/udev/control ]; then echo running; else echo absent; fi); lvm.conf udev_rules: $(lvmconfig --typeconfig full activation/udev_rules 2>&1)"

start=$(date +%s)
MESHVOL_VM_PV=/dev/vda /meshvol/lvm.test -test.v -test.timeout "${MESHVOL_VM_TEST_TIMEOUT:-20m}" \
	${MESHVOL_VM_RUN:+-test.run "$MESHVOL_VM_RUN"} >"$out" 2>&1
rc=$?
say "test binary ran $(($(date +%s) - start))s"
# What lvm2 left running (captures 24b and 32 saw dmeventd auto-started).
user=""
for p in /proc/[0-9]*; do
	# Kernel threads have an empty cmdline.
	cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null | sed 's/ $//')
	[ -n "$cmd" ] && user="${user}[$cmd] "
done
say "user processes after the tests: $user"
say "exit $rc"
poweroff_now
