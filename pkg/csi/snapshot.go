package csi

import (
	"context"
	"fmt"
	"sort"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Snapshots are ReplicatedVolumeSnapshots (docs/snapshots.md): CreateSnapshot creates
// one and waits until the controller and the agents have taken it; the snapshot id is
// the object's name.

// AnnotationCSISnapshotName holds the CreateSnapshot name when it is not itself a valid
// object name (the object is then named by a hash of it, as volumes are).
const AnnotationCSISnapshotName = "storage.meshvol.io/csi-snapshot-name"

// LabelCloneOf marks the snapshot CreateVolume takes of a clone's source volume; it is
// deleted once the clone is formed.
const LabelCloneOf = "storage.meshvol.io/clone-of"

func (c *Controller) getRVS(ctx context.Context, name string) (*v1.ReplicatedVolumeSnapshot, error) {
	if len(validation.IsDNS1123Label(name)) > 0 {
		return nil, nil
	}
	rvs := &v1.ReplicatedVolumeSnapshot{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, rvs); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, internal("reading ReplicatedVolumeSnapshot "+name, err)
	}
	return rvs, nil
}

func (c *Controller) CreateSnapshot(ctx context.Context, req *csipb.CreateSnapshotRequest) (*csipb.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, invalid("name: required")
	}
	if req.GetSourceVolumeId() == "" {
		return nil, invalid("source_volume_id: required")
	}
	name, hashed := rvNameFor(req.GetName())
	release, err := c.guard.acquire("snapshot/"+name, "CreateSnapshot")
	if err != nil {
		return nil, err
	}
	defer release()
	rvs, err := c.snapshotFor(ctx, name, req.GetName(), hashed, req.GetSourceVolumeId(), nil)
	if err != nil {
		return nil, err
	}
	if rvs, err = c.waitSnapshotReady(ctx, rvs.Name); err != nil {
		return nil, err
	}
	return &csipb.CreateSnapshotResponse{Snapshot: csiSnapshot(rvs)}, nil
}

// snapshotFor returns the snapshot name of volume source, creating it when there is
// none: AlreadyExists when the name is taken by a snapshot of another volume, NotFound
// when the volume does not exist, FailedPrecondition when its pool cannot snapshot.
func (c *Controller) snapshotFor(ctx context.Context, name, csiName string, hashed bool, source string, labels map[string]string) (*v1.ReplicatedVolumeSnapshot, error) {
	rvs, err := c.getRVS(ctx, name)
	if err != nil {
		return nil, err
	}
	if rvs != nil {
		switch {
		case hashed && rvs.Annotations[AnnotationCSISnapshotName] != csiName:
			return nil, status.Errorf(codes.AlreadyExists, "name: snapshot id %q already belongs to another CreateSnapshot name", name)
		case rvs.Spec.ReplicatedVolumeName != source:
			return nil, status.Errorf(codes.AlreadyExists, "name: snapshot %q exists of volume %q, not %q", name, rvs.Spec.ReplicatedVolumeName, source)
		case rvs.DeletionTimestamp != nil:
			return nil, status.Errorf(codes.Aborted, "name: snapshot %q is being deleted; retry once it is gone", name)
		}
		return rvs, nil
	}
	rv, err := c.existingRV(ctx, source)
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, status.Errorf(codes.NotFound, "source_volume_id: volume %q does not exist", source)
		}
		return nil, err
	}
	if err := c.checkSnapshotPool(ctx, rv); err != nil {
		return nil, err
	}
	rvs = &v1.ReplicatedVolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       v1.ReplicatedVolumeSnapshotSpec{ReplicatedVolumeName: source},
	}
	if hashed {
		rvs.Annotations = map[string]string{AnnotationCSISnapshotName: csiName}
	}
	if err := c.Client.Create(ctx, rvs, client.FieldOwner(v1.FieldManagerCSI)); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, status.Errorf(codes.Aborted, "name: snapshot %q appeared while it was being created; retry", name)
		}
		return nil, internal("creating ReplicatedVolumeSnapshot "+name, err)
	}
	return rvs, nil
}

// checkSnapshotPool refuses a volume whose pool cannot snapshot, naming the pool type.
func (c *Controller) checkSnapshotPool(ctx context.Context, rv *v1.ReplicatedVolume) error {
	cfg := rv.Status.Configuration
	if cfg == nil {
		return nil // the controller decides once the configuration is resolved
	}
	rsp := &v1.ReplicatedStoragePool{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: cfg.StoragePool}, rsp); err != nil {
		return client.IgnoreNotFound(err)
	}
	if why := v1.SnapshotUnsupported(rsp.Spec.Type); why != "" {
		return status.Errorf(codes.FailedPrecondition,
			"source_volume_id: volume %q lives in storage pool %q of type %s, %s", rv.Name, rsp.Name, rsp.Spec.Type, why)
	}
	return nil
}

// waitSnapshotReady waits until the snapshot is ready; a snapshot the controller failed
// is deleted and its reason returned as FailedPrecondition.
func (c *Controller) waitSnapshotReady(ctx context.Context, name string) (*v1.ReplicatedVolumeSnapshot, error) {
	var rvs *v1.ReplicatedVolumeSnapshot
	why := "not in the informer cache yet"
	err := waitRPC(ctx, func() (bool, error) {
		cur, err := c.getRVS(ctx, name)
		if err != nil || cur == nil {
			return false, err
		}
		rvs = cur
		why = fmt.Sprintf("phase %s: %s", cur.Status.Phase, cur.Status.Message)
		if cur.Status.Phase == v1.SnapshotFailed {
			if err := c.Client.Delete(ctx, cur); err != nil && !apierrors.IsNotFound(err) {
				return false, internal("deleting failed ReplicatedVolumeSnapshot "+name, err)
			}
			return false, status.Errorf(codes.FailedPrecondition, "snapshot %q of volume %q cannot be taken: %s", name, cur.Spec.ReplicatedVolumeName, cur.Status.Message)
		}
		return cur.Status.ReadyToUse, nil
	}, func() string { return fmt.Sprintf("snapshot %q is being taken (%s); a retry waits for it", name, why) })
	return rvs, err
}

func csiSnapshot(rvs *v1.ReplicatedVolumeSnapshot) *csipb.Snapshot {
	s := &csipb.Snapshot{SnapshotId: rvs.Name, SourceVolumeId: rvs.Spec.ReplicatedVolumeName, ReadyToUse: rvs.Status.ReadyToUse}
	if q := rvs.Status.Size; q != nil {
		s.SizeBytes = q.Value()
	}
	t := rvs.CreationTimestamp.Time
	if ct := rvs.Status.CreationTime; ct != nil {
		t = ct.Time
	}
	s.CreationTime = timestamppb.New(t)
	return s
}

func (c *Controller) DeleteSnapshot(ctx context.Context, req *csipb.DeleteSnapshotRequest) (*csipb.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, invalid("snapshot_id: required")
	}
	release, err := c.guard.acquire("snapshot/"+id, "DeleteSnapshot")
	if err != nil {
		return nil, err
	}
	defer release()
	rvs, err := c.getRVS(ctx, id)
	if err != nil || rvs == nil {
		return &csipb.DeleteSnapshotResponse{}, err
	}
	if err := c.refuseWhileRestoring(ctx, id); err != nil {
		return nil, err
	}
	if err := c.deleteSnapshotAndWait(ctx, rvs); err != nil {
		return nil, err
	}
	return &csipb.DeleteSnapshotResponse{}, nil
}

// refuseWhileRestoring: a snapshot that a volume not yet formed is restored from keeps
// its copies until that volume's first replica holds the data.
func (c *Controller) refuseWhileRestoring(ctx context.Context, id string) error {
	var l v1.ReplicatedVolumeList
	if err := c.Client.List(ctx, &l); err != nil {
		return internal("listing ReplicatedVolumes", err)
	}
	for i := range l.Items {
		rv := &l.Items[i]
		if ds := rv.Spec.DataSource; ds != nil && ds.ReplicatedVolumeSnapshotName == id && rv.DeletionTimestamp == nil {
			if ok, _ := formed(rv); !ok {
				return status.Errorf(codes.FailedPrecondition, "snapshot_id: volume %q is being restored from snapshot %q; retry once it is formed", rv.Name, id)
			}
		}
	}
	return nil
}

func (c *Controller) deleteSnapshotAndWait(ctx context.Context, rvs *v1.ReplicatedVolumeSnapshot) error {
	if rvs.DeletionTimestamp == nil {
		if err := c.Client.Delete(ctx, rvs, client.Preconditions{UID: &rvs.UID}); err != nil && !apierrors.IsNotFound(err) {
			return internal("deleting ReplicatedVolumeSnapshot "+rvs.Name, err)
		}
	}
	return waitRPC(ctx, func() (bool, error) {
		cur, err := c.getRVS(ctx, rvs.Name)
		if cur != nil {
			rvs = cur
		}
		return cur == nil, err
	}, func() string {
		var nodes []string
		for _, e := range rvs.Status.Nodes {
			nodes = append(nodes, e.NodeName)
		}
		return fmt.Sprintf("snapshot %q is being deleted (copies left on %s); a retry waits for it", rvs.Name, strings.Join(nodes, ", "))
	})
}

const snapshotTokenPrefix = "after:"

func (c *Controller) ListSnapshots(ctx context.Context, req *csipb.ListSnapshotsRequest) (*csipb.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries: must not be negative, got %d", req.GetMaxEntries())
	}
	after := ""
	if tok := req.GetStartingToken(); tok != "" {
		name, ok := strings.CutPrefix(tok, snapshotTokenPrefix)
		if !ok || len(validation.IsDNS1123Label(name)) > 0 {
			return nil, status.Errorf(codes.Aborted, "starting_token: %q is not a token ListSnapshots returned", tok)
		}
		after = name
	}
	var l v1.ReplicatedVolumeSnapshotList
	if err := c.Client.List(ctx, &l); err != nil {
		return nil, internal("listing ReplicatedVolumeSnapshots", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	resp := &csipb.ListSnapshotsResponse{}
	for i := range l.Items {
		rvs := &l.Items[i]
		if rvs.Name <= after || rvs.DeletionTimestamp != nil || rvs.Labels[LabelCloneOf] != "" ||
			(req.GetSnapshotId() != "" && rvs.Name != req.GetSnapshotId()) ||
			(req.GetSourceVolumeId() != "" && rvs.Spec.ReplicatedVolumeName != req.GetSourceVolumeId()) {
			continue
		}
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = snapshotTokenPrefix + resp.Entries[len(resp.Entries)-1].Snapshot.SnapshotId
			break
		}
		resp.Entries = append(resp.Entries, &csipb.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(rvs)})
	}
	return resp, nil
}

// dropUnreadySnapshots deletes the snapshots of a volume being deleted that were never
// taken: they can no longer be (docs/snapshots.md, "Deleting"), and a CreateSnapshot that
// gave up on one leaves nobody to delete it. Ready snapshots outlive the volume.
func (c *Controller) dropUnreadySnapshots(ctx context.Context, volume string) error {
	var l v1.ReplicatedVolumeSnapshotList
	if err := c.Client.List(ctx, &l); err != nil {
		return internal("listing ReplicatedVolumeSnapshots", err)
	}
	for i := range l.Items {
		s := &l.Items[i]
		if s.Spec.ReplicatedVolumeName != volume || s.Status.ReadyToUse || s.DeletionTimestamp != nil {
			continue
		}
		if err := c.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return internal("deleting the unready snapshot "+s.Name, err)
		}
	}
	return nil
}
