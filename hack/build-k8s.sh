#!/usr/bin/env bash
# Builds the real Kubernetes control plane and CSI sidecars that meshvol's
# integration, sanity and e2e tests run against, from their Go modules, into
# bin/k8s/:
#
#   kube-apiserver kube-controller-manager kube-scheduler   k8s.io/kubernetes
#   kubelet kubectl                                         k8s.io/kubernetes
#   etcd                                                    go.etcd.io/etcd/server/v3
#   csi-sanity                                              kubernetes-csi/csi-test/v5
#   csi-provisioner csi-attacher csi-snapshotter snapshot-controller
#   crds/*.yaml (VolumeSnapshot CRDs)                       external-snapshotter/client/v8
#   helm                                                    helm.sh/helm/v3
#   monitoring-crds/ (ServiceMonitor, PrometheusRule CRDs)  prometheus-operator
#
# Nothing is downloaded from anywhere but the Go module proxy. Most of these
# modules cannot be `go install`ed (their go.mod has replace directives), so
# each is built inside a throwaway wrapper module written by hack/wrapmod
# under bin/k8s/.build/ (see that program for the rules).
#
# Idempotent: every output has a stamp recording what it was built from
# (module, version, Go version, linker flags); an output whose stamp matches is
# left alone. A cold build takes minutes (see README); a warm run, seconds.
#
# Environment: K8S_BIN_DIR overrides the output directory.
#
# external-resizer and node-driver-registrar are not built: the module proxy
# refuses them (403), so meshvol's tests exercise expansion through the CSI
# RPCs directly, and the node plugin serves the kubelet's plugin registration
# API itself (pkg/pluginreg).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${K8S_BIN_DIR:-$ROOT/bin/k8s}
WORK=$OUT/.build
STAMPS=$OUT/.stamps

K8S_MODULE=k8s.io/kubernetes
K8S_VERSION=v1.33.13
ETCD_MODULE=go.etcd.io/etcd/server/v3
ETCD_VERSION=v3.5.21
CSI_TEST_MODULE=github.com/kubernetes-csi/csi-test/v5
CSI_TEST_VERSION=v5.6.0
PROVISIONER_MODULE=github.com/kubernetes-csi/external-provisioner/v5
PROVISIONER_VERSION=v5.3.0
ATTACHER_MODULE=github.com/kubernetes-csi/external-attacher/v4
ATTACHER_VERSION=v4.13.0
SNAPSHOTTER_MODULE=github.com/kubernetes-csi/external-snapshotter/v8
SNAPSHOTTER_CLIENT_MODULE=github.com/kubernetes-csi/external-snapshotter/client/v8
SNAPSHOTTER_VERSION=v8.7.0
# Helm renders and lints charts/meshvol in the packaging tests; v3.18 is the
# release built against k8s.io/* v0.33, the API version go.mod pins.
HELM_MODULE=helm.sh/helm/v3
HELM_VERSION=v3.18.6
# The ServiceMonitor and PrometheusRule CRDs, so the chart's monitoring objects can be checked by the
# apiserver in the packaging tests (no prometheus-operator runs).
PROMOP_MODULE=github.com/prometheus-operator/prometheus-operator
PROMOP_VERSION=v0.80.1

# The toolchain on the machine is the one we use: never fetch another.
# CGO off: static binaries, and no C compiler work on 2 shared cores.
export GOTOOLCHAIN=local CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

GO_VERSION=$(go env GOVERSION)
mkdir -p "$OUT" "$WORK" "$STAMPS"

log() { printf '[build-k8s %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# Several people and `make test` runs share one checkout: two builds writing
# the same wrapper modules and binaries at once would corrupt both. The
# second waits, then finds the first one's stamps and has nothing to do.
exec 9>"$OUT/.lock"
if ! flock -n 9; then
	log "another hack/build-k8s.sh is building into ${OUT#"$ROOT"/}; waiting for it"
	flock 9
fi

# stamp_ok NAME KEY: true when bin/k8s/NAME exists and was built from KEY.
stamp_ok() {
	[[ -e "$OUT/$1" && -f "$STAMPS/$1" && "$(<"$STAMPS/$1")" == "$2" ]]
}

# Binaries that answer their version differently from the rest of their group:
# kubectl has no --version, and without --client it would dial a server.
declare -A VERSION_ARGS=([kubectl]="version --client")
declare -A VERSION_WANT=([kubectl]="Client Version: $K8S_VERSION")

# check_version BINARY WANT FLAG: the freshly built binary must print WANT
# when asked for its version, or the build failed (a missing -X gives
# "v0.0.0-master" or "unknown", which would mislead every test log).
# VERSION_ARGS and VERSION_WANT override FLAG and WANT per binary.
check_version() {
	local bin=$1 want=$2 flag=$3 got name
	name=$(basename "$bin")
	flag=${VERSION_ARGS[$name]:-$flag}
	want=${VERSION_WANT[$name]:-$want}
	# shellcheck disable=SC2086 # an override is a list of arguments
	got=$("$bin" $flag 2>&1 | head -n 3) || true
	if [[ "$got" != *"$want"* ]]; then
		log "ERROR: $(basename "$bin") $flag printed '$got', want it to contain '$want'"
		return 1
	fi
	log "  $(basename "$bin") $flag: $(head -n 1 <<<"$got")"
}

# build_wrapped GROUP MODULE VERSION LDFLAGS WANT_VERSION VERSION_FLAG NAME=PKG...
# builds each stale NAME from PKG inside a wrapper module of MODULE@VERSION,
# all stale binaries of one group in a single `go build` so shared packages
# compile once.
build_wrapped() {
	local group=$1 module=$2 version=$3 ldflags=$4 want=$5 vflag=$6
	shift 6
	local key="$module@$version go=$GO_VERSION ldflags=$ldflags"
	local stale=() spec name pkg
	for spec in "$@"; do
		name=${spec%%=*}
		if stamp_ok "$name" "$key"; then
			log "$name: up to date ($module@$version)"
		else
			stale+=("$spec")
		fi
	done
	((${#stale[@]})) || return 0

	local dir=$WORK/$group start=$SECONDS
	log "$group: writing wrapper module for $module@$version in ${dir#"$ROOT"/}"
	(cd "$ROOT" && go run ./hack/wrapmod -dir "$dir" -module "$module" -version "$version")
	rm -rf "$dir/out"
	mkdir -p "$dir/out"
	for spec in "${stale[@]}"; do
		name=${spec%%=*} pkg=${spec#*=}
		log "$group: building $name from $pkg"
		# One package per go build -o FILE: etcd's main package is the module
		# root, whose last path element (v3) would otherwise name the binary.
		# The group's packages share the build cache, so the second and later
		# builds only compile what is theirs.
		(cd "$dir" && go build -mod=mod -trimpath -ldflags "-s -w $ldflags" -o "out/$name" "$pkg")
	done
	for spec in "${stale[@]}"; do
		name=${spec%%=*}
		check_version "$dir/out/$name" "$want" "$vflag"
		mv -f "$dir/out/$name" "$OUT/$name"
		printf '%s' "$key" >"$STAMPS/$name"
	done
	log "$group: built ${#stale[@]} binaries in $((SECONDS - start)) s"
}

k8s_ldflags() {
	local v=$1 minor
	minor=$(cut -d. -f2 <<<"$v")
	local f="" pkg
	# Both packages carry a copy of the version: component-base for the
	# binaries' --version and /version, client-go for their user agent.
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	echo "${f# }"
}

total_start=$SECONDS
log "output: ${OUT#"$ROOT"/}, $GO_VERSION, GOTOOLCHAIN=local, CGO_ENABLED=0"

build_wrapped etcd "$ETCD_MODULE" "$ETCD_VERSION" "" "etcd Version: ${ETCD_VERSION#v}" --version \
	"etcd=$ETCD_MODULE"

# kubelet and kubectl are for the sandbox and the e2e suite (internal/kubecluster):
# the same wrapper module, so one version across the cluster.
build_wrapped kubernetes "$K8S_MODULE" "$K8S_VERSION" "$(k8s_ldflags "$K8S_VERSION")" "Kubernetes $K8S_VERSION" --version \
	"kube-apiserver=$K8S_MODULE/cmd/kube-apiserver" \
	"kube-controller-manager=$K8S_MODULE/cmd/kube-controller-manager" \
	"kube-scheduler=$K8S_MODULE/cmd/kube-scheduler" \
	"kubelet=$K8S_MODULE/cmd/kubelet" \
	"kubectl=$K8S_MODULE/cmd/kubectl"

build_wrapped external-provisioner "$PROVISIONER_MODULE" "$PROVISIONER_VERSION" "-X main.version=$PROVISIONER_VERSION" "$PROVISIONER_VERSION" --version \
	"csi-provisioner=$PROVISIONER_MODULE/cmd/csi-provisioner"

build_wrapped external-attacher "$ATTACHER_MODULE" "$ATTACHER_VERSION" "-X main.version=$ATTACHER_VERSION" "$ATTACHER_VERSION" --version \
	"csi-attacher=$ATTACHER_MODULE/cmd/csi-attacher"

build_wrapped external-snapshotter "$SNAPSHOTTER_MODULE" "$SNAPSHOTTER_VERSION" "-X main.version=$SNAPSHOTTER_VERSION" "$SNAPSHOTTER_VERSION" --version \
	"csi-snapshotter=$SNAPSHOTTER_MODULE/cmd/csi-snapshotter" \
	"snapshot-controller=$SNAPSHOTTER_MODULE/cmd/snapshot-controller"

# csi-sanity's go.mod has no replace directives, so plain go install works.
sanity_ldflags="-X main.VERSION=$CSI_TEST_VERSION"
sanity_key="$CSI_TEST_MODULE@$CSI_TEST_VERSION go=$GO_VERSION ldflags=$sanity_ldflags"
if stamp_ok csi-sanity "$sanity_key"; then
	log "csi-sanity: up to date ($CSI_TEST_MODULE@$CSI_TEST_VERSION)"
else
	start=$SECONDS
	log "csi-sanity: go install $CSI_TEST_MODULE/cmd/csi-sanity@$CSI_TEST_VERSION"
	rm -rf "$WORK/csi-sanity"
	GOBIN=$WORK/csi-sanity go install -trimpath -ldflags "-s -w $sanity_ldflags" "$CSI_TEST_MODULE/cmd/csi-sanity@$CSI_TEST_VERSION"
	check_version "$WORK/csi-sanity/csi-sanity" "$CSI_TEST_VERSION" --version
	mv -f "$WORK/csi-sanity/csi-sanity" "$OUT/csi-sanity"
	printf '%s' "$sanity_key" >"$STAMPS/csi-sanity"
	log "csi-sanity: built in $((SECONDS - start)) s"
fi

# helm's go.mod has no replace directives either.
helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
helm_key="$HELM_MODULE@$HELM_VERSION go=$GO_VERSION ldflags=$helm_ldflags"
if stamp_ok helm "$helm_key"; then
	log "helm: up to date ($HELM_MODULE@$HELM_VERSION)"
else
	start=$SECONDS
	log "helm: go install $HELM_MODULE/cmd/helm@$HELM_VERSION"
	rm -rf "$WORK/helm"
	GOBIN=$WORK/helm go install -trimpath -ldflags "-s -w $helm_ldflags" "$HELM_MODULE/cmd/helm@$HELM_VERSION"
	check_version "$WORK/helm/helm" "$HELM_VERSION" version
	mv -f "$WORK/helm/helm" "$OUT/helm"
	printf '%s' "$helm_key" >"$STAMPS/helm"
	log "helm: built in $((SECONDS - start)) s"
fi

# The VolumeSnapshot CRDs that csi-snapshotter and snapshot-controller serve,
# from the client module of the same release (the module cache is read-only,
# hence install -m).
crds_key="$SNAPSHOTTER_CLIENT_MODULE@$SNAPSHOTTER_VERSION config/crd"
if stamp_ok crds "$crds_key"; then
	log "crds: up to date ($SNAPSHOTTER_CLIENT_MODULE@$SNAPSHOTTER_VERSION)"
else
	client_dir=$(go mod download -json "$SNAPSHOTTER_CLIENT_MODULE@$SNAPSHOTTER_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	if [[ -z "$client_dir" || ! -d "$client_dir/config/crd" ]]; then
		log "ERROR: no config/crd in $SNAPSHOTTER_CLIENT_MODULE@$SNAPSHOTTER_VERSION (dir '$client_dir')"
		exit 1
	fi
	rm -rf "$OUT/crds"
	mkdir -p "$OUT/crds"
	n=0
	for f in "$client_dir"/config/crd/*.yaml; do
		[[ "$(basename "$f")" == kustomization.yaml ]] && continue
		install -m 0644 "$f" "$OUT/crds/"
		n=$((n + 1))
	done
	printf '%s' "$crds_key" >"$STAMPS/crds"
	log "crds: copied $n CRDs from $SNAPSHOTTER_CLIENT_MODULE@$SNAPSHOTTER_VERSION"
fi

promop_key="$PROMOP_MODULE@$PROMOP_VERSION servicemonitors prometheusrules"
if stamp_ok monitoring-crds "$promop_key"; then
	log "monitoring-crds: up to date ($PROMOP_MODULE@$PROMOP_VERSION)"
else
	promop_dir=$(go mod download -json "$PROMOP_MODULE@$PROMOP_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
	rm -rf "$OUT/monitoring-crds"
	mkdir -p "$OUT/monitoring-crds"
	for kind in servicemonitors prometheusrules; do
		f="$promop_dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml"
		if [[ ! -f "$f" ]]; then
			log "ERROR: no $kind CRD in $PROMOP_MODULE@$PROMOP_VERSION (looked for $f)"
			exit 1
		fi
		install -m 0644 "$f" "$OUT/monitoring-crds/"
	done
	printf '%s' "$promop_key" >"$STAMPS/monitoring-crds"
	log "monitoring-crds: copied the ServiceMonitor and PrometheusRule CRDs from $PROMOP_MODULE@$PROMOP_VERSION"
fi

log "done in $((SECONDS - total_start)) s"
