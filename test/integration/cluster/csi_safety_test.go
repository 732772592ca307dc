package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/csi"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// What a CSI controller answer promises, checked against the simulated kernels rather
// than against the code path that answers: whatever change makes an RPC answer early,
// these fail.
//
//   - ControllerPublishVolume succeeds only once the RVA is Attached with a device
//     path and the node's DRBD is Primary: the kubelet stages the volume at once. The
//     answer carries no device path (NodeStage reads its own node's RVR, never a path
//     the CO kept).
//   - ControllerExpandVolume succeeds only once every diskful replica's DRBD device
//     has the new size — whichever replica lags (the first, a middle or the last in
//     the datamesh's order), since a loop that checks some of them passes when the
//     laggard is one it skips.

func (r *rig) csiController() *csi.Controller {
	r.t.Helper()
	cl, err := csi.NewControllerClient(r.ctx, r.c.Env.Config, r.c.Env.Scheme, r.c.Namespace)
	r.must(err)
	return &csi.Controller{Client: cl, Namespace: r.c.Namespace}
}

var singleWriterMount = &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}

// publishKept checks the publish promise for an answer: an error, or an Attached RVA
// with a device path on a node whose DRBD is Primary, and no device path in the answer.
func (r *rig) publishKept(vol, node string, res *csipb.ControllerPublishVolumeResponse, err error) error {
	if err != nil {
		return nil
	}
	rva := &v1.ReplicatedVolumeAttachment{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: v1.AttachmentName(vol, node)}, rva))
	dev := rva.Status.DevicePath
	switch role := r.role(vol, node); {
	case len(res.GetPublishContext()) != 0:
		return fmt.Errorf("ControllerPublishVolume answered a publish context %v: a path the CO keeps may be stale when NodeStage gets it", res.GetPublishContext())
	case dev == "":
		return fmt.Errorf("ControllerPublishVolume succeeded without a device path on the RVA (RVA phase %s, DRBD %s)", rva.Status.Phase, role)
	case role != "Primary":
		return fmt.Errorf("ControllerPublishVolume succeeded with %s while the node's DRBD is %s (RVA phase %s)", dev, role, rva.Status.Phase)
	case rva.Status.Phase != v1.AttachmentAttached:
		return fmt.Errorf("ControllerPublishVolume succeeded with %s while the RVA is %s", dev, rva.Status.Phase)
	}
	return nil
}

// ControllerPublishVolume does not answer while the attachment is still Attaching:
// the node's promotion is refused (injected), the call times out saying so; once the
// promotion goes through, it answers.
func TestPublishAnswersOnlyWhenAttached(t *testing.T) {
	r := newRig(t)
	const vol = "publish-safety"
	r.volume(vol, r.class(0, 1, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			r.deleteVolume(vol) // the suite's later scenarios check for leftovers
		}
	})
	node := rv.Status.Datamesh.Members[0].NodeName
	cs := r.csiController()
	req := &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: node, VolumeCapability: singleWriterMount}

	sim := r.c.Node(node).Sim
	sim.InjectFault("primary", drbdsim.Fault{Err: errors.New(vol + ": State change failed: (-2) Need access to UpToDate data")})
	ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	res, err := cs.ControllerPublishVolume(ctx, req)
	cancel()
	sim.ClearFault("primary")
	if bad := r.publishKept(vol, node, res, err); bad != nil {
		t.Fatal(bad)
	}
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("with the promotion refused: %v, want DeadlineExceeded", err)
	}
	t.Logf("promotion refused: %v", err)

	res, err = cs.ControllerPublishVolume(r.ctx, req)
	r.must(err)
	if bad := r.publishKept(vol, node, res, err); bad != nil {
		t.Fatal(bad)
	}
	_, err = cs.ControllerUnpublishVolume(r.ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: node})
	r.must(err)
	r.deleteVolume(vol)
}

// expandKept checks the expansion promise for an answer: an error, or every diskful
// member has confirmed the datamesh that publishes the size (its agent saw its DRBD
// device grow) and its DRBD device is at least as large as asked.
func (r *rig) expandKept(vol string, want int64, err error) error {
	if err != nil {
		return nil
	}
	rv := r.rv(vol)
	for _, m := range rv.Status.Datamesh.Members {
		if !m.Type.HasDisk() {
			continue
		}
		st, err := r.c.Node(m.NodeName).Sim.Status(r.ctx, vol)
		if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
			return fmt.Errorf("ControllerExpandVolume to %d bytes succeeded while %s's DRBD does not run the volume (%v)", want, m.Name, err)
		}
		if kib := st[0].Devices[0].Size; kib*1024 < want {
			return fmt.Errorf("ControllerExpandVolume to %d bytes succeeded while %s's DRBD device has %d bytes", want, m.Name, kib*1024)
		}
		rvr := &v1.ReplicatedVolumeReplica{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: m.Name}, rvr))
		if rvr.Status.DatameshRevision < rv.Status.DatameshRevision {
			return fmt.Errorf("ControllerExpandVolume to %d bytes succeeded while %s has not confirmed revision %d (it reports %d)",
				want, m.Name, rv.Status.DatameshRevision, rvr.Status.DatameshRevision)
		}
	}
	return nil
}

// ControllerExpandVolume with one diskful replica lagging — each of the three in
// turn — does not report success; once it catches up, it does, and then every replica
// has confirmed the new size and every device has grown. The laggard's agent cannot
// read back what its kernel runs (drbdsetup show hangs, injected), so it confirms
// nothing; its backing volume grows all the same, so the other two replicas' resize
// grows the connected resource and they confirm, and only a check of every diskful
// replica sees the one that did not.
func TestExpandAnswersOnlyWhenEveryReplicaGrew(t *testing.T) {
	r := newRig(t)
	const vol = "expand-safety-3d"
	r.volume(vol, r.class(1, 1, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	t.Cleanup(func() {
		if t.Failed() {
			r.deleteVolume(vol) // the suite's later scenarios check for leftovers
		}
	})
	cs := r.csiController()
	for i, m := range rv.Status.Datamesh.Members {
		if !m.Type.HasDisk() {
			continue
		}
		// 16 MiB beyond the largest DRBD device now, so that every replica must
		// resize (a backing volume may hold more than the volume's size).
		size := r.rv(vol).Spec.Size.Value()
		for _, d := range rv.Status.Datamesh.Members {
			if st, err := r.c.Node(d.NodeName).Sim.Status(r.ctx, vol); err == nil && len(st) == 1 && len(st[0].Devices) == 1 && d.Type.HasDisk() {
				size = max(size, st[0].Devices[0].Size*1024)
			}
		}
		size = (size>>20 + 16) << 20
		req := &csipb.ControllerExpandVolumeRequest{VolumeId: vol, CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, VolumeCapability: singleWriterMount}
		sim := r.c.Node(m.NodeName).Sim
		sim.InjectFault("show", drbdsim.Fault{Hang: true})
		ctx, cancel := context.WithTimeout(r.ctx, 6*time.Second)
		_, err := cs.ControllerExpandVolume(ctx, req)
		cancel()
		sim.ClearFault("show")
		if bad := r.expandKept(vol, size, err); bad != nil {
			t.Fatalf("member %d (%s) lagging: %v", i, m.Name, bad)
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("member %d (%s) lagging: %v, want DeadlineExceeded", i, m.Name, err)
		}
		t.Logf("member %d (%s) lagging: %v", i, m.Name, err)
		_, err = cs.ControllerExpandVolume(r.ctx, req)
		r.must(err)
		if bad := r.expandKept(vol, size, err); bad != nil {
			t.Fatal(bad)
		}
		r.ready(vol, 2*time.Minute)
	}
	r.deleteVolume(vol)
}
