package modelcheck

import (
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/meshvol/meshvol/pkg/datamesh"
)

// FuzzProcess runs the real engine on random schema-valid inputs
// (FuzzInput) and checks that Process
//   - never panics;
//   - on error leaves the status untouched (the API's promise);
//   - is deterministic: the same input gives the same status and result;
//   - never breaks a static invariant the input status kept: q/qmr against
//     the effective layout (I2), at most one attached member without
//     multiattach (I4), unique node-ids, members ↔ transitions consistency;
//     an input that already breaks one of these is garbage the engine
//     need not repair, but it must not break the others;
//   - never lowers the revision or changes the datamesh without a new one.
func FuzzProcess(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, shadow := range []bool{false, true} {
			// Go's fuzzer has no per-input timeout: an input on which
			// Process never returns would stall the run silently. A
			// watchdog turns it into a failure the fuzzer records.
			done := make(chan []string, 1)
			go func() {
				ft := &fuzzT{}
				defer func() {
					if r := recover(); r != nil && r != errFuzzFatal {
						ft.msgs = append(ft.msgs, fmt.Sprintf("panic: %v\n%s", r, debug.Stack()))
					}
					done <- ft.msgs
				}()
				checkProcessOnce(ft, data, shadow)
			}()
			select {
			case msgs := <-done:
				if len(msgs) > 0 {
					t.Fatal(strings.Join(msgs, "\n"))
				}
			case <-time.After(processTimeout):
				t.Fatalf("shadow=%v: Process did not return within %s (endless loop?) on input %q", shadow, processTimeout, data)
			}
		}
	})
}

// processTimeout is far above any sane Process call (milliseconds).
const processTimeout = 20 * time.Second

// fuzzT collects failures of checkProcessOnce, which runs on a goroutine
// of its own (testing.T's Fatal must not be called there).
type fuzzT struct{ msgs []string }

var errFuzzFatal = errors.New("fuzz check failed")

func (f *fuzzT) Fatalf(format string, a ...any) {
	f.msgs = append(f.msgs, fmt.Sprintf(format, a...))
	panic(errFuzzFatal)
}

type fataler interface {
	Fatalf(format string, a ...any)
}

func checkProcessOnce(t fataler, data []byte, shadow bool) {
	in := FuzzInput(data)
	before := in.RV.Status.DeepCopy()
	in2 := FuzzInput(data)

	eng := datamesh.NewEngine(nil, datamesh.Features{ShadowDiskful: shadow})
	res, err := processNoPanic(t, eng, in)
	if err != nil {
		if !equality.Semantic.DeepEqual(before, &in.RV.Status) {
			t.Fatalf("Process returned %v and still changed the status", err)
		}
		return
	}
	// Determinism: a fresh engine on an identical input.
	res2, err2 := processNoPanic(t, datamesh.NewEngine(nil, datamesh.Features{ShadowDiskful: shadow}), in2)
	if err2 != nil || !equality.Semantic.DeepEqual(&in.RV.Status, &in2.RV.Status) || res.Revision != res2.Revision ||
		res.Changed != res2.Changed || !reflect.DeepEqual(res.Wanted, res2.Wanted) {
		t.Fatalf("Process is not deterministic: err %v / %v\nfirst:  %+v\nsecond: %+v", err, err2, in.RV.Status, in2.RV.Status)
	}
	broken := map[string]bool{}
	for _, v := range CheckStatus(nil, before) {
		broken[v.Invariant] = true
	}
	for _, v := range CheckStatus(before, &in.RV.Status) {
		if v.Invariant == InvRevision || !broken[v.Invariant] {
			t.Fatalf("shadow=%v: %v\ninput status:  %+v\noutput status: %+v", shadow, v, before, &in.RV.Status)
		}
	}
}

func processNoPanic(t fataler, eng *datamesh.Engine, in *datamesh.Input) (res datamesh.Result, err error) {
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Process panicked: %v\n%s", r, debug.Stack())
		}
	}()
	return eng.Process(in)
}

// fuzzSeeds are starting points: empty (a fresh volume), and byte patterns
// that decode to formed-looking volumes with transitions, requests,
// replicas and attachments.
func fuzzSeeds() [][]byte {
	seeds := [][]byte{nil, {1}, {0xff, 0xff, 0xff, 0xff}}
	for i := 0; i < 24; i++ {
		b := make([]byte, 160)
		for j := range b {
			b[j] = byte((i*37 + j*11 + j*j*3) % 251)
		}
		seeds = append(seeds, b)
	}
	return seeds
}

// TestFuzzInputValid checks the decoder's promise on the seeds and random
// bytes: enums and ranges as the API schema says.
func TestFuzzInputValid(t *testing.T) {
	for i, seed := range fuzzSeeds() {
		in := FuzzInput(seed)
		st := &in.RV.Status
		for _, m := range st.Datamesh.Members {
			if m.NodeID < 0 || m.NodeID > 31 {
				t.Fatalf("seed %d: node-id %d", i, m.NodeID)
			}
		}
		if st.Datamesh.Quorum < 0 || st.Datamesh.Quorum > 32 || st.Datamesh.QuorumMinimumRedundancy < 0 || st.Datamesh.QuorumMinimumRedundancy > 32 {
			t.Fatalf("seed %d: q/qmr out of range", i)
		}
		c := in.RV.Spec.ManualConfiguration
		if c.FailuresToTolerate > c.GuaranteedMinimumDataRedundancy+1 || c.FailuresToTolerate > 2 || c.GuaranteedMinimumDataRedundancy > 2 {
			t.Fatalf("seed %d: configuration %d/%d breaks the CEL rule", i, c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy)
		}
		seen := map[string]bool{}
		for _, r := range st.DatameshReplicaRequests {
			if seen[r.Name] {
				t.Fatalf("seed %d: request list map key %s twice", i, r.Name)
			}
			seen[r.Name] = true
		}
	}
}
