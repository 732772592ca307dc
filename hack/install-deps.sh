#!/usr/bin/env bash
# Installs the Debian packages the tests need, when missing. Called by
# `make test` (before hack/test.sh) and by .ci/run, so a fresh machine needs
# nothing but Go and make before `make test`. Installed packages are left
# alone: when all are present this only asks dpkg (well under a second).
#
# As root: `apt-get update` once, then one `apt-get install` of what is
# missing. Not root: prints the exact command to run and exits 1 (nothing
# here asks for a password).
set -euo pipefail

# The one list. Who needs what:
PACKAGES=(
	drbd-utils                  # pkg/drbd: every rendered .res goes through the real drbdadm parser; ExecDriver runs drbdadm/drbdsetup/drbdmeta
	xfsprogs                    # mkfs.xfs: filesystems on drbdsim devices (sandbox, e2e, CSI node staging)
	e2fsprogs                   # mkfs.ext4, fsck: the same, and pkg/drbd/drbdsim's device tests
	util-linux                  # losetup, blkid: drbdsim's block devices, CSI node staging
	mount                       # mount/umount: drbdsim device tests, CSI node staging
	fuse3                       # /dev/fuse userspace for drbdsim's FUSE-backed replicated device (pkg/drbd/drbdsim)
	make                        # the Makefile
	git                         # git describe for the version stamp
	containerd                  # sandbox and e2e: the container runtime the kubelet drives
	runc                        # sandbox and e2e: containerd's OCI runtime
	containernetworking-plugins # sandbox and e2e: bridge, host-local and loopback CNI plugins for pods
	busybox-static              # sandbox and e2e: the test pods' image is built from its static binary
	iptables                    # sandbox and e2e: the CNI bridge plugin's masquerade and port rules
)

missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
	exit 0
fi

install=(apt-get install -y -q --no-install-recommends "${missing[@]}")
if ((EUID != 0)); then
	echo "install-deps: missing Debian packages: ${missing[*]}" >&2
	echo "install-deps: run as root:" >&2
	echo "    apt-get update && ${install[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
"${install[@]}" </dev/null
