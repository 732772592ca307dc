package placement

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

const gi = int64(1) << 30

// node builds a usable pool node with free GiB.
func node(name, zone string, freeGi int64) Node {
	return Node{Name: name, Zone: zone, InPool: true, PoolReady: true, AgentLive: true, HMACOK: true,
		Free: freeGi * gi, HasFree: true}
}

func with(n Node, f func(*Node)) Node { f(&n); return n }

func cfg(ftt, gmdr int32, topo v1.Topology) v1.ReplicatedVolumeConfiguration {
	return v1.ReplicatedVolumeConfiguration{StoragePool: "fast", FailuresToTolerate: ftt, GuaranteedMinimumDataRedundancy: gmdr,
		Topology: topo, VolumeAccess: v1.VolumeAccessPreferablyLocal}
}

// render prints placements as "D:a D:b TB:c", sorted by type then node.
func render(ps []Choice) string {
	var out []string
	for _, p := range ps {
		t := "D"
		switch p.Type {
		case v1.ReplicaTypeTieBreaker:
			t = "TB"
		case v1.ReplicaTypeAccess:
			t = "A"
		}
		out = append(out, t+":"+p.Node)
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func TestPlace(t *testing.T) {
	ten := resource.MustParse("10Gi")
	three := []Node{node("a", "z1", 100), node("b", "z2", 100), node("c", "z3", 100)}
	tests := []struct {
		name     string
		in       Input
		want     string // placements, or "error: <constraint>: <message substring>"
		errorMsg string
	}{
		{name: "ignored 3D picks the three nodes",
			in:   Input{Config: cfg(1, 1, v1.TopologyIgnored), Size: ten, Diskful: 3, Nodes: three},
			want: "D:a D:b D:c"},
		{name: "ignored prefers fewest replicas, then most free",
			in: Input{Config: cfg(0, 1, v1.TopologyIgnored), Size: ten, Diskful: 2, Nodes: []Node{
				with(node("a", "", 500), func(n *Node) { n.Replicas = 3 }),
				node("b", "", 20), node("c", "", 50), node("d", "", 40)}},
			want: "D:c D:d"},
		{name: "capacity: a node without room is skipped",
			in:   Input{Config: cfg(0, 1, v1.TopologyIgnored), Size: ten, Diskful: 2, Nodes: []Node{node("a", "", 5), node("b", "", 20), node("c", "", 20)}},
			want: "D:b D:c"},
		{name: "capacity: too few nodes with room refuses everything",
			in:       Input{Config: cfg(1, 1, v1.TopologyIgnored), Size: ten, Diskful: 3, Nodes: []Node{node("a", "", 5), node("b", "", 20), node("c", "", 20)}},
			want:     "error: " + ConstraintCapacity,
			errorMsg: `No node fits: need 3 Diskful replica(s) with free capacity ≥ 10Gi in pool "fast": 2 of 3 usable node(s) have room (a has 5Gi)`},
		{name: "capacity is counted across the replicas placed in one call",
			in: Input{Config: cfg(1, 0, v1.TopologyIgnored), Size: ten, Diskful: 2, TieBreaker: 1,
				Nodes: []Node{node("a", "", 15), node("b", "", 15), node("c", "", 0)}},
			want: "D:a D:b TB:c"},
		{name: "cordon, dead agent, unready pool and missing algorithm exclude nodes",
			in: Input{Config: cfg(0, 0, v1.TopologyIgnored), Size: ten, Diskful: 1, Nodes: []Node{
				with(node("a", "", 900), func(n *Node) { n.Cordoned = true }),
				with(node("b", "", 900), func(n *Node) { n.AgentLive = false }),
				with(node("c", "", 900), func(n *Node) { n.PoolReady = false }),
				with(node("d", "", 900), func(n *Node) { n.HMACOK = false }),
				node("e", "", 20)}},
			want: "D:e"},
		{name: "a node with every DRBD port held takes no replica",
			in: Input{Config: cfg(0, 0, v1.TopologyIgnored), Size: ten, Diskful: 1, Nodes: []Node{
				with(node("a", "", 900), func(n *Node) { n.PortsFull = true }),
				node("b", "", 20)}},
			want: "D:b"},
		{name: "no node fits names every exclusion",
			in: Input{Config: cfg(0, 0, v1.TopologyIgnored), Size: ten, Diskful: 1, Nodes: []Node{
				with(node("a", "", 900), func(n *Node) { n.Cordoned = true }),
				with(node("b", "", 900), func(n *Node) { n.AgentLive = false }),
				with(node("c", "", 900), func(n *Node) { n.PortsFull = true })}},
			want:     "error: " + ConstraintNodes,
			errorMsg: `No node fits: need 1 Diskful replica(s) with free capacity ≥ 10Gi in pool "fast": 0 of 0 usable node(s) have room; excluded: a (cordoned); b (agent not live); c (no free DRBD port)`},
		{name: "empty pool",
			in:       Input{Config: cfg(0, 0, v1.TopologyIgnored), Size: ten, Diskful: 1},
			want:     "error: " + ConstraintNoEligibleNodes,
			errorMsg: `No node fits: need 1 Diskful replica(s) with free capacity ≥ 10Gi in pool "fast": the pool has no eligible nodes`},
		{name: "never two replicas of a volume on one node",
			in: Input{Config: cfg(1, 1, v1.TopologyIgnored), Size: ten, Diskful: 1,
				Existing: []Replica{{Node: "a", Type: v1.ReplicaTypeDiskful}, {Node: "b", Type: v1.ReplicaTypeDiskful, Deleting: true}},
				Nodes:    three},
			want: "D:c"},
		{name: "a TieBreaker never shares a node with a Diskful replica",
			in:   Input{Config: cfg(1, 0, v1.TopologyIgnored), Size: ten, Diskful: 2, TieBreaker: 1, Nodes: three},
			want: "D:a D:b TB:c"},
		{name: "attachment node first for a Diskful replica",
			in:   Input{Config: cfg(0, 0, v1.TopologyIgnored), Size: ten, Diskful: 1, AttachNodes: []string{"c"}, Nodes: three},
			want: "D:c"},
		{name: "the first preferred segment gets a Diskful replica",
			in: Input{Config: cfg(0, 1, v1.TopologyIgnored), Size: ten, Diskful: 2, Nodes: three,
				Preferred: []v1.TopologySegment{{NodeName: "c"}, {NodeName: "b"}}},
			want: "D:b D:c"},
		{name: "a preferred zone steers Zonal",
			in: Input{Config: cfg(0, 0, v1.TopologyZonal), Size: ten, Diskful: 1, Nodes: three,
				Preferred: []v1.TopologySegment{{Zone: "z2"}}},
			want: "D:b"},
		{name: "volumeAccess Local puts a Diskful replica in a requisite segment",
			in: Input{Config: func() v1.ReplicatedVolumeConfiguration {
				c := cfg(0, 0, v1.TopologyIgnored)
				c.VolumeAccess = v1.VolumeAccessLocal
				return c
			}(), Size: ten, Diskful: 1, Nodes: []Node{node("a", "z1", 900), node("b", "z2", 20)},
				Requisite: []v1.TopologySegment{{Zone: "z2"}}},
			want: "D:b"},
		{name: "volumeAccess Local refuses when no requisite segment fits",
			in: Input{Config: func() v1.ReplicatedVolumeConfiguration {
				c := cfg(0, 0, v1.TopologyIgnored)
				c.VolumeAccess = v1.VolumeAccessLocal
				return c
			}(), Size: ten, Diskful: 1, Nodes: []Node{node("a", "z1", 900), node("b", "z2", 5)},
				Requisite: []v1.TopologySegment{{NodeName: "b"}}},
			want:     "error: " + ConstraintRequisite,
			errorMsg: `volumeAccess=Local needs a Diskful replica in one of the requisite topology segments (node b) in pool "fast": no node there fits`},
		{name: "volumeAccess Any ignores the attachment node",
			in: Input{Config: func() v1.ReplicatedVolumeConfiguration {
				c := cfg(0, 0, v1.TopologyIgnored)
				c.VolumeAccess = v1.VolumeAccessAny
				return c
			}(), Size: ten, Diskful: 1, AttachNodes: []string{"c"}, Nodes: three},
			want: "D:a"},
		{name: "configuration zones restrict placement",
			in: Input{Config: func() v1.ReplicatedVolumeConfiguration {
				c := cfg(0, 0, v1.TopologyZonal)
				c.Zones = []string{"z3"}
				return c
			}(), Size: ten, Diskful: 1, Nodes: three},
			want: "D:c"},
		{name: "zonal picks one zone that fits all",
			in: Input{Config: cfg(1, 0, v1.TopologyZonal), Size: ten, Diskful: 2, TieBreaker: 1, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 100),
				node("b1", "b", 50), node("b2", "b", 50), node("b3", "b", 0)}},
			want: "D:b1 D:b2 TB:b3"},
		{name: "zonal stays in the zone of the existing replicas",
			in: Input{Config: cfg(1, 1, v1.TopologyZonal), Size: ten, Diskful: 1,
				Existing: []Replica{{Node: "a1", Type: v1.ReplicaTypeDiskful}, {Node: "a2", Type: v1.ReplicaTypeDiskful}},
				Nodes:    []Node{node("a1", "a", 100), node("a2", "a", 100), node("a3", "a", 20), node("b1", "b", 900)}},
			want: "D:a3"},
		{name: "zonal refuses when no zone fits",
			in: Input{Config: cfg(1, 1, v1.TopologyZonal), Size: ten, Diskful: 3, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 100), node("b1", "b", 100), node("b2", "b", 5)}},
			want:     "error: " + ConstraintZonal,
			errorMsg: `Zonal needs 3 nodes with free capacity ≥ 10Gi in one zone in pool "fast": zone a has 2, zone b has 1`},
		{name: "transzonal 3D goes one per zone",
			in: Input{Config: cfg(1, 1, v1.TopologyTransZonal), Size: ten, Diskful: 3, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 900), node("b1", "b", 100), node("c1", "c", 100)}},
			want: "D:a2 D:b1 D:c1"},
		{name: "transzonal 2D+1TB puts the TB in the third zone",
			in: Input{Config: cfg(1, 0, v1.TopologyTransZonal), Size: ten, Diskful: 2, TieBreaker: 1, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 100), node("b1", "b", 100), node("c1", "c", 0)}},
			want: "D:a1 D:b1 TB:c1"},
		{name: "transzonal 4D+1TB goes 2/1/1 with the TB in a one-D zone",
			in: Input{Config: cfg(2, 1, v1.TopologyTransZonal), Size: ten, Diskful: 4, TieBreaker: 1, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 100), node("b1", "b", 100), node("b2", "b", 100), node("c1", "c", 100), node("c2", "c", 100)}},
			want: "D:a1 D:a2 D:b1 D:c1 TB:b2"},
		{name: "transzonal replacement goes to the zone that lost its D",
			in: Input{Config: cfg(1, 1, v1.TopologyTransZonal), Size: ten, Diskful: 1,
				Existing: []Replica{{Node: "a1", Type: v1.ReplicaTypeDiskful}, {Node: "b1", Type: v1.ReplicaTypeDiskful}, {Node: "c1", Type: v1.ReplicaTypeDiskful, Deleting: true}},
				Nodes:    []Node{node("a1", "a", 100), node("a2", "a", 900), node("b1", "b", 100), node("b2", "b", 900), node("c1", "c", 100), node("c2", "c", 100)}},
			want: "D:c2"},
		{name: "transzonal refuses with two zones",
			in: Input{Config: cfg(1, 1, v1.TopologyTransZonal), Size: ten, Diskful: 3, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 100), node("b1", "b", 100), node("c1", "c", 1)}},
			want:     "error: " + ConstraintTransZonal,
			errorMsg: `TransZonal needs 3 zones with free capacity ≥ 10Gi in pool "fast": zone c has none`},
		{name: "transzonal 4D needs four zones",
			in:       Input{Config: cfg(1, 2, v1.TopologyTransZonal), Size: ten, Diskful: 4, Nodes: append(three, node("d", "z1", 100))},
			want:     "error: " + ConstraintTransZonal,
			errorMsg: "TransZonal with failuresToTolerate=1, guaranteedMinimumDataRedundancy=2 (4D) needs 4 zones"},
		{name: "transzonal refuses to pile up when a zone runs out of nodes",
			in: Input{Config: cfg(2, 0, v1.TopologyTransZonal), Size: ten, Diskful: 3, Nodes: []Node{
				node("a1", "a", 100), node("a2", "a", 100), node("a3", "a", 100), node("b1", "b", 100), node("c1", "c", 100)},
				Existing: []Replica{{Node: "b1", Type: v1.ReplicaTypeDiskful}, {Node: "c1", Type: v1.ReplicaTypeDiskful}}},
			want:     "error: " + ConstraintTransZonal,
			errorMsg: "zone a would hold 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Place(tc.in)
			var s string
			if err != nil {
				var pe *Error
				if !errors.As(err, &pe) {
					t.Fatalf("error %v is not a *Error", err)
				}
				if got != nil {
					t.Errorf("refusal returned placements %v: placement is all or nothing", got)
				}
				s = "error: " + pe.Constraint
				if tc.errorMsg != "" && !strings.Contains(pe.Message, tc.errorMsg) {
					t.Errorf("message %q\n does not contain %q", pe.Message, tc.errorMsg)
				}
			} else {
				s = render(got)
			}
			if s != tc.want {
				t.Errorf("got %s, want %s (message: %v)", s, tc.want, err)
			}
		})
	}
}

// Placement is deterministic: the node order of the input does not change the answer.
func TestPlaceDeterministic(t *testing.T) {
	nodes := []Node{node("a1", "a", 100), node("a2", "a", 100), node("b1", "b", 100), node("b2", "b", 80),
		node("c1", "c", 100), node("c2", "c", 70)}
	in := Input{Config: cfg(2, 1, v1.TopologyTransZonal), Size: resource.MustParse("1Gi"), Diskful: 4, TieBreaker: 1}
	var first string
	for i := range 50 {
		perm := make([]Node, len(nodes))
		for j := range nodes {
			perm[(j*7+i)%len(nodes)] = nodes[j]
		}
		in.Nodes = perm
		got, err := Place(in)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = render(got)
		} else if render(got) != first {
			t.Fatalf("permutation %d placed %s, first placed %s", i, render(got), first)
		}
	}
}

func TestPlaceAccess(t *testing.T) {
	nodes := []Node{{Name: "a", AgentLive: true, HMACOK: true}, {Name: "b"}, {Name: "c", AgentLive: true, HMACOK: true},
		{Name: "d", AgentLive: true, HMACOK: true, PortsFull: true}}
	existing := []Replica{{Node: "c", Type: v1.ReplicaTypeDiskful}}
	for _, tc := range []struct{ node, want string }{
		{"a", ""},
		{"d", "node d has no free DRBD port: every port of the controller's --port-range is held by a replica there"},
		{"b", "node b has no live meshvol agent (Lease meshvol-node-b is missing or expired)"},
		{"c", "node c already holds a replica of this volume"},
		{"x", "node x has no meshvol agent (no Lease meshvol-node-x)"},
	} {
		err := CheckAccess(tc.node, existing, nodes)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("CheckAccess(%s) = %q, want %q", tc.node, got, tc.want)
		}
	}
	_ = fmt.Sprint
}

// TestFitsIsWhatTheAgentAllocates: a node fits a Diskful replica exactly when its free
// space holds the backing volume the agent creates (data and DRBD metadata for
// v1.DRBDMaxPeers), and the CSI service's capacity answers (drbd.UsableBytes of the
// free space) agree: what they call the largest volume a node holds fits there.
func TestFitsIsWhatTheAgentAllocates(t *testing.T) {
	for _, size := range []int64{1 << 20, 64 << 20, 10 * gi, 1000 * gi} {
		b := BackingBytes(size)
		if b <= size {
			t.Errorf("BackingBytes(%d) = %d leaves no room for DRBD's metadata", size, b)
		}
		if !Fits(b, size) || Fits(b-1, size) {
			t.Errorf("size %d: Fits(%d) = %v, Fits(%d) = %v; want exactly the backing volume", size, b, Fits(b, size), b-1, Fits(b-1, size))
		}
		if u := drbd.UsableBytes(b, v1.DRBDMaxPeers); u < size || !Fits(b, u) {
			t.Errorf("size %d: %d free bytes hold %d usable bytes, which must fit there and be at least the size", size, b, u)
		}
	}
}
