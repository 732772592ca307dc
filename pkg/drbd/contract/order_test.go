package contract_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// recordingHarness keeps what contract.Run reports through
// contract.Recorder.
type recordingHarness struct {
	*simHarness
	changes map[string][]string
}

func (h *recordingHarness) Record(node string, changes []string) { h.changes[node] = changes }

// realRecording is every state change each node's events2 showed while
// this suite ran on three machines with DRBD 9.2.18 (kernel 6.1, drbd-utils
// 9.22), ExecDriver and the rendered .res files, one file per node.
const realRecording = "testdata/real-drbd-9.2.18/"

// comparedPrefix is how many of a node's recorded state changes drbdsim
// must reproduce exactly, in order, every line. Beyond it the order is
// not comparable, by design or by timing, and tailPatterns take over:
//   - node1, node2: the recording stops matching at stage 05's heal. The
//     suite then brought node3 up at once and node3 connected before the
//     healed pair's next connect attempt (connect-int); the suite now waits
//     for node1 and node2 to reconnect first (the race test/vm/FINDINGS.md describes),
//     so the order of the reconnections differs from the recording by
//     design, and so does what follows from it (node2 outdated through
//     node3). Stage 06 cuts two links at once; on real DRBD both failures
//     arrive before either's aftermath, drbdsim cuts one after the other.
//   - node3: at its second up (stage 05) real DRBD reported quorum:yes with
//     its second connection (node2), drbdsim with the first (node1, a
//     quorate UpToDate Primary). A remaining difference.
var comparedPrefix = map[string]int{"node1": 65, "node2": 67, "node3": 82}

// tailPatterns must appear, in order (not necessarily adjacent), after
// the compared prefix in the recording and in drbdsim's run: the
// transitions whose order matters to whoever reads the stream.
var tailPatterns = map[string][][]string{
	"node1": {{ // stage 06: node2 cut off and back, resynced from node1
		"connection node2 connection:NetworkFailure", "path node2 established:no", "call helper:disconnected",
		"connection node2 connection:Connecting", "path node2 established:yes", "connection node2 connection:Connected",
		"peer-device node2 replication:WFBitMapS", "call helper:before-resync-source", "peer-device node2 replication:SyncSource",
		"peer-device node2 peer-disk:Inconsistent", "peer-device node2 replication:Established", "peer-device node2 peer-disk:UpToDate",
	}},
	"node2": {
		{ // stage 05: back with the Primary
			"path node1 established:yes", "connection node1 connection:Connected", "connection node1 role:Primary",
			"device quorum:yes", "peer-device node1 replication:Established", "peer-device node1 peer-disk:UpToDate",
		},
		{ // stage 06: a Secondary losing its Primary passes through Consistent
			"connection node1 connection:NetworkFailure", "connection node1 role:Unknown", "device disk:Consistent",
			"peer-device node1 replication:Off", "peer-device node1 peer-disk:DUnknown", "device disk:UpToDate",
			"path node1 established:no", "call helper:disconnected", "connection node1 connection:Connecting",
		},
		{ // stage 06: the resync as SyncTarget
			"path node1 established:yes", "connection node1 connection:Connected", "peer-device node1 replication:WFBitMapT",
			"call helper:before-resync-target", "device disk:Inconsistent", "peer-device node1 replication:SyncTarget",
			"call helper:after-resync-target", "device disk:UpToDate", "peer-device node1 replication:Established",
		},
	},
	"node3": {{ // stage 06: node2 away and back; its resync seen by a third node
		"connection node2 connection:NetworkFailure", "path node2 established:no", "call helper:disconnected",
		"connection node2 connection:Connecting", "path node2 established:yes", "connection node2 connection:Connected",
		"peer-device node2 peer-disk:Inconsistent", "peer-device node2 peer-disk:Consistent", "peer-device node2 peer-disk:UpToDate",
	}},
}

// drbdsim's events2, for the whole contract suite, in the order DRBD
// 9.2.18 printed them (the differences test/vm/FINDINGS.md lists: connections before the
// disk at up, WFBitMapT before Inconsistent, the resync helpers, the
// Consistent blip, down without destroying peer devices, may_promote).
func TestEventOrderMatchesRealDRBD(t *testing.T) {
	h := &recordingHarness{simHarness: newSimHarness(t), changes: map[string][]string{}}
	contract.Run(t, h)
	for _, node := range contract.Nodes {
		b, err := os.ReadFile(realRecording + node + ".seq")
		if err != nil {
			t.Fatal(err)
		}
		real := strings.Split(strings.TrimSpace(string(b)), "\n")
		got := h.changes[node]
		n := comparedPrefix[node]
		if len(got) < n {
			t.Errorf("%s: drbdsim reported %d state changes, fewer than the %d compared", node, len(got), n)
			continue
		}
		for i := range n {
			if got[i] != real[i] {
				t.Errorf("%s: state change #%d differs from real DRBD\n got: %q\nwant: %q\n (real, from there: %q)",
					node, i+1, got[max(0, i-3):min(n, i+4)], real[max(0, i-3):min(n, i+4)], real[i:min(n, i+8)])
				break
			}
		}
		for _, p := range tailPatterns[node] {
			if !inOrder(real[n:], p) {
				t.Fatalf("%s: pattern not in the recording (the test is wrong): %q", node, p)
			}
			if !inOrder(got[n:], p) {
				t.Errorf("%s: after the compared prefix, drbdsim lacks in order %q\n got: %q", node, p, got[n:])
			}
		}
	}
}

func inOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want) && !slices.Equal(want, nil)
}
