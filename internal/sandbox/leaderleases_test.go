package sandbox

import (
	"testing"
	"time"
)

// TestLeaseLogCountsRenewalsAndHandOvers: renewals by one holder give gaps;
// a new holder is a hand-over, not a gap, and so is the same holder after
// its Lease expired; a state seen twice (a resync, the
// list after a watch ended) is not a renewal.
func TestLeaseLogCountsRenewalsAndHandOvers(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 18, 0, 0, 0, time.UTC)
	var l leaseLog
	l.observe("meshvol-controller", "a", t0, 8*time.Second)
	l.observe("meshvol-controller", "a", t0.Add(1100*time.Millisecond), 8*time.Second)
	l.observe("meshvol-controller", "a", t0.Add(1100*time.Millisecond), 8*time.Second)
	l.observe("meshvol-controller", "a", t0.Add(4100*time.Millisecond), 8*time.Second)
	l.observe("meshvol-controller", "b", t0.Add(15*time.Second), 8*time.Second)
	l.observe("meshvol-controller", "b", t0.Add(16*time.Second), 8*time.Second)
	// b again 67 s later: its Lease had expired (a restart on the same
	// node), so it acquired the Lease anew.
	l.observe("meshvol-controller", "b", t0.Add(83*time.Second), 8*time.Second)
	l.observe("external-attacher-leader-meshvol", "", t0, 8*time.Second)
	rep := l.report()
	if len(rep) != 2 || rep[0].Lease != "external-attacher-leader-meshvol" || rep[1].Lease != "meshvol-controller" {
		t.Fatalf("report %+v: want the two Leases by name", rep)
	}
	if r := rep[0]; r.Renewals != 0 || r.Holders != 0 || r.Longest() != 0 {
		t.Errorf("a Lease without a holder: %+v, want nothing counted", r)
	}
	r := rep[1]
	if r.Renewals != 3 || r.Holders != 3 {
		t.Errorf("renewals %d, holders %d: want 3 and 3", r.Renewals, r.Holders)
	}
	if r.Longest() != 3*time.Second || !r.LongestAt.Equal(t0.Add(4100*time.Millisecond)) {
		t.Errorf("longest gap %s at %s: want 3s, ending at the renewal of 18:00:04.1", r.Longest(), r.LongestAt)
	}
	if q := r.Quantile(0.5); q != 1100*time.Millisecond {
		t.Errorf("median gap %s, want 1.1s (of 1.1s, 3s, 1s)", q)
	}
}
