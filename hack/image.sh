#!/usr/bin/env bash
# Builds meshvol's image without a container engine (there is none on the
# development machines) into bin/image/meshvol.oci.tar, an OCI image archive:
#
#   layer 1  a debootstrapped Debian bookworm (minbase) with what the node plugin
#            runs: drbd-utils, lvm2, thin-provisioning-tools, e2fsprogs, xfsprogs,
#            util-linux, mount, kmod; apt lists, docs, man pages, translations,
#            xfs_scrub, xfs_scrub_all and the ICU and Python they alone need removed
#   layer 2  /usr/local/bin/meshvol, static (CGO off)
#
# entrypoint /usr/local/bin/meshvol, cmd version: the same image as the Dockerfile.
# Then it checks the archive (internal/ociimage.Verify: every digest, OCI media types,
# and the entrypoint run in a chroot prints meshvol's version).
#
# The rootfs is cached in bin/image/rootfs with a stamp of this script; a rerun
# only rebuilds the binary and the archive. Needs root (debootstrap, chroot).
# Load it with `ctr -n k8s.io images import bin/image/meshvol.oci.tar`, or push it
# with `skopeo copy oci-archive:bin/image/meshvol.oci.tar docker://REGISTRY/meshvol:TAG`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=bin/image
SUITE=bookworm
PACKAGES=drbd-utils,lvm2,thin-provisioning-tools,e2fsprogs,xfsprogs,util-linux,mount,kmod
VERSION=${VERSION:-$(git describe --tags --dirty 2>/dev/null || echo dev)}
REF=${IMAGE_REF:-docker.io/meshvol/meshvol:$VERSION}

((EUID == 0)) || { echo "image: debootstrap and chroot need root" >&2; exit 1; }
log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

for p in debootstrap debian-archive-keyring; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || {
		log "installing $p"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$p" </dev/null
	}
done

# The mirror the host's apt uses (deb822 .sources or one-line form), as hack/vm-image.sh.
mirror=${IMAGE_MIRROR:-$(awk -v suite="$SUITE" '
	/^URIs:/ { uri = $2 }
	/^Suites:/ { for (i = 2; i <= NF; i++) if ($i == suite && uri !~ /security/) { print uri; exit } }
	/^deb / { if ($3 == suite) { print $2; exit } }' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}

start=$SECONDS
mkdir -p "$OUT"
want=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
if [[ -f $OUT/rootfs.stamp && $(cat "$OUT/rootfs.stamp") == "$want" && -d $OUT/rootfs/usr ]]; then
	log "rootfs up to date ($(du -sh "$OUT/rootfs" | cut -f1))"
else
	log "debootstrap $SUITE from $mirror with $PACKAGES"
	rm -rf "$OUT/rootfs" "$OUT/rootfs.stamp"
	debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$OUT/rootfs" "$mirror" >"$OUT/debootstrap.log" 2>&1 ||
		{ tail -n 20 "$OUT/debootstrap.log"; exit 1; }
	# What a runtime image never uses: package caches and lists, docs, man pages,
	# the translations of every program's messages (usr/share/locale, 34 MB: the
	# node plugin parses the tools' output in the C locale), and xfs_scrub and
	# xfs_scrub_all, the online checkers of a mounted xfs, which meshvol never
	# runs (it runs mkfs.xfs and xfs_growfs): xfs_scrub alone links ICU
	# (libicu72, 36 MB) and xfs_scrub_all alone needs Python (xfsprogs depends
	# on python3 for it: 34 MB). python3 goes first, while its removal script
	# still has the interpreter it runs.
	rm -rf "$OUT"/rootfs/var/cache/apt/* "$OUT"/rootfs/var/lib/apt/lists/* \
		"$OUT"/rootfs/usr/share/doc/* "$OUT"/rootfs/usr/share/man/* "$OUT"/rootfs/usr/share/info/* \
		"$OUT"/rootfs/usr/share/locale/* \
		"$OUT"/rootfs/var/log/*.log "$OUT"/rootfs/var/cache/debconf/*-old
	rm -f "$OUT"/rootfs/usr/sbin/xfs_scrub "$OUT"/rootfs/usr/sbin/xfs_scrub_all \
		"$OUT"/rootfs/usr/lib/systemd/system/xfs_scrub*
	chroot "$OUT/rootfs" dpkg --purge --force-depends python3 >>"$OUT/debootstrap.log" 2>&1
	chroot "$OUT/rootfs" dpkg --purge --force-depends libicu72 python3.11 python3-minimal python3.11-minimal \
		libpython3-stdlib libpython3.11-stdlib libpython3.11-minimal >>"$OUT/debootstrap.log" 2>&1
	# Nothing left may need what went: every program and library resolves.
	missing=$(chroot "$OUT/rootfs" /bin/sh -c 'for f in /usr/bin/* /usr/sbin/* /usr/lib/x86_64-linux-gnu/*.so*; do
		[ -f "$f" ] && ldd "$f" 2>/dev/null | grep "not found" | sed "s|^|$f: |"; done' || true)
	[[ -z $missing ]] || { echo "image: after trimming the rootfs, libraries are missing:" >&2; echo "$missing" >&2; exit 1; }
	printf '%s' "$want" >"$OUT/rootfs.stamp"
	log "rootfs built in $((SECONDS - start)) s ($(du -sh "$OUT/rootfs" | cut -f1))"
fi

log "building the static meshvol binary ($VERSION)"
CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath \
	-ldflags "-s -w -X github.com/meshvol/meshvol/pkg/version.Version=$VERSION -X github.com/meshvol/meshvol/pkg/version.Commit=$(git rev-parse --short HEAD 2>/dev/null)" \
	-o "$OUT/meshvol" ./cmd/meshvol
GOTOOLCHAIN=local go run ./hack/ociimage build -rootfs "$OUT/rootfs" -binary "$OUT/meshvol" -ref "$REF" -version "$VERSION" -out "$OUT/meshvol.oci.tar"
GOTOOLCHAIN=local go run ./hack/ociimage verify "$OUT/meshvol.oci.tar"
log "done in $((SECONDS - start)) s: $OUT/meshvol.oci.tar, $(du -h "$OUT/meshvol.oci.tar" | cut -f1) (uncompressed layers)"
