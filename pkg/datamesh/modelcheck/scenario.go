package modelcheck

import (
	"fmt"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// StartLayout is a starting layout of the model check.
type StartLayout struct {
	Name      string
	FTT, GMDR int32
	D, TB     int
}

// StartLayouts are the layouts up to 5 voters + TB the requirement names.
var StartLayouts = []StartLayout{
	{"1D", 0, 0, 1, 0},
	{"2D", 0, 1, 2, 0},
	{"2D+1TB", 1, 0, 2, 1},
	{"3D", 1, 1, 3, 0},
	{"4D+1TB", 2, 1, 4, 1},
	{"5D", 2, 2, 5, 0},
}

// Bounds limit one run.
type Bounds struct {
	Depth    int  // actions per run
	Requests int8 // requests injected per run
	// AttachRequests are attach/detach requests injected per run on top of
	// Requests (Scenario.AttachRequests).
	AttachRequests int8
	Losses         int8 // nodes lost per run
	Returns        int8 // lost nodes that come back alive behind a partition per run
	Restarts       int8 // agent restarts per run
	// DiskFailures are disks that fail per run (ActDiskFail: DRBD detaches a
	// Diskful member's disk after an I/O error).
	DiskFailures int8
	Spare        int // free node slots beyond the starting replicas
	// MaxStates stops the search after that many distinct states (0: no
	// cap). The search is deterministic, so a capped run covers the same
	// states every time; Stats.Capped says it was hit.
	MaxStates int
}

// Zones of a TransZonal scenario.
var Zones = []string{"zone-a", "zone-b", "zone-c"}

// NewScenario builds the scenario for one starting layout.
func NewScenario(l StartLayout, shadow bool, topo v1alpha1.Topology, b Bounds) *Scenario {
	s := &Scenario{
		Shadow: shadow,
		Config: v1alpha1.ReplicatedVolumeConfiguration{
			StoragePool:                     "pool",
			FailuresToTolerate:              l.FTT,
			GuaranteedMinimumDataRedundancy: l.GMDR,
			Topology:                        topo,
			VolumeAccess:                    v1alpha1.VolumeAccessPreferablyLocal,
		},
		MaxAttach:   1,
		AttachFirst: true,
		Losses:      b.Losses, Returns: b.Returns, DiskFailures: b.DiskFailures, Restarts: b.Restarts, Requests: b.Requests, AttachRequests: b.AttachRequests, MaxDepth: b.Depth, MaxStates: b.MaxStates,
	}
	n := l.D + l.TB + b.Spare
	if n > MaxReplicas {
		n = MaxReplicas
	}
	for i := 0; i < n; i++ {
		zone := Zones[0]
		if topo == v1alpha1.TopologyTransZonal {
			zone = Zones[i%len(Zones)]
		}
		s.Slots = append(s.Slots, Slot{Name: fmt.Sprintf("r%d", i), Node: fmt.Sprintf("node-%d", i), Zone: zone})
	}
	for i := 0; i < l.D; i++ {
		s.Initial = append(s.Initial, v1alpha1.ReplicaTypeDiskful)
	}
	for i := 0; i < l.TB; i++ {
		s.Initial = append(s.Initial, v1alpha1.ReplicaTypeTieBreaker)
	}
	sh := "no-shadow"
	if shadow {
		sh = "shadow"
	}
	s.Name = fmt.Sprintf("%s/%s/%s", l.Name, topo, sh)
	return s
}
