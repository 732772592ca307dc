package controller_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/sharedsecret"
)

// A 3D volume from creation to Ready, attached, steady, then deleted with nothing left
// behind; the controller's writes are counted per step.
func TestVolumeLifecycle(t *testing.T) {
	// Every agent stays live throughout: the steady step counts the pool's writes too.
	cl := newClusterWith(t, clusterOptions{leaseSeconds: 10},
		nodeSpec{"a", "z1", 100}, nodeSpec{"b", "z2", 100}, nodeSpec{"c", "z3", 100}, nodeSpec{"d", "z1", 5})
	class := cl.class("3d", 1, 1, v1.TopologyTransZonal)
	mark := cl.writes.mark()
	rv := cl.volume("vol", class, "10Gi")
	var secretWrites []string
	step := func(name string) {
		ws := cl.writes.since(mark, rv.Name)
		t.Logf("writes: %-44s %s", name, summarizeWrites(ws))
		for _, w := range ws {
			if w.Kind == "Secret" {
				secretWrites = append(secretWrites, name+": "+w.Verb+" "+w.Name)
			}
		}
		mark = cl.writes.mark()
	}

	// Placement and allocation.
	var got *v1.ReplicatedVolume
	cl.eventually(t, "three Diskful replicas on a, b, c", func() (bool, string) {
		rs := cl.rvrs(rv.Name)
		var nodes []string
		for _, r := range rs {
			if r.Spec.Type != v1.ReplicaTypeDiskful || !slices.Contains(r.Finalizers, v1.FinalizerAgent) ||
				r.Labels[v1.LabelNode] != r.Spec.NodeName || r.Spec.Storage == nil || r.Spec.Storage.Pool != cl.pool {
				return false, fmt.Sprintf("replica %s is not a labelled, finalized Diskful replica: %+v", r.Name, r.Spec)
			}
			nodes = append(nodes, r.Spec.NodeName)
		}
		want := []string{cl.node("a"), cl.node("b"), cl.node("c")}
		got = cl.rv(rv.Name)
		return slices.Equal(nodes, want) && got.Status.Datamesh.SharedSecret != nil, fmt.Sprintf("replicas on %v, want %v; rv %s", nodes, want, phaseOf(got))
	})
	dm := got.Status.Datamesh
	if dm.Port != 0 || dm.Minor < 1000 || dm.SharedSecret.SecretName != v1.SecretDRBDKey || dm.SharedSecret.Key != v1.SecretKeyDRBDKey ||
		dm.SharedSecret.Derivation != v1.DerivationHMACSHA256 || dm.SharedSecret.Algorithm != "sha256" || dm.Size == nil || dm.Size.String() != "10Gi" {
		t.Fatalf("datamesh allocation: %+v", dm)
	}
	// The secret is derived from the cluster key, whose fingerprint the reference
	// carries; the volume has no Secret of its own (docs/contract.md, "The shared secret").
	key := &corev1.Secret{}
	must(t, cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: v1.SecretDRBDKey}, key))
	if k := key.Data[v1.SecretKeyDRBDKey]; len(k) != sharedsecret.KeyLen || dm.SharedSecret.KeyFingerprint != sharedsecret.Fingerprint(k) {
		t.Fatalf("cluster key: %d bytes, fingerprint %q in the reference, want 32 bytes of fingerprint %q",
			len(k), dm.SharedSecret.KeyFingerprint, sharedsecret.Fingerprint(k))
	}
	if err := cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: controller.SecretName(rv.Name)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Secret %s: %v, want none (the secret is derived)", controller.SecretName(rv.Name), err)
	}
	if !slices.Contains(got.Finalizers, v1.FinalizerController) {
		t.Fatalf("rv has no controller finalizer: %v", got.Finalizers)
	}
	if got.Status.Phase != v1.VolumePhaseForming {
		t.Fatalf("phase %s, want Forming (no agent confirmed anything yet)", phaseOf(got))
	}
	step("1 create: finalizer, allocation, 3 RVRs, members")

	// The agents report their addresses (the members joined with their nodes' Lease
	// addresses already: nothing to publish again).
	for _, r := range cl.rvrs(rv.Name) {
		cl.agentStatus(r.Name, map[string]any{"addresses": []any{"10.0.0.9"}})
	}
	cl.eventually(t, "members published", func() (bool, string) {
		got = cl.rv(rv.Name)
		return len(got.Status.Datamesh.Members) == 3 && got.Status.DatameshRevision > 0, phaseOf(got)
	})
	rev := got.Status.DatameshRevision
	ids := map[int32]bool{}
	for _, m := range got.Status.Datamesh.Members {
		ids[m.NodeID] = true
		if m.Type != v1.MemberTypeDiskful {
			t.Errorf("member %s is %s, want Diskful", m.Name, m.Type)
		}
	}
	for _, m := range got.Status.Datamesh.Members {
		if m.Port < 7000 || m.Port > 7999 {
			t.Errorf("member %s published with port %d, want its own in 7000-7999", m.Name, m.Port)
		}
	}
	if len(ids) != 3 || got.Status.Datamesh.Quorum != 2 || got.Status.Datamesh.QuorumMinimumRedundancy != 2 {
		t.Fatalf("node-ids %v q %d qmr %d", ids, got.Status.Datamesh.Quorum, got.Status.Datamesh.QuorumMinimumRedundancy)
	}
	time.Sleep(300 * time.Millisecond) // let follow-up reconciles land in this step's count
	step("2 addresses reported")

	// The agents confirm the revision and report UpToDate: formation completes.
	cl.agentConfirm(rv.Name, rev, nil)
	cl.eventually(t, "Ready", func() (bool, string) {
		got = cl.rv(rv.Name)
		return got.Status.Phase == v1.VolumePhaseReady, phaseOf(got)
	})
	if got.Status.Layout != "3D" || got.Status.ReadyMembers != "3/3" || got.Status.SyncProgress != "100%" {
		t.Errorf("kubectl columns: layout %q members %q sync %q", got.Status.Layout, got.Status.ReadyMembers, got.Status.SyncProgress)
	}
	time.Sleep(300 * time.Millisecond)
	step("3 revision confirmed, UpToDate: Ready")

	// Steady: Leases renew, nothing changes, nothing is written.
	// MESHVOL_STEADY=1m measures a whole steady minute.
	steady := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("MESHVOL_STEADY")); err == nil {
		steady = d
	}
	time.Sleep(steady)
	if ws := cl.writes.since(mark, rv.Name, cl.pool); len(ws) != 0 {
		t.Fatalf("a steady volume caused writes in %s (volume and pool): %v", steady, ws)
	}
	step(fmt.Sprintf("4 steady %s (Leases renewing)", steady))

	// Expansion: the new size is published as one revision.
	grown := cl.rv(rv.Name)
	grown.Spec.Size = resource.MustParse("20Gi")
	must(t, cl.c.Update(cl.ctx, grown))
	cl.eventually(t, "size 20Gi published", func() (bool, string) {
		got = cl.rv(rv.Name)
		return got.Status.Datamesh.Size.String() == "20Gi" && got.Status.DatameshRevision == rev+1,
			fmt.Sprintf("size %s revision %d", got.Status.Datamesh.Size, got.Status.DatameshRevision)
	})
	cl.agentConfirm(rv.Name, rev+1, nil)
	time.Sleep(300 * time.Millisecond)
	step("5 expand to 20Gi")

	// Attach on node a.
	rva := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: v1.AttachmentName(rv.Name, cl.node("a"))},
		Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: rv.Name, NodeName: cl.node("a")}}
	must(t, cl.c.Create(cl.ctx, rva))
	cl.eventually(t, "attached", func() (bool, string) {
		got = cl.rv(rv.Name)
		cl.agentConfirm(rv.Name, got.Status.DatameshRevision, nil)
		a := &v1.ReplicatedVolumeAttachment{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: rva.Name}, a))
		return a.Status.Phase == v1.AttachmentAttached && a.Status.DevicePath == "/dev/drbd-sim/"+rv.Name+"-"+cl.node("a") &&
				slices.Contains(a.Finalizers, v1.FinalizerController),
			fmt.Sprintf("rva %s %s %v", a.Status.Phase, a.Status.DevicePath, cond(a.Status.Conditions, v1.ConditionAttached))
	})
	time.Sleep(300 * time.Millisecond)
	step("6 attach (RVA finalizer, Attach, status)")

	// Delete while attached: it waits, and says so.
	must(t, cl.c.Delete(cl.ctx, rv))
	cl.eventually(t, "deletion waits for the attachment", func() (bool, string) {
		got = cl.rv(rv.Name)
		c := cond(got.Status.Conditions, v1.ConditionDeleting)
		return got.Status.Phase == v1.VolumePhaseDeleting && strings.Contains(c, "WaitingForDetach") && strings.Contains(c, rva.Name), c
	})
	if n := len(cl.rvrs(rv.Name)); n != 3 {
		t.Fatalf("replicas deleted while the volume is attached: %d left", n)
	}
	must(t, cl.c.Delete(cl.ctx, rva))
	cl.eventually(t, "volume gone", func() (bool, string) {
		if cur := cl.rv(rv.Name); cur != nil {
			cl.agentConfirm(rv.Name, cur.Status.DatameshRevision, nil)
			cl.agentReleaseDeleted(rv.Name)
			return false, phaseOf(cur) + " " + cond(cur.Status.Conditions, v1.ConditionDeleting)
		}
		return true, ""
	})
	step("7 detach and delete")
	if n := len(cl.rvrs(rv.Name)); n != 0 {
		t.Errorf("%d replicas left behind", n)
	}
	// A volume whose secret is derived costs no Secret write, at formation or deletion.
	if len(secretWrites) > 0 {
		t.Errorf("Secret writes for a volume whose secret is derived: %v", secretWrites)
	}
	err := cl.c.Get(cl.ctx, types.NamespacedName{Name: rva.Name}, &v1.ReplicatedVolumeAttachment{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("RVA left behind: %v", err)
	}
}

// The CSI service creates RVs and RVAs with the controller's finalizer already set (its
// field manager owns it then): the controller still removes it when it is done.
func TestFinalizerSetByCreator(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100})
	class := cl.class("one", 0, 0, v1.TopologyIgnored)
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: cl.prefix + "-csi", Finalizers: []string{v1.FinalizerController}},
		Spec: v1.ReplicatedVolumeSpec{Size: resource.MustParse("1Gi"), ReplicatedStorageClassName: class}}
	must(t, cl.c.Create(cl.ctx, rv, client.FieldOwner(v1.FieldManagerCSI)))
	cl.formed(rv.Name, 1)
	rva := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: rv.Name + "-a", Finalizers: []string{v1.FinalizerController}},
		Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: rv.Name, NodeName: cl.node("a")}}
	must(t, cl.c.Create(cl.ctx, rva, client.FieldOwner(v1.FieldManagerCSI)))
	cl.eventually(t, "attached", func() (bool, string) {
		cl.agentConfirm(rv.Name, cl.rv(rv.Name).Status.DatameshRevision, nil)
		a := &v1.ReplicatedVolumeAttachment{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: rva.Name}, a))
		return a.Status.Phase == v1.AttachmentAttached, string(a.Status.Phase)
	})
	must(t, cl.c.Delete(cl.ctx, rva))
	must(t, cl.c.Delete(cl.ctx, rv))
	cl.eventually(t, "both gone", func() (bool, string) {
		if cur := cl.rv(rv.Name); cur != nil {
			cl.agentConfirm(rv.Name, cur.Status.DatameshRevision, nil)
			cl.agentReleaseDeleted(rv.Name)
			return false, phaseOf(cur) + " " + cond(cur.Status.Conditions, v1.ConditionDeleting)
		}
		err := cl.c.Get(cl.ctx, types.NamespacedName{Name: rva.Name}, &v1.ReplicatedVolumeAttachment{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// A volume's replicas are deleted by name, never by their label: a replica of another
// volume labelled with this volume's name (by hand) survives the deletion
// (docs/controller.md, "Deletion").
func TestDeleteSparesAReplicaLabelledForAnother(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100})
	x := cl.volume("x", cl.class("2d", 0, 1, v1.TopologyIgnored), "1Gi")
	y := cl.volume("y", cl.class("1d", 0, 0, v1.TopologyIgnored), "1Gi")
	cl.formed(x.Name, 2)
	cl.formed(y.Name, 1)
	other := cl.rvrs(y.Name)[0]
	relabelled := other.DeepCopy()
	relabelled.Labels[v1.LabelVolume] = x.Name
	must(t, cl.c.Patch(cl.ctx, relabelled, client.MergeFrom(&other)))

	must(t, cl.c.Delete(cl.ctx, x))
	cl.eventually(t, x.Name+" gone", func() (bool, string) {
		if cur := cl.rv(x.Name); cur != nil {
			cl.agentReleaseDeleted(x.Name)
			return false, phaseOf(cur) + " " + cond(cur.Status.Conditions, v1.ConditionDeleting)
		}
		return true, ""
	})
	r := &v1.ReplicatedVolumeReplica{}
	must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: other.Name}, r))
	if r.DeletionTimestamp != nil {
		t.Fatalf("replica %s of %s, labelled for %s, was deleted with %s", r.Name, y.Name, x.Name, x.Name)
	}
}

// Deleting a volume whose agents tear down with it (CapabilityTearDownWithVolume): the
// controller deletes each replica only once its agent released it, a deletion that ends
// it at once, and at once the replica of a node whose agent does not announce it (an
// earlier version, which tears down on its replica's deletion). A replica its agent
// still holds teardownUnpublished (30 s) after the teardown began is deleted then, with
// the teardown published, so that the volume says what it waits for (docs/contract.md,
// "Deleting a volume").
func TestDeletionWaitsForAgentsToRelease(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100})
	rv := cl.volume("v", cl.class("3d", 1, 1, v1.TopologyIgnored), "1Gi")
	cl.formed(rv.Name, 3)
	cl.editLease("c", func(ann map[string]string) { ann[v1.AnnotationCapabilities] = v1.CapabilityDerivedSharedSecret })
	cl.controllerSeesAnnouncement("c", v1.CapabilityTearDownWithVolume, false)
	on := map[string]string{} // node (short) → its replica
	for _, r := range cl.rvrs(rv.Name) {
		on[strings.TrimPrefix(r.Spec.NodeName, cl.prefix+"-")] = r.Name
	}
	replica := func(node string) *v1.ReplicatedVolumeReplica {
		r := &v1.ReplicatedVolumeReplica{}
		if err := cl.c.Get(cl.ctx, types.NamespacedName{Name: on[node]}, r); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			t.Fatal(err)
		}
		return r
	}
	gone := func(node string) {
		t.Helper()
		cl.eventually(t, "the replica on "+node+" gone", func() (bool, string) {
			r := replica(node)
			return r == nil, replicaState(r)
		})
	}

	must(t, cl.c.Delete(cl.ctx, rv))
	began := time.Now()
	cl.eventually(t, "the replica on c (an earlier agent) deleted at once", func() (bool, string) {
		r := replica("c")
		return r != nil && r.DeletionTimestamp != nil, replicaState(r)
	})
	time.Sleep(2 * time.Second)
	for _, node := range []string{"a", "b"} {
		if r := replica(node); r == nil || r.DeletionTimestamp != nil {
			t.Fatalf("the replica on %s was deleted before its agent released it (%s)", node, replicaState(r))
		}
	}
	cl.releaseAgentFinalizer(*replica("a"))
	gone("a")
	cl.releaseAgentFinalizer(*replica("c"))
	gone("c")

	// Node b's agent holds its replica (a device held open, say).
	deadline := began.Add(45 * time.Second)
	for {
		cur, r := cl.rv(rv.Name), replica("b")
		if r.DeletionTimestamp != nil && len(cur.Status.Datamesh.Members) == 0 && strings.Contains(cond(cur.Status.Conditions, v1.ConditionDeleting), r.Name) {
			if waited := time.Since(began); waited < 29*time.Second {
				t.Fatalf("the replica on b deleted and the teardown published %s after the deletion, before its agent could release it", waited)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("45 s after the deletion the replica on b is not deleted with the teardown published: replica %s, %d members, %s",
				replicaState(r), len(cur.Status.Datamesh.Members), cond(cur.Status.Conditions, v1.ConditionDeleting))
		}
		time.Sleep(200 * time.Millisecond)
	}
	cl.releaseAgentFinalizer(*replica("b"))
	cl.eventually(t, "the volume gone", func() (bool, string) {
		if cur := cl.rv(rv.Name); cur != nil {
			return false, phaseOf(cur) + " " + cond(cur.Status.Conditions, v1.ConditionDeleting)
		}
		return true, ""
	})
}

// A finalizer of someone else's on a volume (a backup tool's hold, say) outlives the
// controller's: the controller tears the volume down and releases only its own, by a
// patch of the finalizer list (pkg/finalizer Release), and the volume stays, marked,
// until its other holder lets it go.
func TestDeletionKeepsAnotherFinalizer(t *testing.T) {
	const hold = "example.com/backup-hold"
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100})
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: cl.prefix + "-held", Finalizers: []string{hold}},
		Spec: v1.ReplicatedVolumeSpec{Size: resource.MustParse("1Gi"), ReplicatedStorageClassName: cl.class("3d", 1, 1, v1.TopologyIgnored)}}
	must(t, cl.c.Create(cl.ctx, rv))
	cl.formed(rv.Name, 3)
	must(t, cl.c.Delete(cl.ctx, rv))
	cl.eventually(t, "the replicas gone and only the other finalizer left", func() (bool, string) {
		cur := cl.rv(rv.Name)
		if cur == nil {
			return false, "the volume is gone with another's finalizer on it"
		}
		cl.agentReleaseDeleted(rv.Name)
		left := cl.rvrs(rv.Name)
		return len(left) == 0 && slices.Equal(cur.Finalizers, []string{hold}),
			fmt.Sprintf("%d replicas left, finalizers %v", len(left), cur.Finalizers)
	})
	cur := cl.rv(rv.Name)
	if cur.DeletionTimestamp == nil {
		t.Fatal("the volume lost its deletion mark")
	}
	cur.Finalizers = nil
	must(t, cl.c.Update(cl.ctx, cur))
	cl.eventually(t, "the volume gone once its other holder let it go", func() (bool, string) {
		return cl.rv(rv.Name) == nil, "still there"
	})
}

// replicaState is what a test of a replica's deletion says of it.
func replicaState(r *v1.ReplicatedVolumeReplica) string {
	if r == nil {
		return "gone"
	}
	return fmt.Sprintf("%s: deleted at %v, finalizers %v", r.Name, r.DeletionTimestamp, r.Finalizers)
}
