#!/usr/bin/env bash
# Runs test/vm/drbd — pkg/drbd/contract and the real-DRBD checks — on three
# qemu guests with Debian's 6.1 kernel and DRBD 9.2.18 built from LINBIT's
# source. See test/vm/README.md for what it proves and how long it takes.
# Not part of `make test` or CI: `make test-drbd-vm DRBD_SRC=...`.
#
# Steps: build or reuse the DRBD modules (hack/vm-drbd-module.sh, which says
# how to get the source when DRBD_SRC is missing) and the guest image
# (VM_IMAGE=drbd hack/vm-image.sh); cross-build the test binary and append it
# with test/vm/drbd/init.sh and test/vm/guest.sh to the image; create a
# network namespace with a bridge and one tap per guest (10.99.0.1-3 for node1-3, 10.99.0.254 for the
# host side; these addresses exist only inside the namespace); boot the
# three guests in it, node1 and node2 with a fresh sparse 128 MiB disk each,
# node3 diskless; run the test binary on the host inside the namespace,
# where it drives the guests' agents; collect the logs; remove everything.
#
# The guests run under TCG, qemu's software emulation (see
# hack/vm-test-lvm.sh for why there is no KVM switch).
#
# Environment:
#   DRBD_SRC         the DRBD 9.2.18 source tree (required; see hack/vm-drbd-module.sh)
#   VM_TIMEOUT       seconds before the guests are killed (default 3600)
#   VM_TEST_TIMEOUT  go test -timeout of the host's test binary (default 50m)
#   VM_RUN           -test.run pattern (default: all; e.g. TestContract)
#   VM_CONTRACT_RUNS how many times TestContract runs the contract suite in a
#                    row, from wiped metadata each time (default 1)
#   VM_SUITE         drbd (default): pkg/drbd's contract suite and checks, as
#                    above; product: the whole of meshvol on the guests
#                    (test/vm/README.md, "The product on real DRBD"): the
#                    guests are node-1..3, each with a 1 GiB disk for its
#                    File pool, a second for its LVM thin pool, and the
#                    real `meshvol node`; the host runs
#                    kube-apiserver, etcd (bin/k8s) and `meshvol controller`
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=bin/vm/drbd
RUN=$OUT/run
start=$SECONDS

if ((EUID != 0)); then
	echo "vm-test-drbd: run as root (network namespace, tap devices, apt-get)" >&2
	exit 1
fi

t0=$SECONDS
hack/vm-drbd-module.sh
t_module=$((SECONDS - t0))
t0=$SECONDS
VM_IMAGE=drbd hack/vm-image.sh
t_image=$((SECONDS - t0))

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
command -v ebtables >/dev/null || need+=(ebtables)
if ((${#need[@]})); then
	echo "vm-test-drbd: installing ${need[*]} from Debian's packages"
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi

rm -rf "$RUN"
mkdir -p "$RUN/payload/meshvol"
# Static, so the same binary runs in the guests and on the host. The package
# is behind the build tag vmtest, which keeps it out of `go test ./...`.
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go test -c -tags vmtest -o "$RUN/payload/meshvol/drbd.test" ./test/vm/drbd
suite=${VM_SUITE:-drbd}
case $suite in
drbd) nodes=(node1 node2 node3) ;;
product)
	nodes=(node-1 node-2 node-3)
	# The real binary, for `meshvol node` in the guests and `meshvol
	# controller` on the host.
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -o "$RUN/payload/meshvol/meshvol" ./cmd/meshvol
	;;
*)
	echo "vm-test-drbd: VM_SUITE=$suite: want drbd or product" >&2
	exit 2
	;;
esac
install -m 0755 test/vm/drbd/init.sh "$RUN/payload/init"
install -m 0644 test/vm/guest.sh "$RUN/payload/meshvol/guest.sh" # the helpers /init sources
(cd "$RUN/payload" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$RUN/payload.cpio"
cat "$OUT/rootfs.cpio" "$RUN/payload.cpio" >"$RUN/initrd.cpio"

# The initramfs is unpacked into the guest's rootfs, a tmpfs of half its
# memory: the product's image and payload (~330 MB) do not fit in 1 GiB's.
mem=1024
if [[ $suite == product ]]; then
	mem=2048
	# Each guest's File pool: a fresh sparse disk the guest formats; and
	# a second one (/dev/vdb) for its LVM thin pool, which the test makes
	# as an administrator would (test/vm/drbd/product_lvmthin_test.go).
	truncate -s 1G "$RUN/node-1.img" "$RUN/node-2.img" "$RUN/node-3.img"
	truncate -s 1G "$RUN/node-1.thin.img" "$RUN/node-2.thin.img" "$RUN/node-3.thin.img"
else
	# Fresh sparse backing disks of contract.BackingSize (the captures' size).
	truncate -s 128M "$RUN/node1.img" "$RUN/node2.img"
fi

NS=meshvol-drbdvm-$$
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
nsx() { ip netns exec "$NS" "$@"; }

ip netns add "$NS"
nsx ip link set lo up
nsx ip link add br0 type bridge
nsx ip addr add 10.99.0.254/24 dev br0
nsx ip link set br0 up
# kube-apiserver and etcd (the product suite) refuse to start without a
# default route to pick their advertised address from; nothing is routed
# out of the namespace through it.
nsx ip route add default dev br0
for n in "${nodes[@]}"; do
	nsx ip tuntap add dev "tap-$n" mode tap
	nsx ip link set "tap-$n" master br0
	nsx ip link set "tap-$n" up
done

echo "vm-test-drbd: booting ${nodes[*]} (software emulation) in network namespace $NS; logs in $RUN/"
boot=$SECONDS
spec=""
for i in 1 2 3; do
	n=${nodes[i - 1]}
	disk=()
	diskful=no
	if [[ -f $RUN/$n.img ]]; then
		disk=(-drive "file=$RUN/$n.img,if=virtio,format=raw,cache=unsafe")
		diskful=yes
	fi
	if [[ -f $RUN/$n.thin.img ]]; then
		disk+=(-drive "file=$RUN/$n.thin.img,if=virtio,format=raw,cache=unsafe")
	fi
	# ip netns exec execs timeout, so $! is timeout itself: killing it (on
	# any exit) passes the signal on to qemu. Through the nsx function, $!
	# would be a subshell whose death leaves qemu running.
	ip netns exec "$NS" timeout -k 10 "${VM_TIMEOUT:-3600}" qemu-system-x86_64 \
		-accel tcg -cpu max -m "$mem" -smp 1 \
		-kernel "$OUT/vmlinuz" -initrd "$RUN/initrd.cpio" \
		-append "console=ttyS0 panic=-1 loglevel=4 no_timer_check MESHVOL_VM_NODE=$n MESHVOL_VM_IP=10.99.0.$i MESHVOL_VM_DISK=$diskful MESHVOL_VM_PRODUCT=$([[ $suite == product ]] && echo yes || echo no)" \
		"${disk[@]}" \
		-netdev "tap,id=net0,ifname=tap-$n,script=no,downscript=no" \
		-device "virtio-net-pci,netdev=net0,mac=52:54:00:99:00:0$i" \
		-display none -monitor none -no-reboot \
		-serial "file:$RUN/$n.console.log" -serial "file:$RUN/$n.agent.log" &
	pids+=($!)
	spec+="${spec:+,}$n=10.99.0.$i"
done

test_rc=0
product_env=()
results=("$RUN/result.txt")
if [[ $suite == product ]]; then
	product_env=(MESHVOL_VM_PRODUCT="$ROOT/$RUN/payload/meshvol/meshvol")
	# The scenario list's drbdsim pass runs beside the guests' tests, in
	# its own process (TestProductOnDrbdsim, test/vm/drbd/product_boot_test.go):
	# in the tier's process it held up the tests on the guests until it
	# ended. Its record goes to sim-record.json, which TestProduct compares
	# with the guests' run once both have ended; sim-record.json.rc says
	# that the pass has ended. It runs in the namespace (its own mount
	# namespace: its ext4 mounts stay there) with its own control plane.
	# With VM_RUN the tier's process runs it when the pattern asks.
	if [[ -z ${VM_RUN:-} ]]; then
		product_env+=(MESHVOL_VM_SIM_RECORD="$ROOT/$RUN/sim-record.json")
		results+=("$RUN/sim-result.txt")
		(
			rc=0
			nsx env MESHVOL_VM_SIM_RECORD="$ROOT/$RUN/sim-record.json" "$RUN/payload/meshvol/drbd.test" -test.v \
				-test.timeout "${VM_TEST_TIMEOUT:-50m}" -test.run '^TestProductOnDrbdsim$' >"$RUN/sim-result.txt" 2>&1 || rc=$?
			echo "$rc" >"$RUN/sim-record.json.rc"
		) &
		sim_pid=$!
	fi
fi
nsx env MESHVOL_VM_DRBD="$spec" MESHVOL_VM_DRBD_OUT="$RUN" MESHVOL_VM_CONTRACT_RUNS="${VM_CONTRACT_RUNS:-1}" "${product_env[@]}" \
	"$RUN/payload/meshvol/drbd.test" -test.v -test.timeout "${VM_TEST_TIMEOUT:-50m}" \
	${VM_RUN:+-test.run "$VM_RUN"} 2>&1 | tee "$RUN/result.txt" || test_rc=$?
if [[ -n ${sim_pid:-} ]]; then
	# TestProduct waited for it unless the tier failed before; then it is
	# waited for here (killed, it would leave its control plane behind; it
	# has its own time limit).
	wait "$sim_pid" || true
	sim_rc=$(cat "$RUN/sim-record.json.rc" 2>/dev/null || echo "none")
	echo "vm-test-drbd: the drbdsim pass (its own process, output in $RUN/sim-result.txt) ended with exit code $sim_rc"
	grep -E '^(=== RUN|--- |\s+--- |product-vm:|FAIL|PASS|ok )' "$RUN/sim-result.txt" | grep -v '^=== RUN' || true
	if [[ $sim_rc != 0 ]] && ((test_rc == 0)); then test_rc=1; fi
fi

# The test binary has saved each guest's kernel log and asked it to power
# off; nothing in a guest outlives the run (its disks are this run's fresh
# files), so the guests are killed now rather than waited for: under
# emulation a power-off took up to a minute.
cleanup
pids=()
for n in "${nodes[@]}"; do tr -d '\r' <"$RUN/$n.agent.log" >"$RUN/$n.agent.txt" 2>/dev/null || true; done

passed=$(cat "${results[@]}" | grep -c -E '^[[:space:]]*--- PASS:' || true)
failed=$(cat "${results[@]}" | grep -c -E '^[[:space:]]*--- FAIL:' || true)
skipped=$(cat "${results[@]}" | grep -c -E '^[[:space:]]*--- SKIP:' || true)
if ((test_rc != 0)) && ((failed == 0)); then
	failed=1 # the binary failed outside a test (setup, timeout, panic)
	for n in "${nodes[@]}"; do
		echo "--- last lines of $n's console and agent log:" >&2
		tail -n 5 "$RUN/$n.console.log" "$RUN/$n.agent.txt" >&2 || true
	done
fi
echo "vm-test-drbd: modules ${t_module}s, image ${t_image}s, guests and tests $((SECONDS - boot))s, whole run $((SECONDS - start))s"
echo "test-drbd-vm: $passed passed, $failed failed, $skipped skipped"
((test_rc == 0))
