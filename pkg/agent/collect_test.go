package agent_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A replica gone from the agent's cache asks for a collector pass only when something
// of it may be left on the node (pkg/agent gc.go, released): none for a replica the
// agent took down and released itself; one for a replica force-removed — the
// controller released its finalizer and deleted it — and so for a replica created
// again under the name of one the agent released. The clock never runs the collector
// here: only the passes asked for do.
func TestCollectorPassOnlyWhereSomethingMayBeLeft(t *testing.T) {
	r := newRig(t, 3, func(c *agent.Config) { c.GCInterval = time.Hour })
	names := r.form3D()
	// Each agent's pass at its start is done once its Observer has synced, long
	// before the formation ends; a pass asked for runs within a second.
	time.Sleep(2 * time.Second)
	before := agent.CollectorPasses()

	// Node 1's replica leaves the datamesh and is deleted: its agent takes it down,
	// deletes its backing volume and releases it. Nothing is left; no pass runs.
	r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members = slices.Delete(st.Datamesh.Members, 1, 2) })
	first := r.rvr(names[1])
	r.must(r.cl.Delete(r.ctx, first))
	r.replicasGone(names[1:2])
	r.nothingLeftOn(1)
	time.Sleep(3 * time.Second)
	if n := agent.CollectorPasses() - before; n != 0 {
		t.Fatalf("%d collector passes after the agent took its replica down and released it, want 0", n)
	}

	// The same name again, a member again, then removed from the datamesh (its agent
	// takes its resource down and keeps its backing volume while it is not deleted)
	// and force-removed. Only a collector pass deletes that backing volume.
	r.addReplica(1, v1.ReplicaTypeDiskful)
	again := r.rvr(names[1])
	if again.UID == first.UID {
		t.Fatalf("the replica created again has the earlier one's UID %s", first.UID)
	}
	m := r.member(names[1], v1.MemberTypeDiskful, 1)
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members = append(st.Datamesh.Members, m) })
	r.confirmed(rev, v1.DiskStateUpToDate, names...)
	r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members = slices.DeleteFunc(st.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == names[1] })
	})
	r.eventually("node 1's resource taken down, its backing file kept", 30*time.Second, func() string {
		res, err := r.node(1).Resources(r.ctx)
		if err != nil || len(res) > 0 {
			return fmt.Sprintf("resources %v (%v)", res, err)
		}
		if !slices.ContainsFunc(r.node(1).Files(), func(f string) bool { return strings.Contains(f, uidPart(again.UID)) }) {
			return fmt.Sprintf("no backing file of the replica's UID %s among %v", again.UID, r.node(1).Files())
		}
		return ""
	})
	before = agent.CollectorPasses()
	r.releaseAndDelete(names[1])
	r.eventually("the force-removed replica's backing file deleted by a collector pass", 30*time.Second, func() string {
		if files := r.node(1).Files(); len(files) > 0 {
			return fmt.Sprintf("files %v", files)
		}
		return ""
	})
	if n := agent.CollectorPasses() - before; n < 1 {
		t.Fatalf("%d collector passes after the force removal, want at least 1", n)
	}
}

// A volume deleted with its replicas, as the controller deletes one (docs/contract.md,
// "Deleting a volume"): each agent takes its replica down and releases it on the
// volume's mark, while the replica still lives, and the replica's deletion follows
// (the test's here, a while after the mark; a replica deleted before its agent released
// it is released as a deleted one). No collector pass runs for any of them.
func TestNoCollectorPassAfterAVolumesDeletion(t *testing.T) {
	r := newRig(t, 3, func(c *agent.Config) { c.GCInterval = time.Hour })
	names := r.form3D()
	rv := r.holdVolume()
	time.Sleep(2 * time.Second) // the agents' passes at their start are done
	before := agent.CollectorPasses()
	r.must(r.cl.Delete(r.ctx, rv))
	time.Sleep(2 * time.Second)
	for _, n := range names {
		if err := r.cl.Delete(r.ctx, &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil && !apierrors.IsNotFound(err) {
			r.must(err)
		}
	}
	r.replicasGone(names)
	r.nothingLeftOnNodes()
	time.Sleep(3 * time.Second)
	if n := agent.CollectorPasses() - before; n != 0 {
		t.Fatalf("%d collector passes after the agents took their replicas of a deleted volume down and released them, want 0", n)
	}
}
