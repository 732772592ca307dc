#!/usr/bin/env bash
# Renders charts/meshvol with its default values into deploy/meshvol.yaml: the plain
# manifests for users who do not use Helm. `make verify` fails when they are stale.
# Uses bin/k8s/helm (hack/build-k8s.sh builds it from its Go module).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
HELM=${HELM:-bin/k8s/helm}
[[ -x "$HELM" ]] || { echo "render-manifests: $HELM is missing: run make k8s" >&2; exit 1; }

out=deploy/meshvol.yaml
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
{
	echo "# meshvol: the chart charts/meshvol rendered with its default values into the"
	echo "# namespace meshvol-system (hack/render-manifests.sh; do not edit, run make manifests)."
	echo "#"
	echo "#   kubectl apply --server-side -f deploy/meshvol.yaml"
	echo "---"
	echo "apiVersion: v1"
	echo "kind: Namespace"
	echo "metadata:"
	echo "  name: meshvol-system"
	"$HELM" template meshvol charts/meshvol --namespace meshvol-system --include-crds --kube-version v1.33.13
} >"$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "render-manifests: wrote $out ($(grep -c '^kind:' "$out") objects)"
