package modelcheck

import (
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// These tests check the checker, against the scaffolding engine of
// fake_test.go: a correct run passes and explores states; each seeded bug
// is reported under the invariant meant to catch it.

func fakeScenario(t *testing.T, layout string, only uint32, b Bounds) *Scenario {
	t.Helper()
	for _, l := range StartLayouts {
		if l.Name == layout {
			s := NewScenario(l, false, v1alpha1.TopologyZonal, b)
			s.Only = only
			return s
		}
	}
	t.Fatalf("no layout %s", layout)
	return nil
}

const attachOnly = 1<<ReqAttach | 1<<ReqDetach

func TestCheckerPassesCorrectFake(t *testing.T) {
	// The fake knows nothing of force removal, so no node is lost here.
	s := fakeScenario(t, "2D+1TB", attachOnly, Bounds{Depth: 14, Requests: 2, Restarts: 1, Spare: 1})
	c := NewChecker(s, &fakeEngine{})
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	if c.Stats.States < 100 {
		t.Fatalf("explored only %d states", c.Stats.States)
	}
	t.Logf("%s: %+v", s.Name, c.Stats)
}

func expectViolation(t *testing.T, s *Scenario, bugs fakeBugs, inv string) {
	t.Helper()
	c := NewChecker(s, &fakeEngine{bugs: bugs})
	err := c.Run()
	if err == nil {
		t.Fatalf("%+v: no violation found in %d states, want %s", bugs, c.Stats.States, inv)
	}
	for _, f := range c.Failures {
		if f.Invariant == inv {
			t.Logf("found after %d states:\n%v", c.Stats.States, f)
			return
		}
	}
	if strings.Contains(err.Error(), inv) {
		t.Logf("found: %v", err)
		return
	}
	t.Fatalf("want %s, got %v", inv, err)
}

func TestCheckerFindsLowQuorum(t *testing.T) {
	expectViolation(t, fakeScenario(t, "3D", attachOnly, Bounds{Depth: 4, Requests: 1}), fakeBugs{lowQ: true}, InvQuorumFloor)
}

func TestCheckerFindsDoubleAttach(t *testing.T) {
	expectViolation(t, fakeScenario(t, "2D", attachOnly, Bounds{Depth: 6, Requests: 2}), fakeBugs{doubleAttach: true}, InvAttached)
}

// Moving the attachment: publishing the new Attach before the old Detach is
// confirmed tells two nodes to be Primary at once. (DRBD itself would refuse
// the second promotion while the two are connected; across a cut it would
// not, and the engine must not count on the connection.)
func TestCheckerFindsTwoPrimaries(t *testing.T) {
	expectViolation(t, fakeScenario(t, "2D", attachOnly, Bounds{Depth: 6, Requests: 2}), fakeBugs{eagerAttach: true}, InvPrimaries)
}

func TestCheckerFindsStuckTransition(t *testing.T) {
	expectViolation(t, fakeScenario(t, "2D", attachOnly, Bounds{Depth: 3, Requests: 1}), fakeBugs{stuckAttach: true}, InvLiveness)
}

func TestCheckerFindsSilentBlock(t *testing.T) {
	expectViolation(t, fakeScenario(t, "2D", 1<<ReqAdd, Bounds{Depth: 3, Requests: 1, Spare: 1}), fakeBugs{silentBlock: true}, InvMessage)
}

func TestCheckerFindsGMDRViolation(t *testing.T) {
	expectViolation(t, fakeScenario(t, "2D", 1<<ReqRemove, Bounds{Depth: 3, Requests: 1}), fakeBugs{unsafeRemove: true}, InvGMDR)
}

// Adding a D to 2D+1TB in one step with q unchanged (2 of 3): while only the
// new D and one old D have applied it, those two are a majority of three,
// and the other old D still runs "2 voters + TB", where the tiebreaker keeps
// it quorate with the TB. Both sides can write: the split the vestibule
// (✦ → A → D∅ + q↑ → D) exists to prevent, found with DRBD's real rule.
func TestCheckerFindsWriteSplit(t *testing.T) {
	s := fakeScenario(t, "2D+1TB", 1<<ReqAdd, Bounds{Depth: 8, Requests: 1, Spare: 1})
	expectViolation(t, s, fakeBugs{unsafeAddD: true}, InvWriteSplit)
}
