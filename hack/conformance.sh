#!/usr/bin/env bash
# `make conformance`: Kubernetes' External Storage suite (bin/conformance/e2e.test,
# `make conformance-build`) against the chart-installed meshvol of a sandbox
# (bin/meshvol-sandbox, `make sandbox`'s), whose nodes have the upstream test
# images the specs run their pods from (bin/conformance/images,
# hack/conformance-images). Passes, each with ginkgo's CLI (bin/conformance/ginkgo):
#
#   parallel  the specs of test/conformance/testdriver.yaml (the default class,
#             2D+1TB) but [Serial] and [Disruptive], CONFORMANCE_PROCS at once
#   serial    its [Serial] specs, one at a time
#   3d        the volumes and provisioning suites once more on the 3D class
#             (testdriver.yaml with the class meshvol-3d), in parallel
#
# (`make conformance-build`'s dry run prints the line `Driver loaded from path` with
# what e2e.test read from the driver file: parallel processes do not print it.)
#
# then hack/conformance-report prints passed/failed/skipped per pass, the
# failures and the skip reasons grouped, into _output/conformance/results.md.
# Specs that cannot run on this kind of machine, whatever the driver, are left
# out by name (NOT_HERE below, each with its reason, which the report lists).
# Environment: CONFORMANCE_PROCS (default 4), CONFORMANCE_PASSES (default
# "parallel serial 3d"), CONFORMANCE_FOCUS (a regexp ANDed with each pass's
# selection), CONFORMANCE_SANDBOX_DIR (default /var/tmp/meshvol-conformance),
# CONFORMANCE_OUT (default _output/conformance).
# Needs root (the sandbox); waits for another sandbox or e2e run on the machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${CONFORMANCE_OUT:-_output/conformance}
PROCS=${CONFORMANCE_PROCS:-4}
PASSES=${CONFORMANCE_PASSES:-parallel serial 3d}
FOCUS=${CONFORMANCE_FOCUS:-}
SBDIR=${CONFORMANCE_SANDBOX_DIR:-/var/tmp/meshvol-conformance}
E2E=bin/conformance/e2e.test
GINKGO=bin/conformance/ginkgo
IMAGES=bin/conformance/images

# NOT_HERE: "regexp|why" (the regexp without "|") — specs this machine cannot run (docs/conformance.md,
# "What is not run, and why"). [Disruptive] specs are left out by label.
NOT_HERE=(
	'volumeMode should not mount / map unused volumes in a pod|the spec lists the pod directory of a node through a privileged pod with `nsenter --mount=/rootfs/proc/1/ns/mnt`: this machine refuses to open PID 1'"'"'s mount namespace even to root (`nsenter: cannot open /rootfs/proc/1/ns/mnt: Permission denied`), and the sandbox'"'"'s nodes share the machine'"'"'s PID namespace, so PID 1 is the machine'"'"'s init, not a node'"'"'s'
	'\(default fs\).*should resize volume when PVC is edited while pod is using it|they grow a mounted ext4 (the default fsType), which needs CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS), and this machine'"'"'s capability bounding set lacks it (CapBnd 000001fffeffffff: bit 24 clear), so no process here, privileged pods included, can: NodeExpandVolume answers FailedPrecondition naming the missing capability, and the file system grows when the volume is next staged. Online growth of block volumes and of xfs (which needs CAP_SYS_ADMIN) runs'
	'\(default fs\).*should support expansion of pvcs created for ephemeral pvcs|they grow a mounted ext4 (the default fsType), which needs CAP_SYS_RESOURCE (EXT4_IOC_RESIZE_FS), and this machine'"'"'s capability bounding set lacks it (CapBnd 000001fffeffffff: bit 24 clear), so no process here, privileged pods included, can: NodeExpandVolume answers FailedPrecondition naming the missing capability, and the file system grows when the volume is next staged. Online growth of block volumes and of xfs (which needs CAP_SYS_ADMIN) runs'
	'should provision storage with any volume data source|needs the images registry.k8s.io/sig-storage/hello-populator:v1.0.1 and volume-data-source-validator:v1.0.0, built from kubernetes-csi Go modules the module proxy refuses (403): no registry and no source to build them from; no driver capability gates the spec'
)
skip=
for n in "${NOT_HERE[@]}"; do skip+="${skip:+|}${n%%|*}"; done

((EUID == 0)) || { echo "conformance: the sandbox needs root" >&2; exit 1; }
log() { printf '[conformance %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
for f in "$E2E" "$GINKGO" bin/meshvol-sandbox "$IMAGES/busybox.tar" "$IMAGES/debian.tar" "$IMAGES/agnhost.tar"; do
	[[ -e $f ]] || { echo "conformance: $f is missing: run \`make conformance\`, which builds it" >&2; exit 1; }
done

rm -rf "$OUT"
mkdir -p "$OUT"
start=$SECONDS
log "starting the sandbox in $SBDIR (log: $OUT/sandbox.log; it waits for another cluster on the machine)"
bin/meshvol-sandbox -dir "$SBDIR" -demo=false -wait \
	-images "$IMAGES/busybox.tar,$IMAGES/debian.tar,$IMAGES/agnhost.tar" >"$OUT/sandbox.log" 2>&1 &
sandbox=$!
stop_sandbox() {
	if kill -0 "$sandbox" 2>/dev/null; then
		log "tearing the sandbox down"
		kill -INT "$sandbox" 2>/dev/null || true
		wait "$sandbox" || true
		tail -n 1 "$OUT/sandbox.log"
	fi
}
trap stop_sandbox EXIT

kubeconfig=
while [[ -z $kubeconfig ]]; do
	if ! kill -0 "$sandbox" 2>/dev/null; then
		tail -n 20 "$OUT/sandbox.log" >&2
		echo "conformance: the sandbox exited before it was up" >&2
		exit 1
	fi
	if grep -q 'the cluster is up until Ctrl-C' "$OUT/sandbox.log"; then
		kubeconfig=$(sed -n 's/^ *export KUBECONFIG=//p' "$OUT/sandbox.log" | head -n 1)
	fi
	sleep 2
done
log "sandbox up ($(grep -o 'meshvol-sandbox: up in [0-9.]*[a-z]*' "$OUT/sandbox.log" | head -n 1), $((SECONDS - start)) s with waiting for the machine's cluster lock)"

# pass NAME DRIVER SELECT PARALLEL: one ginkgo run; its JSON report in $OUT/NAME.
# [Serial] and [Disruptive] are labels as well as words in the specs' names.
pass() {
	local name=$1 driver=$2 select=$3 parallel=$4 focus began=$SECONDS
	focus="External.Storage.*${select}"
	[[ -z $FOCUS ]] || focus="${focus}.*${FOCUS}"
	local args=(--no-color --timeout=4h --output-dir="$OUT/$name" --json-report=report.json --junit-report=junit.xml --focus="$focus" --skip="$skip")
	if [[ $parallel == yes ]]; then
		args+=(-p --procs="$PROCS" --label-filter='!Serial && !Disruptive')
	else
		args+=(--label-filter='Serial && !Disruptive')
	fi
	mkdir -p "$OUT/$name"
	log "pass $name: $GINKGO ${args[*]} (log: $OUT/$name.log)"
	"$GINKGO" "${args[@]}" "$E2E" -- \
		--kubeconfig="$kubeconfig" --kubectl-path="$ROOT/bin/k8s/kubectl" \
		--storage.testdriver="$driver" \
		--report-dir="$ROOT/$OUT/$name" >"$OUT/$name.log" 2>&1 || true
	log "pass $name: done in $((SECONDS - began)) s"
}

for p in $PASSES; do
	case $p in
	parallel) pass parallel "$ROOT/test/conformance/testdriver.yaml" '' yes ;;
	serial) pass serial "$ROOT/test/conformance/testdriver.yaml" '' no ;;
	3d)
		sed 's/^\( *FromExistingClassName:\).*/\1 meshvol-3d/' test/conformance/testdriver.yaml >"$OUT/testdriver-3d.yaml"
		pass 3d "$ROOT/$OUT/testdriver-3d.yaml" '\[Testpattern: [^\]]*\] (volumes|provisioning) ' yes ;;
	*) echo "conformance: unknown pass $p" >&2; exit 2 ;;
	esac
done
stop_sandbox
trap - EXIT
log "all passes done in $((SECONDS - start)) s"

reports=()
for p in $PASSES; do reports+=("$p=$OUT/$p/report.json"); done
notrun=()
for n in "${NOT_HERE[@]}"; do notrun+=(-not-run "$n"); done
GOTOOLCHAIN=local go run ./hack/conformance-report -took $((SECONDS - start)) "${notrun[@]}" "${reports[@]}" | tee "$OUT/results.md"
