#!/bin/sh
# PID 1 of each guest of the real-DRBD VM tier (hack/vm-test-drbd.sh packs it
# as /init; test/vm/README.md).
#
# The guest has drbd-utils and no init system or udev, like the node agent's
# container. From the kernel command line it gets its node name
# (MESHVOL_VM_NODE) and address (MESHVOL_VM_IP, on the tier's private
# network). It loads the virtio and DRBD modules, brings up the network, and
# runs the test binary as this node's agent, which serves the node's
# drbd.ExecDriver to the tests on the host until they power it off.
#
# The second serial port (ttyS1) gets the facts below, the agent's log (every
# drbd-utils command it ran, with exit code and duration) and a last line
# "meshvol-vm: exit N".
. /meshvol/guest.sh

mkdir -p /run/lock /tmp /var/lib/meshvol

node=${MESHVOL_VM_NODE:?}
hostname "$node"

# DRBD's own handshake module first: Debian's 6.1 has no net/handshake, and
# drbd_transport_tcp needs its symbols (tls_client_hello_x509).
load_modules virtio_pci virtio_blk virtio_net handshake drbd drbd_transport_tcp

ip link set lo up
ip link set eth0 up || fail "no eth0"
ip addr add "${MESHVOL_VM_IP:?}/24" dev eth0 || fail "ip addr add $MESHVOL_VM_IP failed"

if [ "${MESHVOL_VM_DISK:-}" = yes ]; then
	wait_disk "the backing disk did not appear"
fi

# The product tier (VM_SUITE=product): `meshvol node` runs here with a File
# pool on this guest's disk and stages volumes under the kubelet's directory.
if [ "${MESHVOL_VM_PRODUCT:-}" = yes ]; then
	load_modules loop ext4 dm_mod dm_thin_pool dm_snapshot
	mkdir -p /var/lib/meshvol/pool /var/lib/kubelet
	mkfs.ext4 -q -F /dev/vda || fail "mkfs.ext4 /dev/vda failed"
	mount /dev/vda /var/lib/meshvol/pool || fail "mounting the pool's disk failed"
fi

say "$node: kernel $(uname -r); $(head -1 /proc/drbd); drbd.ko $(modinfo -F filename drbd); $(drbdadm --version 2>/dev/null | grep '^DRBDADM_VERSION='); $MESHVOL_VM_IP; disk ${MESHVOL_VM_DISK:-no}"

MESHVOL_VM_DRBD_AGENT=$node /meshvol/drbd.test >"$out" 2>&1
rc=$?
say "exit $rc"
poweroff_now
