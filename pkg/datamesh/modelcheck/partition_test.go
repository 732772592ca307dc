package modelcheck

import (
	"testing"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Hand-built data planes: the partition analysis on its own, with DRBD's
// rule from pkg/drbd/quorum.

const (
	tD   = v1alpha1.MemberTypeDiskful
	tDL  = v1alpha1.MemberTypeLiminalDiskful
	tA   = v1alpha1.MemberTypeAccess
	tTB  = v1alpha1.MemberTypeTieBreaker
	tSD  = v1alpha1.MemberTypeShadowDiskful
	tSDL = v1alpha1.MemberTypeLiminalShadowDiskful
)

// snap builds a snapshot; types[i] == "" leaves slot i out.
func snap(rev int64, q, qmr int32, types ...v1alpha1.MemberType) *Snapshot {
	s := &Snapshot{Revision: rev, Q: q, QMR: qmr}
	for i := range s.bySlot {
		s.bySlot[i] = -1
	}
	for i, t := range types {
		if t == "" {
			continue
		}
		s.bySlot[i] = int8(len(s.Members))
		s.Members = append(s.Members, SnapMember{Slot: int8(i), Type: t, NodeID: int32(i)})
	}
	return s
}

func plane(shadow bool, applied ...*Snapshot) *DataPlane {
	dp := &DataPlane{N: len(applied), Shadow: shadow}
	for i, s := range applied {
		dp.Replicas[i] = Replica{Exists: true, Alive: true, AgentReady: true, Applied: s, UpToDate: true}
	}
	return dp
}

func TestSplitConsistentLayouts(t *testing.T) {
	var a Analyzer
	for _, tc := range []struct {
		name  string
		types []v1alpha1.MemberType
		q     int32
	}{
		{"2D+1TB", []v1alpha1.MemberType{tD, tD, tTB}, 2},
		{"3D", []v1alpha1.MemberType{tD, tD, tD}, 2},
		{"4D+1TB", []v1alpha1.MemberType{tD, tD, tD, tD, tTB}, 3},
		{"5D+A", []v1alpha1.MemberType{tD, tD, tD, tD, tD, tA}, 3},
		{"2D+1TB with D∅ vestibule q=3", []v1alpha1.MemberType{tD, tD, tTB, tDL}, 3},
	} {
		s := snap(1, tc.q, 1, tc.types...)
		ss := make([]*Snapshot, len(tc.types))
		for i := range ss {
			ss[i] = s
		}
		qs, ws := a.FindSplits(plane(false, ss...))
		if qs != nil || ws != nil {
			t.Errorf("%s: split %+v %+v", tc.name, qs, ws)
		}
	}
}

// 2D with q=1: each D alone is quorate. The checker must say so.
func TestSplitFoundWithQuorumOne(t *testing.T) {
	var a Analyzer
	s := snap(1, 1, 1, tD, tD)
	qs, ws := a.FindSplits(plane(false, s, s))
	if qs == nil || ws == nil {
		t.Fatalf("2D q=1 must split: %+v %+v", qs, ws)
	}
}

// Half-applied one-step D add to 2D+1TB (see TestCheckerFindsWriteSplit).
func TestSplitHalfAppliedUnsafeAdd(t *testing.T) {
	var a Analyzer
	old := snap(1, 2, 1, tD, tD, tTB)
	nu := snap(2, 2, 1, tD, tD, tTB, tD)
	dp := plane(false, nu, old, old, nu)
	dp.Replicas[3].UpToDate = false // the new D is still Inconsistent
	_, ws := a.FindSplits(dp)
	if ws == nil {
		t.Fatal("no write split found")
	}
	// The safe vestibule: the new member enters as D∅ with q raised to 3.
	safe := snap(2, 3, 1, tD, tD, tTB, tDL)
	dp = plane(false, safe, old, old, safe)
	if qs, ws := a.FindSplits(dp); qs != nil || ws != nil {
		t.Fatalf("vestibule half applied: %+v %+v", qs, ws)
	}
}

// A side that is quorate but holds no UpToDate data cannot write: a lone
// D∅... is never quorate by itself, so build it from an Inconsistent D.
func TestWriterNeedsData(t *testing.T) {
	var a Analyzer
	s := snap(1, 1, 0, tD, tA)
	dp := plane(false, s, s)
	dp.Replicas[0].UpToDate = false
	r := a.Side(dp, 0b11)
	if r.Quorate&1 == 0 || r.Writers != 0 {
		t.Fatalf("inconsistent D with q=1: quorate %b writers %b", r.Quorate, r.Writers)
	}
}

// Without the non-voting option an attached sD is a voter to its peers.
func TestShadowVotesOnlyWithoutFeature(t *testing.T) {
	var a Analyzer
	s := snap(1, 2, 1, tD, tD, tTB, tSD)
	// With the feature, r1 with the sD sees 1 of 2 voters and no TB.
	if r := a.Side(plane(true, s, s, s, s), 0b1010); r.Quorate != 0 {
		t.Fatalf("shadow feature: {r1,r3} quorate %b", r.Quorate)
	}
	// Without it the sD votes: r1 sees 2 of 3 voters (q=2).
	if r := a.Side(plane(false, s, s, s, s), 0b1010); r.Quorate&0b10 == 0 {
		t.Fatalf("no shadow feature: r1 with a voting sD not quorate (%b)", r.Quorate)
	}
}

func TestDataPlanePrimaries(t *testing.T) {
	var a Analyzer
	s := snap(1, 2, 1, tD, tD, tD)
	s.Members[0].Attached = true
	s.Members[1].Attached = true
	vs := checkDataPlane(&Scenario{Slots: make([]Slot, 3)}, &a, plane(false, s, s, s))
	found := false
	for _, v := range vs {
		found = found || v.Invariant == InvPrimaries
	}
	if !found {
		t.Fatalf("two Primaries without multiattach not reported: %v", vs)
	}
	s2 := *s
	s2.Multiattach = true
	if vs := checkDataPlane(&Scenario{Slots: make([]Slot, 3)}, &a, plane(false, &s2, &s2, &s2)); len(vs) != 0 {
		t.Fatalf("multiattach: %v", vs)
	}
}

func BenchmarkFindSplits5D(b *testing.B) {
	var a Analyzer
	s := snap(1, 3, 3, tD, tD, tD, tD, tD, tA)
	dp := plane(false, s, s, s, s, s, s)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		a.FindSplits(dp)
	}
}

// A liminal member runs `disk none`, but its peers keep a bitmap slot for it (the
// agent writes a liminal peer with its disk, pkg/agent render.go), and DRBD on a
// node with a disk counts a connected peer as a diskless vote only when the peer
// reports Diskless *and* the local peer device has `bitmap no` (docs/drbd-quorum.md,
// "The rule"): to its diskful peers a D∅ is a voter, present while connected. The
// one-step add of a D∅ to 2D+1TB with q unchanged is therefore a split while half
// applied — {r0, r3} is 2 of 3 under q=2, {r1, r2} keeps quorum through the old
// configuration's tiebreaker — and the add plans raise q in the step that adds it.
func TestLiminalVotesAtItsDiskfulPeers(t *testing.T) {
	var a Analyzer
	old := snap(1, 2, 1, tD, tD, tTB)
	nu := snap(2, 2, 1, tD, tD, tTB, tDL)
	if _, ws := a.FindSplits(plane(false, nu, old, old, nu)); ws == nil {
		t.Fatal("D∅ added to 2D+1TB with q unchanged, half applied: split not found")
	}
	// With q raised in the same step (3 of the 3 voters the new configuration
	// counts), the side that applied it is not quorate: no split.
	nq := snap(2, 3, 1, tD, tD, tTB, tDL)
	if qs, ws := a.FindSplits(plane(false, nq, old, old, nq)); qs != nil || ws != nil {
		t.Fatalf("D∅ added with q raised: split %+v %+v", qs, ws)
	}
	// Its disk attached (D∅ → D applied by it alone), it votes itself: with the
	// old nodes still on "2 voters + TB" that is the split of
	// TestSplitHalfAppliedUnsafeAdd.
	nd := snap(3, 2, 1, tD, tD, tTB, tD)
	dp := plane(false, nu, old, old, nd)
	dp.Replicas[3].UpToDate = false
	if _, ws := a.FindSplits(dp); ws == nil {
		t.Fatal("attached new D with old configs elsewhere: split not found")
	}
}
