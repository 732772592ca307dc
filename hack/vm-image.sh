#!/usr/bin/env bash
# Builds the guest of a VM tier (test/vm/README.md). VM_IMAGE says which:
#
# lvm (default), the real-LVM tier, into bin/vm/:
#   bin/vm/vmlinuz      Debian's kernel (the linux-image-amd64 the host's apt
#                       resolves today: bookworm's 6.1), unchanged
#   bin/vm/rootfs.cpio  a debootstrapped bookworm (minbase + lvm2,
#                       thin-provisioning-tools, kmod) with only the kernel
#                       modules the tier loads, as an uncompressed initramfs
#
# drbd, the real-DRBD tier, into bin/vm/drbd/: the same kernel, and a
#   bookworm with drbd-utils and iproute2 whose modules are virtio (disk and
#   network) plus DRBD 9.2.18 as hack/vm-drbd-module.sh built it (drbd,
#   drbd_transport_tcp and DRBD's handshake), in /lib/modules/<kver>/updates.
#   Debian's own drbd.ko (8.4) is never copied in.
#
# Everything comes from Debian's packages through the host's own apt sources:
# debootstrap is pointed at the mirror the host already uses (VM_MIRROR
# overrides). Uncompressed, because under software emulation the kernel
# decompressing ~100 MB costs more than copying it.
#
# The result is cached: bin/vm/image.stamp records a hash of this script; a
# rerun with the same script and both files present does nothing. Delete
# bin/vm (or run with VM_REBUILD=1) to rebuild.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIND=${VM_IMAGE:-lvm}
SUITE=${VM_SUITE:-bookworm}
# The modules the guest may load: the virtio disk that becomes the PV and
# device-mapper with the thin target (test/vm/init.sh loads these), and
# dm_snapshot, which lvm2 itself modprobes for any `lvcreate -s`, thin
# snapshots included: without it on disk a thin snapshot fails with
# "snapshot: Required device-mapper target(s) not detected in your kernel."
# (exit 3). modprobe resolves their dependencies (dm_thin_pool needs
# dm_persistent_data, dm_bio_prison, dm_bufio).
MODULES=(virtio_pci virtio_blk dm_mod dm_thin_pool dm_snapshot)
# lvm2 runs thin_check when it activates a thin pool (thin-provisioning-tools);
# kmod gives modprobe. Everything else lvm2 needs comes as its dependencies.
PACKAGES=lvm2,thin-provisioning-tools,kmod
OUT=$ROOT/bin/vm
want=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
extra_modules=""

case $KIND in
lvm) ;;
drbd)
	OUT=$ROOT/bin/vm/drbd
	# virtio_net for the guests' network; DRBD's own modules (their
	# dependencies, lru_cache and libcrc32c, come from Debian's tree). For
	# `meshvol node` and its CSI node service (test/vm/product): loop (the
	# file pool's devices), ext4 (the file pool's own disk and the volumes'
	# filesystems) and device-mapper with the thin target (the LVM thin pool).
	MODULES=(virtio_pci virtio_blk virtio_net drbd drbd_transport_tcp handshake
		loop ext4 dm_mod dm_thin_pool dm_snapshot)
	# drbd-utils 9.22 (bookworm's), the version of the recordings; iproute2
	# for the guest's address; kmod for modprobe; what the node agent's
	# start-up checks ask for (pkg/nodecheck: mkfs.ext4, mkfs.xfs, blkid,
	# losetup, resize2fs, xfs_growfs); lvm2 and thin-provisioning-tools for
	# the LVM thin pool.
	PACKAGES=drbd-utils,iproute2,kmod,e2fsprogs,xfsprogs,util-linux,mount,lvm2,thin-provisioning-tools
	kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
	extra_modules=$ROOT/bin/vm/drbd-modules/${kpkg#linux-image-}
	if [[ ! -f $extra_modules/build.stamp ]]; then
		echo "vm-image: no DRBD modules in $extra_modules: run hack/vm-drbd-module.sh first" >&2
		exit 1
	fi
	# A rebuilt module makes a new image.
	want="$want drbd $(cat "$extra_modules/build.stamp")"
	;;
*)
	echo "vm-image: VM_IMAGE=$KIND: want lvm or drbd" >&2
	exit 2
	;;
esac
stamp=$OUT/image.stamp
if [[ -z ${VM_REBUILD:-} && -f $stamp && -f $OUT/vmlinuz && -f $OUT/rootfs.cpio && $(cat "$stamp") == "$want" ]]; then
	echo "vm-image: ${OUT#"$ROOT"/} is up to date ($(du -h "$OUT/rootfs.cpio" | cut -f1) rootfs.cpio)"
	exit 0
fi

need() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	if ((${#missing[@]})); then
		echo "vm-image: installing ${missing[*]} from Debian's packages"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
	fi
}
need debootstrap cpio debian-archive-keyring

# The mirror the host's apt uses for $SUITE: deb822 (.sources) or one-line form.
mirror=${VM_MIRROR:-}
if [[ -z $mirror ]]; then
	mirror=$(awk -v suite="$SUITE" '
		/^URIs:/ { uri = $2 }
		/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite && uri !~ /security/) { print uri; exit } }
		/^deb / { if ($3 == suite) { print $2; exit } }
	' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
fi
if [[ -z $mirror ]]; then
	echo "vm-image: no apt source for suite $SUITE in /etc/apt; set VM_MIRROR to a Debian mirror URL" >&2
	exit 1
fi

# The kernel: the package linux-image-amd64 points at, fetched as a .deb (not
# installed on the host) and unpacked.
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
if [[ -z $kpkg ]]; then
	echo "vm-image: apt-cache cannot resolve linux-image-amd64 (run apt-get update)" >&2
	exit 1
fi
kver=${kpkg#linux-image-}

work=$OUT/build
rm -rf "$work" "$OUT/rootfs.cpio" "$OUT/vmlinuz" "$stamp"
mkdir -p "$work/deb" "$work/kernel"
start=$SECONDS

echo "vm-image: fetching $kpkg"
(cd "$work/deb" && apt-get download "$kpkg")
dpkg-deb -x "$work"/deb/"$kpkg"_*.deb "$work/kernel"
cp "$work/kernel/boot/vmlinuz-$kver" "$OUT/vmlinuz"

echo "vm-image: debootstrap $SUITE (minbase + $PACKAGES) from $mirror"
rootfs=$work/rootfs
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
	tail -30 "$work/debootstrap.log" >&2
	echo "vm-image: debootstrap failed; full log in $work/debootstrap.log" >&2
	exit 1
}

# Only the modules the guest loads and what they depend on: the whole tree is
# ~400 MB. The kmod inside the rootfs computes the closure against the full
# tree, then the tree is replaced by that closure and depmod rerun on it.
mods=$rootfs/lib/modules/$kver
mkdir -p "$rootfs/lib/modules"
cp -a "$work/kernel/lib/modules/$kver" "$mods"
if [[ -n $extra_modules ]]; then
	# updates/ comes before the kernel's own tree in depmod's search order,
	# so drbd resolves to this drbd.ko and not to Debian's in-tree 8.4.
	mkdir -p "$mods/updates"
	cp "$extra_modules"/*.ko "$mods/updates/"
fi
chroot "$rootfs" depmod "$kver"
closure=$(for m in "${MODULES[@]}"; do chroot "$rootfs" modprobe -S "$kver" --show-depends "$m"; done |
	awk '$1 == "insmod" { print $2 }' | sort -u)
mv "$mods" "$work/modules-full"
for f in $closure; do
	mkdir -p "$rootfs$(dirname "$f")"
	cp "$work/modules-full${f#/lib/modules/"$kver"}" "$rootfs$f"
done
cp "$work/modules-full"/modules.{order,builtin,builtin.modinfo} "$mods/" 2>/dev/null || true
chroot "$rootfs" depmod "$kver"
echo "vm-image: modules: $(echo "$closure" | xargs -n1 basename | tr '\n' ' ')"

# What a test VM never reads: documentation, locales, apt's caches and lists.
rm -rf "$rootfs"/usr/share/{doc,man,info,locale,i18n} "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/*

(cd "$rootfs" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$OUT/rootfs.cpio"
rm -rf "$work"
echo "$want" >"$stamp"
echo "vm-image: built ${OUT#"$ROOT"/}/vmlinuz ($kver) and ${OUT#"$ROOT"/}/rootfs.cpio ($(du -h "$OUT/rootfs.cpio" | cut -f1)) in $((SECONDS - start))s"
