#!/usr/bin/env bash
# Builds the DRBD 9.2.18 kernel modules for the real-DRBD VM tier
# (test/vm/README.md) against the kernel the guest image boots, and caches
# them in bin/vm/drbd-modules/<kernel version>/:
#
#   drbd.ko, drbd_transport_tcp.ko  LINBIT's DRBD from DRBD_SRC
#   handshake.ko                    DRBD's own copy of net/handshake:
#                                   Debian's 6.1 has none, and without it
#                                   drbd_transport_tcp fails to load with
#                                   "Unknown symbol tls_client_hello_x509"
#
# The source is not on the Go module proxy or in Debian, so the caller
# provides it: DRBD_SRC is a git checkout of github.com/LINBIT/drbd at tag
# drbd-9.2.18 with its drbd-headers submodule checked out as a real git
# submodule (a plain copy of drbd-headers fails Kbuild's check that the
# headers come from the submodule). The build runs in that tree (DRBD builds
# into its own build-current/) and takes about 6 minutes on 2 cores; the
# result is reused until the source commit, the kernel or this script
# changes (VM_REBUILD=1 forces a rebuild).
#
# Needs, and installs with apt-get when missing: linux-headers-<kver> (the
# kernel's build tree, KDIR) and coccinelle (DRBD generates its compat
# patches for older kernels with spatch; with a git checkout it never falls
# back to LINBIT's online spatch service, and SPAAS=false makes sure).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WANT_TAG=drbd-9.2.18

howto() {
	cat >&2 <<EOF
vm-drbd-module: $1

Set DRBD_SRC to a checkout of LINBIT's DRBD at tag $WANT_TAG with its
drbd-headers submodule, made outside this repository, e.g.:

  git clone https://github.com/LINBIT/drbd /var/tmp/drbd
  git -C /var/tmp/drbd checkout $WANT_TAG
  git -C /var/tmp/drbd submodule update --init    # drbd/drbd-headers from github.com/LINBIT/drbd-headers

  make test-drbd-vm DRBD_SRC=/var/tmp/drbd

(drbd-headers must be a real git submodule: a copied directory fails the build.)
EOF
	exit 2
}

src=${DRBD_SRC:-}
[[ -n $src ]] || howto "DRBD_SRC is not set."
[[ -d $src ]] || howto "DRBD_SRC=$src does not exist."
src=$(cd "$src" && pwd)
git -C "$src" rev-parse --git-dir >/dev/null 2>&1 || howto "DRBD_SRC=$src is not a git checkout."
head=$(git -C "$src" rev-parse HEAD)
tagged=$(git -C "$src" rev-parse -q --verify "refs/tags/$WANT_TAG^{commit}" || true)
[[ $head == "$tagged" ]] || howto "DRBD_SRC=$src is at $(git -C "$src" describe --tags --always HEAD), not at tag $WANT_TAG."
# "-" in front of the commit: the submodule is registered but not checked out.
sub=$(git -C "$src" submodule status drbd/drbd-headers 2>/dev/null || true)
if [[ -z $sub || $sub == -* || ! -e $src/drbd/drbd-headers/.git ]]; then
	howto "DRBD_SRC=$src has no drbd-headers submodule checked out (drbd/drbd-headers)."
fi
subcommit=$(git -C "$src/drbd/drbd-headers" rev-parse HEAD)

# The guest's kernel: the same resolution as hack/vm-image.sh.
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
[[ -n $kpkg ]] || {
	echo "vm-drbd-module: apt-cache cannot resolve linux-image-amd64 (run apt-get update)" >&2
	exit 1
}
kver=${kpkg#linux-image-}
OUT=$ROOT/bin/vm/drbd-modules/$kver
stamp=$OUT/build.stamp
want="$head $subcommit $kver $(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
mods=(drbd.ko drbd_transport_tcp.ko handshake.ko)
have=1
for m in "${mods[@]}"; do [[ -f $OUT/$m ]] || have=0; done
if [[ -z ${VM_REBUILD:-} && $have == 1 && -f $stamp && $(cat "$stamp") == "$want" ]]; then
	echo "vm-drbd-module: bin/vm/drbd-modules/$kver is up to date ($WANT_TAG for $kver)"
	exit 0
fi

need() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if ((${#missing[@]})); then
		if ((EUID != 0)); then
			echo "vm-drbd-module: needs ${missing[*]}; run as root (it installs them with apt-get) or install them" >&2
			exit 1
		fi
		echo "vm-drbd-module: installing ${missing[*]} from Debian's packages"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
	fi
}
need "linux-headers-$kver" coccinelle make gcc

kdir=/usr/src/linux-headers-$kver
rm -f "$stamp"
mkdir -p "$OUT"
echo "vm-drbd-module: building $WANT_TAG for $kver in $src (about 6 minutes on 2 cores; log in $OUT/build.log)"
start=$SECONDS
# -j2: the development machines have 2 cores, shared.
if ! make -C "$src" -j2 KDIR="$kdir" KVER="$kver" SPAAS=false module >"$OUT/build.log" 2>&1; then
	tail -40 "$OUT/build.log" >&2
	echo "vm-drbd-module: build failed; full log in $OUT/build.log" >&2
	exit 1
fi
built=$src/drbd/build-current
cp "$built/drbd.ko" "$built/drbd_transport_tcp.ko" "$built/drbd-kernel-compat/handshake/handshake.ko" "$OUT/"
# The module's own record of its version and kernel (its .modinfo strings;
# the host need not have kmod's modinfo).
modinfo_field() { tr '\0' '\n' <"$1" | sed -n "s/^$2=//p" | head -1; }
ver=$(modinfo_field "$OUT/drbd.ko" version)
vermagic=$(modinfo_field "$OUT/drbd.ko" vermagic)
[[ $vermagic == "$kver "* ]] || {
	echo "vm-drbd-module: drbd.ko was built for '$vermagic', not $kver" >&2
	exit 1
}
echo "$want" >"$stamp"
echo "vm-drbd-module: built drbd $ver for $kver in $((SECONDS - start))s: ${mods[*]}"
