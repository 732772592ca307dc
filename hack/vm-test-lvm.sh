#!/usr/bin/env bash
# Runs test/vm/lvm (pkg/storage/lvm against real lvm2) inside a qemu VM with
# Debian's kernel. See test/vm/README.md for what it proves and how long it
# takes. Not part of `make test` or CI: `make test-lvm-vm`.
#
# Steps: build or reuse the guest (hack/vm-image.sh), cross-build the test
# binary, append it, test/vm/init.sh and test/vm/guest.sh to the cached rootfs
# as a second initramfs archive, boot with a fresh sparse 1 GiB disk as the PV,
# and judge the run from what the guest wrote to its second serial port.
#
# The guest runs under TCG, qemu's software emulation: it needs no /dev/kvm
# and behaves the same on every machine. (Where this was written /dev/kvm
# exists but the CPU shows no vmx/svm, and a KVM boot printed nothing in ten
# minutes, so there is no KVM switch.)
#
# Environment:
#   VM_TIMEOUT  seconds before qemu is killed (default 1200)
#   VM_TEST_TIMEOUT  go test -timeout inside the guest (default 15m)
#   VM_RUN      -test.run pattern for the guest (default: all; no spaces)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=bin/vm
RUN=$OUT/run
start=$SECONDS

hack/vm-image.sh
command -v qemu-system-x86_64 >/dev/null || {
	echo "vm-test-lvm: installing qemu-system-x86 from Debian's packages"
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends qemu-system-x86
}

rm -rf "$RUN"
mkdir -p "$RUN/payload/meshvol"
# Static, so the binary needs nothing from the guest's libc. The package is
# behind the build tag vmtest, which keeps it out of `go test ./...`.
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -tags vmtest -o "$RUN/payload/meshvol/lvm.test" ./test/vm/lvm
install -m 0755 test/vm/init.sh "$RUN/payload/init"
install -m 0644 test/vm/guest.sh "$RUN/payload/meshvol/guest.sh" # the helpers /init sources
# The kernel unpacks concatenated newc archives in order; the later /init wins.
(cd "$RUN/payload" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$RUN/payload.cpio"
cat "$OUT/rootfs.cpio" "$RUN/payload.cpio" >"$RUN/initrd.cpio"
# A fresh, sparse disk each run: the tests start from an empty PV.
truncate -s 1G "$RUN/pv.img"

# Unknown name=value parameters reach /init as environment variables.
append="console=ttyS0 panic=-1 loglevel=4 MESHVOL_VM_TEST_TIMEOUT=${VM_TEST_TIMEOUT:-15m}"
if [[ -n ${VM_RUN:-} ]]; then
	if [[ $VM_RUN == *[[:space:]\"]* ]]; then
		echo "vm-test-lvm: VM_RUN must not contain spaces or quotes (it travels on the kernel command line)" >&2
		exit 2
	fi
	append+=" MESHVOL_VM_RUN=$VM_RUN"
fi

echo "vm-test-lvm: booting (software emulation) with a 1 GiB PV; console log $RUN/console.log"
boot=$SECONDS
# timeout puts qemu in a process group of its own, out of reach of a Ctrl-C
# at the terminal; the trap passes INT/TERM on (timeout forwards it to qemu).
timeout -k 10 "${VM_TIMEOUT:-1200}" qemu-system-x86_64 \
	-accel tcg -cpu max -m 1024 -smp 1 \
	-kernel "$OUT/vmlinuz" -initrd "$RUN/initrd.cpio" -append "$append" \
	-drive "file=$RUN/pv.img,if=virtio,format=raw,cache=unsafe" \
	-nic none -display none -monitor none -no-reboot \
	-serial "file:$RUN/console.log" -serial "file:$RUN/result.log" &
qemu=$!
trap 'kill "$qemu" 2>/dev/null' INT TERM
qemu_rc=0
wait "$qemu" || qemu_rc=$?
trap - INT TERM
tr -d '\r' <"$RUN/result.log" >"$RUN/result.txt"
cat "$RUN/result.txt"
echo "vm-test-lvm: VM ran $((SECONDS - boot))s, whole run $((SECONDS - start))s (image, build, boot, tests)"

if ((qemu_rc == 124 || qemu_rc == 137)); then
	echo "vm-test-lvm: qemu killed after ${VM_TIMEOUT:-1200}s; last console lines:" >&2
	tail -20 "$RUN/console.log" >&2
	exit 1
fi
rc=$(sed -n 's/^meshvol-vm: exit \([0-9]*\)$/\1/p' "$RUN/result.txt" | tail -1)
passed=$(grep -c -E '^[[:space:]]*--- PASS:' "$RUN/result.txt" || true)
failed=$(grep -c -E '^[[:space:]]*--- FAIL:' "$RUN/result.txt" || true)
skipped=$(grep -c -E '^[[:space:]]*--- SKIP:' "$RUN/result.txt" || true)
if [[ -z $rc ]]; then
	echo "vm-test-lvm: the guest never reported an exit status (qemu exit $qemu_rc); last console lines:" >&2
	tail -20 "$RUN/console.log" >&2
	exit 1
fi
if ((rc != 0)) && ((failed == 0)); then
	failed=1 # the binary failed outside a test (setup, timeout, panic)
fi
echo "test-lvm-vm: $passed passed, $failed failed, $skipped skipped"
((rc == 0))
