package soak_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// A disk that fails after formation (seeds 68, 70 and 73 of the campaign of
// 2026-11-28 03:45; docs/datamesh.md, "A disk that fails after formation"): DRBD
// detaches it after an I/O error and the member runs on diskless. The volume stayed
// "Degraded: 1/2 Diskful UpToDate … Diskless" for good. It is now replaced, add before
// remove, while another Diskful connected to it is UpToDate, and kept while none is.

// TestADiskThatFailsAfterFormationIsReplaced: a formed 3D volume whose workload writes
// loses the disk of a Diskful member that is not attached; a formed 2D+1TB loses the
// disk of the attached member, whose workload writes on through its peers. Each must
// end Ready with a replacement Diskful UpToDate on another node, the failed replica
// gone from the Diskful members (deleted, or an Access member where it is attached),
// every acknowledged write read back and the UpToDate replicas identical.
func TestADiskThatFailsAfterFormationIsReplaced(t *testing.T) {
	needs(t)
	t.Parallel()
	w := startRepro(t)
	for _, tc := range []struct {
		l            layout
		failAttached bool
	}{{layouts[3], false}, {layouts[2], true}} {
		v := w.createLayout(tc.l)
		if why := w.waitReady(v.name, 2*time.Minute); why != "Ready" {
			t.Fatal(why)
		}
		before := diskfulNodes(w, v.name)
		w.attachOn(v, before[0])
		if v.sess == nil {
			w.step("settle: %s", w.activate(v, time.Minute))
		}
		if v.sess == nil {
			w.fail("%s: not attached on %s", v.name, before[0])
		}
		time.Sleep(2 * time.Second) // the workload writes
		failing := before[1]
		if tc.failAttached {
			failing = before[0]
		}
		if err := w.c.FailDisk(failing, v.name); err != nil {
			t.Fatal(err)
		}
		w.failedDisks[v.name+"/"+failing] = true
		w.step("fail the disk of %s on %s", v.name, failing)
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
			w.checkNow()
		}
		if why := w.waitReady(v.name, 3*time.Minute); why != "Ready" {
			w.fail("%s after the disk of %s failed: %s", v.name, failing, why)
		}
		w.checkNow()
		after := diskfulNodes(w, v.name)
		if slices.Contains(after, failing) || len(after) != len(before) {
			w.fail("%s: Diskful members on %v after the disk of %s failed (before: %v): want %d, %s not among them",
				v.name, after, failing, before, len(before), failing)
		}
		rv := getRV(w, v.name)
		failed := v1.ReplicaName(v.name, failing)
		for _, m := range rv.Status.Datamesh.Members {
			if m.Name == failed && (!tc.failAttached || m.Type != v1.MemberTypeAccess || !m.Attached) {
				w.fail("%s: the failed replica %s is still a member of type %s (attached %v)", v.name, failed, m.Type, m.Attached)
			}
		}
		w.step("%s: Ready, Diskful on %v (was %v)", v.name, after, before)
		w.step("%s: %s", v.name, w.deactivate(v))
		w.sameReplicas(v)
		w.step("remount %s: %s", v.name, w.activate(v, time.Minute))
		if v.sess == nil {
			w.fail("%s does not mount again on %s", v.name, v.node)
		}
		w.step("%s: %s", v.name, w.detachVol(v))
	}
	t.Logf("history:\n  %s", strings.Join(w.history, "\n  "))
}

// TestAFailedDiskThatMayHoldTheOnlyCopyIsKept: a formed 2D+1TB volume, written to; the
// node of one Diskful crashes, then the disk of the other fails. The failed disk may
// hold the only current copy (the crashed node's agent reports nothing, so its copy
// counts for nothing): no replica is deleted or created, the failed member stays, and
// the volume says why in its Ready condition and once in a Warning event.
func TestAFailedDiskThatMayHoldTheOnlyCopyIsKept(t *testing.T) {
	needs(t)
	t.Parallel()
	w := startRepro(t)
	v := w.createLayout(layouts[2]) // 2D+1TB
	if why := w.waitReady(v.name, 2*time.Minute); why != "Ready" {
		t.Fatal(why)
	}
	diskful := diskfulNodes(w, v.name)
	w.attachOn(v, diskful[0])
	if v.sess == nil {
		w.step("settle: %s", w.activate(v, time.Minute))
	}
	time.Sleep(2 * time.Second) // the workload writes
	w.step("%s: %s", v.name, w.detachVol(v))
	replicas := func() (names []string) {
		var rvrs v1.ReplicatedVolumeReplicaList
		if err := w.c.Client.List(w.ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: v.name}); err != nil {
			t.Fatal(err)
		}
		for _, r := range rvrs.Items {
			name := r.Name + " " + string(r.Spec.Type)
			if r.DeletionTimestamp != nil {
				name += " (deleting)"
			}
			names = append(names, name)
		}
		slices.Sort(names)
		return names
	}
	was := replicas()
	crashed, failing := diskful[1], diskful[0]
	if err := w.c.CrashNode(crashed); err != nil {
		t.Fatal(err)
	}
	w.crashed[crashed] = true
	w.step("crash %s", crashed)
	// The disk fails once the survivor reports the crashed peer gone: before that, a
	// disk failing beside a Connected UpToDate peer holds nothing the peer lacks, and
	// is replaced (docs/datamesh.md, "A disk that fails after formation").
	survivor := v1.ReplicaName(v.name, failing)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		r := &v1.ReplicatedVolumeReplica{}
		if err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: survivor}, r); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(r.Status.Peers, func(p v1.PeerStatus) bool {
			return p.Name == v1.ReplicaName(v.name, crashed) && p.ConnectionState == "Connected"
		}) {
			break
		}
		if time.Now().After(deadline) {
			w.fail("%s still reports %s Connected a minute after its node crashed", survivor, crashed)
		}
	}
	if err := w.c.FailDisk(failing, v.name); err != nil {
		t.Fatal(err)
	}
	w.failedDisks[v.name+"/"+failing] = true
	w.step("fail the disk of %s on %s", v.name, failing)
	// Past the agent grace period: the crashed node's agent is marked not ready, and
	// its member is held as the last copy too (docs/controller.md, "The last copy").
	for end := time.Now().Add(reproGracePeriod + 10*time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if now := replicas(); !slices.Equal(now, was) {
			w.fail("%s: replicas %v after the disk of the only reporting Diskful failed, were %v: nothing may be created or deleted", v.name, now, was)
		}
		w.checkNow()
	}
	rv := getRV(w, v.name)
	failed := v1.ReplicaName(v.name, failing)
	if !slices.ContainsFunc(rv.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == failed && m.Type == v1.MemberTypeDiskful }) {
		w.fail("%s: the failed replica %s is no longer a Diskful member: %+v", v.name, failed, rv.Status.Datamesh.Members)
	}
	c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionReady)
	if c == nil || !strings.Contains(c.Message, failed+": Diskless (its disk failed and is not replaced: no other Diskful connected to it is UpToDate") {
		w.fail("%s: the Ready condition does not say why the failed disk stays: %+v", v.name, c)
	}
	w.step("%s: %s: %s", v.name, c.Reason, c.Message)
	var events corev1.EventList
	if err := w.c.Client.List(w.ctx, &events); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		if e.InvolvedObject.Name == v.name && e.Reason == controller.EventDiskFailedNotReplaced {
			n += max(1, int(e.Count))
		}
	}
	if n != 1 {
		w.fail("%s: %d %s events, want 1", v.name, n, controller.EventDiskFailedNotReplaced)
	}
	t.Logf("history:\n  %s", strings.Join(w.history, "\n  "))
}

// diskfulNodes are the nodes of the volume's Diskful members, sorted.
func diskfulNodes(w *world, name string) (nodes []string) {
	for _, m := range getRV(w, name).Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful {
			nodes = append(nodes, m.NodeName)
		}
	}
	slices.Sort(nodes)
	return nodes
}

func getRV(w *world, name string) *v1.ReplicatedVolume {
	rv := &v1.ReplicatedVolume{}
	if err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: name}, rv); err != nil {
		w.fail("%s: %v", name, err)
	}
	return rv
}
