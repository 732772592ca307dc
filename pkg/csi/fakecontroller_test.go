package csi

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// playController does, on the real apiserver, what docs/contract.md says the
// controller does for the CSI service: form a volume (members on the first D nodes of
// the pool, RVRs with backing volumes, revision 1), grow it, attach and detach RVAs and
// remove its finalizers. Volumes of a class named "slow-*" are left alone until
// release(rv) is called, to test deadlines and the in-flight guard; those of a class
// named "full-*" are refused their DRBD port, as when the controller's port range is
// full.
type playController struct {
	cl       client.Client
	nodes    []string
	mu       sync.Mutex
	released map[string]bool
}

func (p *playController) release(rv string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.released[rv] = true
}

func (p *playController) held(rv *v1.ReplicatedVolume) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.HasPrefix(rv.Spec.ReplicatedStorageClassName, "slow-") && !p.released[rv.Name]
}

func startPlayController(t *testing.T, nodes []string) *playController {
	p := &playController{cl: env.Client, nodes: nodes, released: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := p.step(ctx); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
				t.Logf("play controller: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func (p *playController) step(ctx context.Context) error {
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := p.cl.List(ctx, &rvas); err != nil {
		return err
	}
	attached := map[string]bool{}
	for i := range rvas.Items {
		a := &rvas.Items[i]
		attached[a.Spec.ReplicatedVolumeName] = true
		switch {
		case a.DeletionTimestamp != nil:
			a.Finalizers = nil
			if err := p.cl.Update(ctx, a); err != nil {
				return err
			}
		case len(a.Finalizers) == 0:
			a.Finalizers = []string{v1.FinalizerController}
			if err := p.cl.Update(ctx, a); err != nil {
				return err
			}
		case a.Status.Phase != v1.AttachmentAttached:
			a.Status.Phase = v1.AttachmentAttached
			a.Status.DevicePath = "/dev/drbd-" + a.Spec.ReplicatedVolumeName
			if err := p.cl.Status().Update(ctx, a); err != nil {
				return err
			}
		}
	}
	var rvs v1.ReplicatedVolumeList
	if err := p.cl.List(ctx, &rvs); err != nil {
		return err
	}
	for i := range rvs.Items {
		rv := &rvs.Items[i]
		if err := p.volume(ctx, rv, attached[rv.Name]); err != nil {
			return err
		}
	}
	return nil
}

func (p *playController) volume(ctx context.Context, rv *v1.ReplicatedVolume, attached bool) error {
	if rv.DeletionTimestamp != nil {
		if attached {
			return nil
		}
		var rvrs v1.ReplicatedVolumeReplicaList
		if err := p.cl.List(ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: rv.Name}); err != nil {
			return err
		}
		for i := range rvrs.Items {
			if err := p.cl.Delete(ctx, &rvrs.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
		}
		rv.Finalizers = nil
		return p.cl.Update(ctx, rv)
	}
	if len(rv.Finalizers) == 0 {
		rv.Finalizers = []string{v1.FinalizerController}
		return p.cl.Update(ctx, rv)
	}
	if p.held(rv) {
		return nil
	}
	if strings.HasPrefix(rv.Spec.ReplicatedStorageClassName, "full-") {
		if meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionAllocated) != nil {
			return nil
		}
		meta.SetStatusCondition(&rv.Status.Conditions, metav1.Condition{Type: v1.ConditionAllocated, Status: metav1.ConditionFalse,
			Reason: v1.ReasonPortsExhausted, Message: "status.datamesh.port: no free DRBD port in 7000-7001: each volume holds one port of the range, unique across the cluster, so it holds at most 2 volumes and every one is taken"})
		return p.cl.Status().Update(ctx, rv)
	}
	var rsc v1.ReplicatedStorageClass
	if err := p.cl.Get(ctx, client.ObjectKey{Name: rv.Spec.ReplicatedStorageClassName}, &rsc); err != nil {
		return err
	}
	l, err := classLayout(&rsc)
	if err != nil {
		return err
	}
	size := rv.Spec.Size.Value()
	if rv.Status.DatameshRevision == 0 {
		var members []v1.DatameshMember
		for i, n := range p.nodes[:l.DiskfulCount()] {
			name := v1.ReplicaName(rv.Name, n)
			if err := p.replica(ctx, rv.Name, n, size, 1); err != nil {
				return err
			}
			members = append(members, v1.DatameshMember{Name: name, Type: v1.MemberTypeDiskful, NodeName: n, NodeID: int32(i)})
		}
		rv.Status.DatameshRevision = 1
		rv.Status.Datamesh.Members = members
		rv.Status.Datamesh.Size = resource.NewQuantity(size, resource.BinarySI)
		rv.Status.Configuration = &v1.ReplicatedVolumeConfiguration{StoragePool: rsc.Spec.StoragePool,
			FailuresToTolerate: int32(l.FTT), GuaranteedMinimumDataRedundancy: int32(l.GMDR), VolumeAccess: rsc.Spec.VolumeAccess}
		rv.Status.Layout = l.String()
		meta.SetStatusCondition(&rv.Status.Conditions, metav1.Condition{Type: v1.ConditionFormed, Status: metav1.ConditionTrue,
			Reason: v1.ReasonFormed, Message: "The first datamesh is in place"})
		return p.cl.Status().Update(ctx, rv)
	}
	if rv.Status.Datamesh.Size.Value() < size {
		// The new size is a new revision; each replica confirms it once grown.
		rev := rv.Status.DatameshRevision + 1
		rv.Status.Datamesh.Size = resource.NewQuantity(size, resource.BinarySI)
		rv.Status.DatameshRevision = rev
		if err := p.cl.Status().Update(ctx, rv); err != nil {
			return err
		}
		for _, m := range rv.Status.Datamesh.Members {
			if err := p.replica(ctx, rv.Name, m.NodeName, size, rev); err != nil {
				return err
			}
		}
	}
	return nil
}

// replica creates or grows the RVR of rv on node with a backing volume for size,
// confirming datamesh revision rev.
func (p *playController) replica(ctx context.Context, rv, node string, size int64, rev int64) error {
	r := &v1.ReplicatedVolumeReplica{}
	name := v1.ReplicaName(rv, node)
	err := p.cl.Get(ctx, client.ObjectKey{Name: name}, r)
	if apierrors.IsNotFound(err) {
		r = &v1.ReplicatedVolumeReplica{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelVolume: rv, v1.LabelNode: node}},
			Spec:       v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: rv, NodeName: node, Type: v1.ReplicaTypeDiskful},
		}
		err = p.cl.Create(ctx, r)
	}
	if err != nil {
		return err
	}
	backing := size + drbd.InternalMetadataBytes(size, v1.DRBDMaxPeers)
	r.Status.DiskState = v1.DiskStateUpToDate
	r.Status.Role = v1.RoleSecondary
	r.Status.DatameshRevision = rev
	r.Status.BackingVolume = &v1.BackingVolumeStatus{Name: rv, DevicePath: "/dev/vg/" + rv, Size: *resource.NewQuantity(backing, resource.BinarySI)}
	return p.cl.Status().Update(ctx, r)
}

// setupPool makes a File pool whose eligible nodes have the given free bytes, a
// class per layout on it, and an agent Lease for each node.
func setupPool(t *testing.T, ctx context.Context, pool string, free map[string]int64) {
	t.Helper()
	rsp := &v1.ReplicatedStoragePool{ObjectMeta: metav1.ObjectMeta{Name: pool},
		Spec: v1.ReplicatedStoragePoolSpec{Type: v1.PoolTypeFile, File: &v1.FilePool{Directory: "/var/lib/meshvol"}}}
	must(t, env.Client.Create(ctx, rsp))
	for n, f := range free {
		rsp.Status.EligibleNodes = append(rsp.Status.EligibleNodes, v1.EligibleNode{NodeName: n, Zone: "zone-" + n, Ready: true,
			FreeCapacity: resource.NewQuantity(f, resource.BinarySI), TotalCapacity: resource.NewQuantity(f, resource.BinarySI)})
	}
	must(t, env.Client.Status().Update(ctx, rsp))
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1.DefaultNamespace}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for n := range free {
		le := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: v1.DefaultNamespace, Name: v1.AgentLeasePrefix + n},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n)}}
		if err := env.Client.Create(ctx, le); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

func makeRSC(t *testing.T, ctx context.Context, name, pool string, repl v1.Replication, access v1.VolumeAccess) {
	t.Helper()
	must(t, env.Client.Create(ctx, &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ReplicatedStorageClassSpec{StoragePool: pool, Replication: &repl, VolumeAccess: access}}))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var _ = fmt.Sprint
