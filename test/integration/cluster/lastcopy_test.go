package cluster_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestLostNodeKeepsTheLastCopy: every node holding a copy of the volume
// crashes (1D: its one node; 2D: both). The nodes are lost after the Lease and
// the grace period, but no member is force-removed, however long they stay
// away (docs/controller.md, "The last copy"): the replica objects stay and
// the requests say why. When the nodes are back, the requests are withdrawn.
// Each volume, attached and written before the crash, attaches again and reads it
// back: a lone returning disk comes back UpToDate, as on DRBD 9.2.18 without a
// fencing policy (test/vm/FINDINGS.md 7), so 1D's only copy promotes again.
func TestLostNodeKeepsTheLastCopy(t *testing.T) {
	for _, l := range layoutsNamed("1D", "2D") {
		t.Run(l.slug(), func(t *testing.T) {
			r := newRig(t)
			vol := "lastcopy-" + l.slug()
			var nodes []string
			for _, m := range r.formed(vol, l).Status.Datamesh.Members {
				nodes = append(nodes, m.NodeName)
			}
			data := bytes.Repeat([]byte("last copy "), 410)[:4096]
			r.attach(vol, nodes[0])
			r.must(r.c.Node(nodes[0]).Sim.Write(r.ctx, vol, 0, data))
			for _, n := range nodes {
				r.must(r.c.CrashNode(n))
				t.Cleanup(func() { _ = r.c.RestartNode(n) })
			}
			for _, n := range nodes {
				r.lost(vol, n)
			}
			r.eventually("the force removals blocked", time.Minute, func() string { return r.lastCopyKept(vol, nodes) })
			// Three more grace periods (this cluster's is 3 s) of the
			// controller's looks: still there.
			for end := time.Now().Add(9 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
				if why := r.lastCopyKept(vol, nodes); why != "" {
					t.Fatal(why)
				}
			}

			for _, n := range nodes {
				r.must(r.c.RestartNode(n))
			}
			r.eventually("the ForceLeave requests withdrawn", time.Minute, func() string {
				for _, q := range r.rv(vol).Status.DatameshReplicaRequests {
					if q.Operation == v1.ReplicaOperationForceLeave {
						return "request " + q.Name + " " + string(q.Operation) + ": " + q.Message
					}
				}
				for _, rvr := range r.rvrs(vol) {
					if !meta.IsStatusConditionTrue(rvr.Status.Conditions, v1.ConditionAgentReady) {
						return "AgentReady of " + rvr.Name + " not True yet"
					}
				}
				return ""
			})
			r.attached(vol, nodes[0], time.Minute)
			got, err := r.c.Node(nodes[0]).Sim.Read(r.ctx, vol, 0, len(data))
			r.must(err)
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %q…, wrote %q…", got[:20], data[:20])
			}
			r.detach(vol, nodes[0])
			r.deleteVolume(vol)
		})
	}
}

// lastCopyKept: every member on nodes is still in the datamesh, no force
// removal started, no replica is being deleted, and a ForceLeave request says
// it waits for a copy; else what is wrong.
func (r *rig) lastCopyKept(vol string, nodes []string) string {
	rv := r.rv(vol)
	for _, n := range nodes {
		if !slices.ContainsFunc(rv.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.NodeName == n }) {
			return fmt.Sprintf("the member on %s left the datamesh: members %+v", n, rv.Status.Datamesh.Members)
		}
	}
	for _, tr := range rv.Status.DatameshTransitions {
		if tr.Type == v1.TransitionForceRemoveReplica {
			return "a " + string(tr.Type) + " of " + tr.ReplicaName + " started"
		}
	}
	for _, rvr := range r.rvrs(vol) {
		if rvr.DeletionTimestamp != nil {
			return "replica " + rvr.Name + " is being deleted"
		}
	}
	blocked := 0
	for _, q := range rv.Status.DatameshReplicaRequests {
		if q.Operation == v1.ReplicaOperationForceLeave && strings.Contains(q.Message, "no other member holds an UpToDate copy") {
			blocked++
		}
	}
	if blocked != len(nodes) {
		return fmt.Sprintf("%d of %d ForceLeave requests say they wait for a copy: %+v", blocked, len(nodes), rv.Status.DatameshReplicaRequests)
	}
	return ""
}
