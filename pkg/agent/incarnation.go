package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
)

// uidDigits is how much of the replica's UID its backing volume's name carries:
// 48 random bits of a UUID, so that two replicas of one name on one node share a
// key with odds of 2^-48, while the name stays well within lvm2's device-mapper
// limit (pkg/storage/lvm).
const uidDigits = 12

// backingKey is the identity of the replica's backing volume in its pool: the
// replica's name and the start of its UID (docs/contract.md, "Node that is
// gone"). A replica the controller places on a node where an earlier one of the
// same name was force-removed has the same name but a new UID, so it never finds
// the earlier one's volume — its data, DRBD metadata, bitmaps and generation
// UUIDs — under its own key; the collector deletes that one as no replica's.
//
// A replica whose own status names a volume without the UID (created for this
// very object by an agent from before the key carried it) keeps that volume:
// the status belongs to the object, so no other incarnation can have written it.
func backingKey(rvr *v1.ReplicatedVolumeReplica) string {
	key := incarnationKey(rvr)
	if bv := rvr.Status.BackingVolume; bv != nil && !strings.HasPrefix(bv.Name, key) {
		return rvr.Name
	}
	return key
}

// incarnationKey is the replica's name followed by the first uidDigits hex
// digits of its UID. An object read from the API server always has a UID.
func incarnationKey(rvr *v1.ReplicatedVolumeReplica) string {
	uid := strings.ReplaceAll(string(rvr.UID), "-", "")
	if uid == "" {
		return rvr.Name
	}
	return rvr.Name + "." + uid[:min(len(uid), uidDigits)]
}

// earlierIncarnation says why the resource the kernel runs for the member's
// volume is not this replica's own, or "" when it is (or none runs): it runs
// under another node-id, or on a backing disk other than this replica's backing
// volume. Both mean an earlier replica of the same name on this node (its member
// force-removed while the node was away) left it running, and adjusting it would
// keep that replica's disk, generation UUIDs and bitmaps (docs/contract.md,
// "Node that is gone"). A diskless resource under the member's node-id holds no
// data and is adjusted as it is.
func (a *Agent) earlierIncarnation(ctx context.Context, rvr *v1.ReplicatedVolumeReplica, member *v1.DatameshMember, got *drbd.ShowResource) (string, error) {
	if got == nil {
		return "", nil
	}
	if got.ThisHost.NodeID != int(member.NodeID) {
		return fmt.Sprintf("the kernel runs it as node-id %d, this replica is node-id %d", got.ThisHost.NodeID, member.NodeID), nil
	}
	disk := ""
	for _, v := range got.ThisHost.Volumes {
		if v.VolumeNr == drbd.VolumeNumber && !v.Disk.None {
			disk = v.BackingDisk
		}
	}
	if disk == "" {
		return "", nil
	}
	own, err := a.ownDevice(ctx, rvr)
	if err != nil || disk == own {
		return "", err
	}
	if own == "" {
		return fmt.Sprintf("the kernel runs it on backing disk %s, and this replica has no backing volume yet", disk), nil
	}
	return fmt.Sprintf("the kernel runs it on backing disk %s, this replica's backing volume is %s", disk, own), nil
}

// ownDevice is the block device of this replica's backing volume, "" when it has
// none (yet): the one this agent last saw for it, else the one under its key.
// It looks, never creates: a member whose type holds no disk may still have one,
// attached until now, and a new member's volume is made only after the check.
func (a *Agent) ownDevice(ctx context.Context, rvr *v1.ReplicatedVolumeReplica) (string, error) {
	if v, ok := a.knownVolume(rvr); ok {
		return v.DevicePath, nil
	}
	if rvr.Spec.Storage == nil {
		return "", nil
	}
	p, err := a.provider(ctx, rvr.Spec.Storage.Pool)
	if err != nil {
		return "", err
	}
	v, err := p.Get(ctx, backingKey(rvr))
	if errors.Is(err, storage.ErrNotFound) {
		return "", nil
	}
	return v.DevicePath, err
}
