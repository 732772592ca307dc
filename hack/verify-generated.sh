#!/usr/bin/env bash
# Fails when `make generate` changes, adds or removes a generated file: the
# deepcopy code (zz_generated.*.go) or the CRDs in config/crd no longer match
# the types in pkg/apis; the chart's copy of the CRDs or the rendered
# manifests in deploy/ are stale (make manifests). It compares checksums taken before and after, so it
# gives the same answer in a clean clone (where it equals `git diff`) and in
# a work tree with uncommitted edits to the types.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

snapshot() {
	{
		find config/crd pkg/apis charts/meshvol/crds -type f \( -name '*.yaml' -path 'config/crd/*' -o -name '*.yaml' -path 'charts/meshvol/crds/*' -o -name 'zz_generated*.go' \) 2>/dev/null
		find deploy -maxdepth 1 -type f -name '*.yaml' 2>/dev/null
	} | sort | xargs -r sha256sum
}

before=$(mktemp) after=$(mktemp)
trap 'rm -f "$before" "$after"' EXIT
snapshot >"$before"
make --no-print-directory generate
make --no-print-directory manifests
snapshot >"$after"

if ! diff -u "$before" "$after" >/dev/null; then
	echo "verify: make generate changed generated files; run it and include the result:"
	diff "$before" "$after" | sed -n 's/^[<>] [0-9a-f]*  //p' | sort -u | sed 's/^/  /'
	exit 1
fi
echo "verify: generated files are up to date ($(wc -l <"$after") files)"
