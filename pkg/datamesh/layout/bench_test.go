package layout

import "testing"

// The engine evaluates q and the guards on every reconcile of every volume;
// none of them may allocate on the accepting path. Run with
//
//	go test ./pkg/datamesh/layout -run '^$' -bench . -benchmem

var (
	sinkInt  int
	sinkBool bool
	sinkStr  string
)

func BenchmarkQuorum(b *testing.B) {
	eff := Layout{FTT: 2, GMDR: 2}
	for i := 0; i < b.N; i++ {
		sinkInt += Quorum(i&7, eff)
	}
}

func BenchmarkFTTForVoters(b *testing.B) {
	eff := Layout{FTT: 2, GMDR: 1}
	for i := 0; i < b.N; i++ {
		sinkInt += eff.FTTForVoters(i&7, i&1)
	}
}

func BenchmarkGuardsNonZone(b *testing.B) {
	target := Layout{FTT: 1, GMDR: 1}
	for i := 0; i < b.N; i++ {
		ok1, _ := GuardQMRReady(2, 1)
		ok2, _ := GuardGMDR(4, true, 1)
		ok3, _ := GuardFTT(4, target)
		ok4, _ := GuardTBRequired(1, 3, 1)
		sinkBool = ok1 && ok2 && ok3 && ok4
	}
}

var threeZones = []ZoneCount{
	{Zone: "z3", D: 1, UpToDateD: 1, TB: 1},
	{Zone: "z1", D: 2, UpToDateD: 2},
	{Zone: "z2", D: 2, UpToDateD: 2, Diskless: 1},
}

func BenchmarkGuardZoneGMDR(b *testing.B) {
	l := Leaving{Zone: "z2", UpToDate: true}
	for i := 0; i < b.N; i++ {
		sinkBool, sinkStr = GuardZoneGMDR(threeZones, l, 1)
	}
}

func BenchmarkGuardZoneFTT(b *testing.B) {
	l := Leaving{Zone: "z2", UpToDate: true}
	eff := Layout{FTT: 2, GMDR: 1}
	for i := 0; i < b.N; i++ {
		sinkBool, sinkStr = GuardZoneFTT(threeZones, l, eff)
	}
}

func BenchmarkGuardZoneTBRequired(b *testing.B) {
	zones := []ZoneCount{
		{Zone: "z1", D: 2, UpToDateD: 2},
		{Zone: "z2", D: 1, UpToDateD: 1, TB: 1},
		{Zone: "z3", D: 1, UpToDateD: 1, TB: 1},
	}
	eff := Layout{FTT: 2, GMDR: 1}
	for i := 0; i < b.N; i++ {
		sinkBool, sinkStr = GuardZoneTBRequired(zones, "z3", eff)
	}
}

// BenchmarkGuardZoneFTTBlocked measures the refusing path, which formats
// the message (one allocation expected).
func BenchmarkGuardZoneFTTBlocked(b *testing.B) {
	l := Leaving{Zone: "z3", UpToDate: true}
	eff := Layout{FTT: 2, GMDR: 1}
	for i := 0; i < b.N; i++ {
		sinkBool, sinkStr = GuardZoneFTT(threeZones, l, eff)
	}
}

// TestNoAllocations makes the 0-allocation claim a test, not a hope.
func TestNoAllocations(t *testing.T) {
	eff := Layout{FTT: 2, GMDR: 1}
	l := Leaving{Zone: "z2", UpToDate: true}
	zones := []ZoneCount{
		{Zone: "z1", D: 2, UpToDateD: 2},
		{Zone: "z2", D: 1, UpToDateD: 1, TB: 1},
		{Zone: "z3", D: 1, UpToDateD: 1, TB: 1},
	}
	for name, f := range map[string]func(){
		"Quorum":              func() { sinkInt = Quorum(4, eff) },
		"FTTForVoters":        func() { sinkInt = eff.FTTForVoters(4, 1) },
		"Ratchet":             func() { sinkInt = eff.AfterMembershipChange(Layout{2, 2}, 5, 0).FTT },
		"GuardZoneGMDR":       func() { sinkBool, sinkStr = GuardZoneGMDR(threeZones, l, 1) },
		"GuardZoneFTT":        func() { sinkBool, sinkStr = GuardZoneFTT(threeZones, l, eff) },
		"GuardZoneTBRequired": func() { sinkBool, sinkStr = GuardZoneTBRequired(zones, "z3", eff) },
		"GuardFTT":            func() { sinkBool, sinkStr = GuardFTT(5, eff) },
	} {
		f()
		if !sinkBool && name[:5] == "Guard" {
			t.Fatalf("%s: the accepting case refused: %s", name, sinkStr)
		}
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
}
