#!/usr/bin/env bash
# Runs Go fuzz targets, each for FUZZTIME (default 30s), one after another
# (go test -fuzz takes one target at a time).
#
#   hack/fuzz.sh                            every func FuzzX in a _test.go file
#   hack/fuzz.sh ./pkg/drbd:FuzzParseEvent  only the named PKG:FuzzName targets
#
# Discovery reads the source instead of `go test -list`, which would build
# every test binary and run every TestMain (some start a control plane).
# New crashers land in the package's testdata/fuzz/, as go test does. Minimising a
# new input is capped at FUZZMINIMIZETIME (default 5s): uncapped, a slow target
# (the engine's FuzzProcess) spends its whole budget minimising and looks stalled.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
FUZZTIME=${FUZZTIME:-30s}

targets=("$@")
if ((${#targets[@]} == 0)); then
	while IFS= read -r file; do
		dir=./$(dirname "${file#./}")
		while IFS= read -r name; do
			targets+=("$dir:$name")
		done < <(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' "$file")
	done < <(find . -name '*_test.go' -not -path './bin/*' -not -path './.git/*' -not -path './_output/*' | sort)
fi
if ((${#targets[@]} == 0)); then
	echo "fuzz: no fuzz targets found (func FuzzX in a _test.go file)"
	exit 0
fi

echo "fuzz: ${#targets[@]} targets, $FUZZTIME each"
failed=()
for t in "${targets[@]}"; do
	pkg=${t%%:*} name=${t#*:}
	if [[ "$pkg" == "$t" || -z "$name" ]]; then
		echo "fuzz: target '$t' must be PKG:FuzzName, e.g. ./pkg/drbd:FuzzParseEvent" >&2
		exit 2
	fi
	echo "=== fuzz $pkg $name"
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "${FUZZMINIMIZETIME:-5s}" "$pkg"; then
		failed+=("$t")
	fi
done
echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
	printf '  failed: %s\n' "${failed[@]}"
	exit 1
fi
