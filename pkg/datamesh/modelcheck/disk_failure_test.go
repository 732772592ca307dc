package modelcheck

import (
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// TestDiskFailures explores a disk that fails after formation (ActDiskFail; the engine
// replaces the member add before remove while another UpToDate copy is connected to
// it: docs/datamesh.md, "A disk that fails after formation") together with a node
// loss, an agent restart and a lost node's return, on the layouts with more than one
// copy, detached and attached; every invariant of docs/modelcheck.md holds on every
// state and every drained leaf. The deep depth (make modelcheck) adds a disk failure
// to every scenario.
func TestDiskFailures(t *testing.T) {
	for _, l := range StartLayouts[1:4] { // 2D, 2D+1TB, 3D
		for _, attached := range []bool{false, true} {
			l, attached := l, attached
			name := l.Name
			if attached {
				name += "/attached"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				s := NewScenario(l, false, v1alpha1.TopologyZonal,
					Bounds{Depth: 12, DiskFailures: 1, Losses: 1, Returns: 1, Restarts: 1, Spare: 1, MaxStates: 200000})
				s.AttachFirst = attached
				s.Name = "disk failure: " + s.Name
				checkScenario(t, s)
			})
		}
	}
}

// TestAFailedDiskIsReplaced: in the model too, the disk of a Diskful member failing
// with nothing else happening ends with the member out of the Diskful members (gone,
// or an Access member where it is attached) and every Diskful the layout asks for
// UpToDate: the exploration above checks that nothing breaks, this that the rule
// does what it is for.
func TestAFailedDiskIsReplaced(t *testing.T) {
	for _, l := range StartLayouts[1:4] {
		for _, attached := range []bool{false, true} {
			s := NewScenario(l, false, v1alpha1.TopologyZonal, Bounds{Depth: 1, DiskFailures: 1, Spare: 1})
			s.AttachFirst = attached
			c := NewChecker(s, datamesh.NewEngine(nil, datamesh.Features{}))
			w, err := c.Initial()
			if err != nil {
				t.Fatal(err)
			}
			failing := 0 // slot 0 holds the attachment when there is one
			w, ok, vs := c.do(w, Action{Kind: ActDiskFail, Slot: int8(failing)})
			if !ok || len(vs) > 0 {
				t.Fatalf("%s attached=%v: disk failure: ok=%v %v", l.Name, attached, ok, vs)
			}
			w, vs = c.drain(w, false)
			if len(vs) > 0 {
				t.Fatalf("%s attached=%v: %v\n%s", l.Name, attached, vs, w.String(s))
			}
			upToDate := 0
			for _, m := range w.RV.Status.Datamesh.Members {
				j := s.slotOf(m.Name)
				if j == failing && (m.Type != v1alpha1.MemberTypeAccess || !attached) {
					t.Fatalf("%s attached=%v: the failed member is still a member (%s)\n%s", l.Name, attached, m.Type, w.String(s))
				}
				if m.Type == v1alpha1.MemberTypeDiskful && w.DP.Replicas[j].UpToDate {
					upToDate++
				}
			}
			if upToDate != l.D {
				t.Fatalf("%s attached=%v: %d UpToDate Diskful after the replacement, want %d\n%s", l.Name, attached, upToDate, l.D, w.String(s))
			}
		}
	}
}
