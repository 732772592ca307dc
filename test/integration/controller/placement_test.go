package controller_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/placement"
)

// Every layout forms up to the point where agents must confirm: the right replica types
// on the right nodes, members with the addresses their nodes' Leases publish, and the
// phase says what it waits for.
func TestFormationLayouts(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "z1", 100}, nodeSpec{"b", "z2", 100}, nodeSpec{"c", "z3", 100},
		nodeSpec{"d", "z1", 100}, nodeSpec{"e", "z2", 100}, nodeSpec{"f", "z3", 100}, nodeSpec{"g", "z1", 100})
	for _, tc := range []struct {
		name      string
		ftt, gmdr int32
		topo      v1.Topology
		want      string // replica types, sorted
	}{
		{"1d", 0, 0, v1.TopologyIgnored, "D"},
		{"2d", 0, 1, v1.TopologyIgnored, "D D"},
		{"2d1tb", 1, 0, v1.TopologyTransZonal, "D D TB"},
		{"3d", 1, 1, v1.TopologyZonal, "D D D"},
		{"4d1tb", 2, 1, v1.TopologyTransZonal, "D D D D TB"},
		{"5d", 2, 2, v1.TopologyIgnored, "D D D D D"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			class := cl.class(tc.name, tc.ftt, tc.gmdr, tc.topo)
			rv := cl.volume(tc.name, class, "1Gi")
			cl.eventually(t, "replicas of "+tc.want, func() (bool, string) {
				var types []string
				zones := map[string]int{}
				for _, r := range cl.rvrs(rv.Name) {
					ty := "D"
					if r.Spec.Type == v1.ReplicaTypeTieBreaker {
						ty = "TB"
					}
					types = append(types, ty)
					zones[zoneOf(r.Spec.NodeName, cl)]++
				}
				sort.Strings(types)
				got := strings.Join(types, " ")
				if got != tc.want {
					return false, got
				}
				if tc.topo == v1.TopologyZonal && len(zones) != 1 {
					return false, fmt.Sprintf("Zonal volume spans zones %v", zones)
				}
				if tc.topo == v1.TopologyTransZonal && len(zones) != 3 {
					return false, fmt.Sprintf("TransZonal volume in zones %v", zones)
				}
				cur := cl.rv(rv.Name)
				return cur.Status.Phase == v1.VolumePhaseForming && strings.Contains(cond(cur.Status.Conditions, v1.ConditionReady), "replicas confirmed revision 1"),
					phaseOf(cur)
			})
		})
	}
}

func zoneOf(node string, cl *cluster) string {
	n := strings.TrimPrefix(node, cl.prefix+"-")
	switch n {
	case "a", "d", "g":
		return "z1"
	case "b", "e":
		return "z2"
	}
	return "z3"
}

// A volume placement cannot serve says which rule failed, creates nothing, and is placed
// as soon as a node that fits arrives.
func TestPlacementRefusedThenRetried(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "z1", 100}, nodeSpec{"b", "z2", 100}, nodeSpec{"c", "z3", 5})
	class := cl.class("tz", 1, 1, v1.TopologyTransZonal)
	rv := cl.volume("vol", class, "10Gi")
	want := `TransZonal needs 3 zones with free capacity ≥ 10Gi in pool "` + cl.pool + `": zone z3 has none`
	cl.eventually(t, "a Scheduled=False condition naming the failed rule", func() (bool, string) {
		cur := cl.rv(rv.Name)
		c := cond(cur.Status.Conditions, v1.ConditionScheduled)
		return strings.Contains(c, "False/"+placement.ConstraintTransZonal) && strings.Contains(c, want), c
	})
	t.Logf("placement refusal: %s", cond(cl.rv(rv.Name).Status.Conditions, v1.ConditionScheduled))
	if n := len(cl.rvrs(rv.Name)); n != 0 {
		t.Fatalf("%d replicas created although placement refused: placement is all or nothing", n)
	}
	var evs eventList
	cl.eventually(t, "a PlacementFailed event", func() (bool, string) {
		evs = cl.events(rv.Name)
		return evs.has(controller.EventPlacementFailed, want), evs.String()
	})

	cl.addNode(nodeSpec{"d", "z3", 100})
	cl.eventually(t, "placed once zone z3 has room", func() (bool, string) {
		var nodes []string
		for _, r := range cl.rvrs(rv.Name) {
			nodes = append(nodes, r.Spec.NodeName)
		}
		want := []string{cl.node("a"), cl.node("b"), cl.node("d")}
		cur := cl.rv(rv.Name)
		return slices.Equal(nodes, want) && strings.HasPrefix(cond(cur.Status.Conditions, v1.ConditionScheduled), "True"),
			fmt.Sprintf("%v %s", nodes, cond(cur.Status.Conditions, v1.ConditionScheduled))
	})
}

// Bad input ends in a condition naming the field and the rule, and no partial state.
func TestBadInput(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "z1", 100}, nodeSpec{"b", "z1", 100})
	t.Run("missing class", func(t *testing.T) {
		rv := cl.volume("noclass", cl.prefix+"-nosuch", "1Gi")
		cl.eventually(t, "Configured=False", func() (bool, string) {
			cur := cl.rv(rv.Name)
			c := cond(cur.Status.Conditions, v1.ConditionConfigured)
			return strings.Contains(c, "False/StorageClassNotFound") &&
				strings.Contains(c, `spec.replicatedStorageClassName: storage class "`+cl.prefix+`-nosuch" does not exist`) &&
				cur.Status.Phase == v1.VolumePhasePending, c + " " + phaseOf(cur)
		})
		if n := len(cl.rvrs(rv.Name)); n != 0 {
			t.Fatalf("%d replicas for a volume without a class", n)
		}
	})
	t.Run("missing pool", func(t *testing.T) {
		ftt, gmdr := int32(0), int32(0)
		rsc := &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: cl.prefix + "-nopool"}, Spec: v1.ReplicatedStorageClassSpec{
			StoragePool: cl.prefix + "-nosuchpool", FailuresToTolerate: &ftt, GuaranteedMinimumDataRedundancy: &gmdr}}
		must(t, cl.c.Create(cl.ctx, rsc))
		rv := cl.volume("nopool", rsc.Name, "1Gi")
		cl.eventually(t, "Configured=False", func() (bool, string) {
			cur := cl.rv(rv.Name)
			c := cond(cur.Status.Conditions, v1.ConditionConfigured)
			return strings.Contains(c, "False/StoragePoolNotFound") && strings.Contains(c, "spec.storagePool: storage pool"), c
		})
	})
	t.Run("too big for any node", func(t *testing.T) {
		class := cl.class("big", 0, 1, v1.TopologyIgnored)
		rv := cl.volume("big", class, "500Gi")
		cl.eventually(t, "Scheduled=False for capacity", func() (bool, string) {
			cur := cl.rv(rv.Name)
			c := cond(cur.Status.Conditions, v1.ConditionScheduled)
			return strings.Contains(c, "False/"+placement.ConstraintCapacity) && strings.Contains(c, "free capacity ≥ 500Gi"), c
		})
		t.Logf("placement refusal: %s", cond(cl.rv(rv.Name).Status.Conditions, v1.ConditionScheduled))
		if n := len(cl.rvrs(rv.Name)); n != 0 {
			t.Fatalf("%d replicas created for a volume that fits nowhere", n)
		}
	})
	t.Run("layout the pool cannot hold", func(t *testing.T) {
		class := cl.class("three", 1, 1, v1.TopologyIgnored)
		rv := cl.volume("three", class, "1Gi")
		cl.eventually(t, "Scheduled=False: two nodes for three Diskful", func() (bool, string) {
			c := cond(cl.rv(rv.Name).Status.Conditions, v1.ConditionScheduled)
			return strings.Contains(c, "False/"+placement.ConstraintNodes) && strings.Contains(c, "need 3 Diskful replica(s) with free capacity ≥ 1Gi") && strings.Contains(c, "2 of 2 usable node(s) have room"), c
		})
		t.Logf("placement refusal: %s", cond(cl.rv(rv.Name).Status.Conditions, v1.ConditionScheduled))
		if n := len(cl.rvrs(rv.Name)); n != 0 {
			t.Fatalf("%d replicas half-created", n)
		}
	})
	t.Run("attachment on a node without an agent", func(t *testing.T) {
		class := cl.class("one", 0, 0, v1.TopologyIgnored)
		rv := cl.volume("att", class, "1Gi")
		cl.eventually(t, "one replica", func() (bool, string) { return len(cl.rvrs(rv.Name)) == 1, "" })
		for _, r := range cl.rvrs(rv.Name) {
			cl.agentStatus(r.Name, map[string]any{"addresses": []any{"10.0.0.1"}})
		}
		cl.eventually(t, "formed", func() (bool, string) {
			cur := cl.rv(rv.Name)
			cl.agentConfirm(rv.Name, cur.Status.DatameshRevision, nil)
			return cur.Status.Phase == v1.VolumePhaseReady, phaseOf(cur)
		})
		rva := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: rv.Name + "-ghost"},
			Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: rv.Name, NodeName: cl.prefix + "-ghost"}}
		must(t, cl.c.Create(cl.ctx, rva))
		cl.eventually(t, "the RVA says the node has no agent", func() (bool, string) {
			a := &v1.ReplicatedVolumeAttachment{}
			must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: rva.Name}, a))
			c := cond(a.Status.Conditions, v1.ConditionAttached)
			return a.Status.Phase == v1.AttachmentPending && strings.Contains(c, "has no meshvol agent (no Lease meshvol-node-"+cl.prefix+"-ghost)"), c
		})
	})
}

// The pool's status lists its eligible nodes with zone, readiness and capacity, and is
// rewritten only when something placement or a person cares about changes: a capacity
// drift below min(1 %, 1 GiB) is not written, a larger one and a lost agent are.
func TestPoolStatus(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{leaseSeconds: 10}, nodeSpec{"a", "z1", 100}, nodeSpec{"b", "z2", 100})
	rsp := func() *v1.ReplicatedStoragePool {
		p := &v1.ReplicatedStoragePool{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: cl.pool}, p))
		return p
	}
	cl.eventually(t, "two ready eligible nodes", func() (bool, string) {
		p := rsp()
		ok := len(p.Status.EligibleNodes) == 2
		for _, e := range p.Status.EligibleNodes {
			ok = ok && e.Ready && e.FreeCapacity != nil && e.FreeCapacity.Value() == 100<<30 && e.Zone != ""
		}
		return ok && strings.HasPrefix(cond(p.Status.Conditions, v1.ConditionReady), "True"), fmt.Sprintf("%+v", p.Status)
	})
	setFree := func(node string, free int64) {
		cl.editLease(node, func(ann map[string]string) {
			ann[v1.AnnotationPoolCapacityPrefix+cl.pool] = v1.PoolCapacity{Total: 1000 << 30, Free: free}.String()
		})
	}
	mark := cl.writes.settled(t, time.Second, cl.pool)
	setFree("a", 100<<30-512<<20) // 512Mi less: below 1 GiB (1 % of 1000Gi is 10Gi)
	time.Sleep(2 * time.Second)
	if ws := cl.writes.since(mark, cl.pool); len(ws) != 0 {
		t.Fatalf("a capacity drift below the threshold was written: %v", ws)
	}
	setFree("a", 90<<30)
	cl.eventually(t, "a 10Gi drift written", func() (bool, string) {
		p := rsp()
		return p.Status.EligibleNodes[0].FreeCapacity.Value() == 90<<30, p.Status.EligibleNodes[0].FreeCapacity.String()
	})
	cl.setRenew("b", false)
	cl.eventually(t, "b not ready once its agent is gone", func() (bool, string) {
		p := rsp()
		return !p.Status.EligibleNodes[1].Ready, fmt.Sprintf("%+v", p.Status.EligibleNodes[1])
	})
}

// A node whose agent has not reported the pool's capacity yet is eligible but not
// ready: an attachment there waits, and says so, until the report arrives — and the
// report alone must wake the volume. (It once did not: a Lease update that changed
// only capacity annotations woke only the volumes waiting for room, and the first
// report, which makes the node ready, is such an update; the attachment waited for
// an unrelated event.)
func TestAttachWaitsForTheNodesFirstPoolReport(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{leaseSeconds: 10}, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100}, nodeSpec{"d", "", 100})
	// Node d's agent has just started: no pool report yet.
	capacityKey := v1.AnnotationPoolCapacityPrefix + cl.pool
	cl.editLease("d", func(ann map[string]string) { delete(ann, capacityKey) })
	cl.eventually(t, "node d not ready in the pool", func() (bool, string) {
		p := &v1.ReplicatedStoragePool{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: cl.pool}, p))
		for _, e := range p.Status.EligibleNodes {
			if e.NodeName == cl.node("d") {
				return !e.Ready, fmt.Sprintf("%+v", e)
			}
		}
		return false, fmt.Sprintf("%+v", p.Status.EligibleNodes)
	})
	rv := cl.volume("vol", cl.class("2d1tb", 1, 0, v1.TopologyIgnored), "1Gi")
	cl.formed(rv.Name, 3) // 2D+1TB on a, b and c

	rva := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(rv.Name, cl.node("d"))},
		Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: rv.Name, NodeName: cl.node("d")}}
	must(t, cl.c.Create(cl.ctx, rva))
	attachment := func() string {
		a := &v1.ReplicatedVolumeAttachment{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: rva.Name}, a))
		return string(a.Status.Phase) + ": " + cond(a.Status.Conditions, v1.ConditionAttached)
	}
	notReady := "Node " + cl.node("d") + " is not ready in storage pool"
	cl.eventually(t, "the attachment waits for node d", func() (bool, string) {
		got := attachment()
		return strings.Contains(got, notReady), got
	})
	// The volume's status says it too. Past the 5 s for which the controller holds back
	// a status that moves only messages (docs/controller.md, "Write budget") nothing is
	// left for it to come back for, so only the report below can wake the volume.
	cl.eventually(t, "the volume's status says why d's replica waits", func() (bool, string) {
		cur := cl.rv(rv.Name)
		for _, r := range cur.Status.DatameshReplicaRequests {
			if strings.HasSuffix(r.Name, cl.node("d")) {
				return strings.Contains(r.Message, notReady), r.Message
			}
		}
		return false, fmt.Sprintf("%+v", cur.Status.DatameshReplicaRequests)
	})
	time.Sleep(6 * time.Second)
	cl.editLease("d", func(ann map[string]string) { ann[capacityKey] = capacityAnnotation(100) })
	cl.eventually(t, "the replica on node d joins once its agent reports the pool", func() (bool, string) {
		cur := cl.rv(rv.Name)
		return slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.NodeName == cl.node("d") }),
			attachment()
	})
}

// Placement sees every replica already on each node, as the controller counts them from
// its cache's events (not by listing a node's replicas per placement): volumes placed
// one after another spread over the nodes by their replicas, although one node has ten
// times the free space of the others; and a replica placed but not backed yet takes
// its size off its node's free space (the agent's report does not show it yet), so a
// volume that fits a node only while those replicas are not counted goes elsewhere.
func TestPlacementCountsEachNodesReplicas(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 1000}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100})
	class := cl.class("1d", 0, 0, v1.TopologyIgnored)
	place := func(name, size string) string {
		t.Helper()
		rv := cl.volume(name, class, size)
		var node string
		cl.eventually(t, rv.Name+" placed", func() (bool, string) {
			rs := cl.rvrs(rv.Name)
			if len(rs) != 1 {
				return false, fmt.Sprintf("%d replicas", len(rs))
			}
			node = strings.TrimPrefix(rs[0].Spec.NodeName, cl.prefix+"-")
			return true, ""
		})
		return node
	}
	count := map[string]int{}
	for i := range 6 {
		count[place(fmt.Sprintf("small-%d", i), "1Gi")]++
	}
	if count["a"] != 2 || count["b"] != 2 || count["c"] != 2 {
		t.Fatalf("six volumes placed one after another on %v, want two on each node (the fewest replicas first)", count)
	}
	// Each node has two replicas of 1Gi not backed yet. 60Gi volumes: the first goes
	// to a (most free), the next two to b and c (fewest replicas), the fourth to a
	// (the most free again); the fifth fits b and c only if their unbacked 60Gi
	// replicas are not counted (100 - 2 - 60 < 60), so it goes to a, with more
	// replicas.
	var got []string
	for i := range 5 {
		got = append(got, place(fmt.Sprintf("large-%d", i), "60Gi"))
	}
	if got[0] != "a" || got[3] != "a" || got[4] != "a" || !slices.Contains(got[1:3], "b") || !slices.Contains(got[1:3], "c") {
		t.Fatalf("five 60Gi volumes placed on %v, want a, then b and c, then a, a", got)
	}
}
