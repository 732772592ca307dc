#!/usr/bin/env bash
# Runs `go test -v` over the given packages (default ./...) and prints a
# readable log: the test names with PASS/FAIL/SKIP and whatever tests log,
# without the === RUN and === PAUSE lines, which double the output and say
# nothing a --- line does not. (=== CONT and === NAME stay: they tell whose
# log lines follow when parallel tests interleave.) The full, unfiltered log goes to
# _output/test.log. Closes with "test: N passed, N failed, N skipped",
# counting subtests, and repeats the failing packages and tests last so the
# reason for a red run is at the bottom of the screen.
#
# Environment: TEST_TIMEOUT (per test binary, default 20m); GO_TEST_FLAGS
# (extra flags for go test, e.g. -race or -count=1).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mkdir -p _output
log=_output/test.log
((${#@})) || set -- ./...

echo "go test -v -timeout ${TEST_TIMEOUT:-20m} ${GO_TEST_FLAGS:-} $*   (full log: $log)"
set +e
# shellcheck disable=SC2086 # GO_TEST_FLAGS is a list of flags
go test -v -timeout "${TEST_TIMEOUT:-20m}" ${GO_TEST_FLAGS:-} "$@" 2>&1 |
	tee "$log" |
	grep --line-buffered -v -E '^[[:space:]]*=== (RUN|PAUSE) '
status=${PIPESTATUS[0]}
set -e

count() { grep -c -E "^[[:space:]]*--- $1:" "$log" || true; }

# last_lines_of_failures prints, for each failing test, the last 12 lines it
# logged. go test -v marks whose output follows with "=== RUN", "=== CONT" or
# "=== NAME" lines (parallel tests interleave), so each line belongs to the test
# the latest marker names; a package's "ok"/"FAIL" line ends its tests.
last_lines_of_failures() {
	awk -v keep=12 '
		function flush(   t, i, n) {
			for (t in failed) {
				n = count[t]
				print "--- " t
				for (i = (n > keep ? n - keep : 0); i < n; i++) print lines[t, i % keep]
			}
			delete failed; delete count; delete lines
		}
		/^=== (RUN|CONT|NAME) / { cur = $3; next }
		/^=== PAUSE / { next }
		/^[[:space:]]*--- FAIL: / { failed[$3] = 1; next }
		/^[[:space:]]*--- (PASS|SKIP): / || /^(PASS|FAIL)$/ { next }
		/^(ok|FAIL)[[:space:]]+[^[:space:]]+[[:space:]]/ { flush(); cur = ""; next }
		cur != "" { lines[cur, count[cur] % keep] = $0; count[cur]++ }
		END { flush() }
	' "$1"
}
passed=$(count PASS) failed=$(count FAIL) skipped=$(count SKIP)
if ((status != 0)); then
	echo
	echo "Failures:"
	grep -E '^[[:space:]]*--- FAIL:|^FAIL[[:space:]]|^ok .*\[no tests to run\]|\[build failed\]|\[setup failed\]' "$log" || true
	# The last lines each failing test logged — its error is among them — so
	# that the reason survives a console that keeps only the run's head and tail.
	echo
	echo "What the failing tests logged last (full log: $log):"
	last_lines_of_failures "$log"
	# A package that fails before running a test (build error, TestMain
	# refusing to start) has no --- FAIL line; count it so the summary
	# never says "0 failed" for a red run.
	pkgfails=$(grep -c -E '^FAIL[[:space:]]+[^[:space:]]+[[:space:]]' "$log" || true)
	if ((failed == 0)); then
		failed=$pkgfails
		((failed > 0)) || failed=1
	fi
fi
echo "test: $passed passed, $failed failed, $skipped skipped"
exit "$status"
