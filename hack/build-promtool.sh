#!/usr/bin/env bash
# Builds Prometheus' promtool from its Go module into bin/promtool, for
# test/monitoring: `promtool check rules` and `promtool test rules` on the chart's
# alerts. Pinned to the version below; built without service discovery (the
# remove_all_sd build tag of github.com/prometheus/prometheus/plugins), which rule
# checks never use and which is a fifth of the packages. Nothing is downloaded
# but from the Go module proxy.
#
# Idempotent: bin/.promtool.stamp records what the binary was built from (module,
# version, tags, Go version); a matching stamp leaves it alone (0.1 s). Times:
# docs/benchmarks.md, "promtool".
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROMTOOL_MODULE=github.com/prometheus/prometheus
PROMTOOL_VERSION=v0.316.0
TAGS=remove_all_sd
OUT=$ROOT/bin/promtool
STAMP=$ROOT/bin/.promtool.stamp

key="$PROMTOOL_MODULE@$PROMTOOL_VERSION tags=$TAGS go=$(go env GOVERSION)"
if [[ -x $OUT && -f $STAMP && $(<"$STAMP") == "$key" ]]; then
	echo "promtool: up to date ($key)"
	exit 0
fi
echo "promtool: go install $PROMTOOL_MODULE/cmd/promtool@$PROMTOOL_VERSION -tags $TAGS (cold: minutes, see docs/benchmarks.md)"
start=$SECONDS
mkdir -p "$ROOT/bin"
# GOWORK and GOFLAGS of the caller would apply to the pinned module too.
GOWORK=off GOFLAGS= GOBIN=$ROOT/bin go install -tags "$TAGS" -ldflags=-s "$PROMTOOL_MODULE/cmd/promtool@$PROMTOOL_VERSION"
"$OUT" --version >/dev/null
printf '%s' "$key" >"$STAMP"
echo "promtool: built in $((SECONDS - start)) s"
