// Package storage defines the backing volumes that sit under each DRBD replica.
//
// The node agent calls a Provider once per ReplicatedVolumeReplica (RVR): the
// replica key it passes — the RVR's name and the start of its UID, so that a later
// replica of the same name never finds an earlier one's data (docs/contract.md,
// "Node that is gone") — is the volume's identity. Providers derive the backing
// name (LV name, file name) from it deterministically and mark what they create as
// theirs, so that an agent that restarts finds its volumes again and never touches
// anything it did not create. Implementations live in subpackages: lvm (thick and thin LVM) and
// file (sparse files on loop devices, for development and the sandbox).
//
// Every method is idempotent: Create of a volume that already exists and is ours
// returns it, Delete of a volume that is gone succeeds. Failures carry one of the
// sentinel errors below so that callers (the agent, the CSI layer) can decide
// without parsing text; the message keeps the tool's own words for the person
// who has to fix it.
package storage

import (
	"context"
)

// Provider manages the backing volumes of one pool on one node.
type Provider interface {
	// Create makes the backing volume for a replica, or returns the existing one
	// when it is ours and at least as large as requested. The size is rounded up
	// to the pool's allocation unit; Volume.SizeBytes is the real size.
	Create(ctx context.Context, req CreateRequest) (Volume, error)
	// Get returns a replica's volume, ErrNotFound if there is none, ErrNotOwned
	// if the derived name is taken by something that is not ours.
	Get(ctx context.Context, replica string) (Volume, error)
	// Resize grows a volume to at least sizeBytes. Asking for the current size is
	// a success; asking for less is ErrShrinkNotSupported (shrinking under a
	// filesystem or DRBD metadata loses data).
	Resize(ctx context.Context, replica string, sizeBytes int64) (Volume, error)
	// Delete removes a replica's volume. A volume that does not exist is a
	// success; a volume that is open (DRBD attached, mounted) is ErrInUse.
	Delete(ctx context.Context, replica string) error
	// List returns the volumes of this pool that are ours, and only those.
	List(ctx context.Context) ([]Volume, error)
	// Capacity reports the pool's size and free space, for GetCapacity and
	// placement.
	Capacity(ctx context.Context) (Capacity, error)
}

// Snapshotter is implemented by providers that can take cheap point-in-time
// copies of a volume (LVM thin). The CSI snapshot feature builds on it: a
// crash-consistent snapshot across replicas is one Snapshot per diskful replica.
//
// File pools also honour CreateRequest.Source; the LVM thin provider refuses it
// (docs/snapshots.md, "Pools").
type Snapshotter interface {
	// CreateSnapshot snapshots the replica's volume; idempotent on req.Name.
	CreateSnapshot(ctx context.Context, req SnapshotRequest) (Snapshot, error)
	// DeleteSnapshot removes a snapshot; one that does not exist is a success.
	DeleteSnapshot(ctx context.Context, name string) error
	// ListSnapshots returns our snapshots, of one replica's volume or, with an
	// empty replica, of all volumes in the pool.
	ListSnapshots(ctx context.Context, replica string) ([]Snapshot, error)
}

// CreateRequest asks for a replica's backing volume.
type CreateRequest struct {
	// Replica is the replica key, the volume's identity.
	Replica string
	// SizeBytes is the minimum usable size; providers round it up.
	SizeBytes int64
	// Source, when set, is a snapshot in the same pool whose data the new volume
	// starts with (a restore); nil means an empty volume.
	Source *Source
}

// Source is a snapshot a new volume is created from.
type Source struct {
	// Snapshot is the snapshot's name in the pool.
	Snapshot string
	// DataBytes is how much of the snapshot is data: bytes past it (the origin's
	// DRBD metadata) read as zeros in the new volume, so that DRBD finds no
	// metadata there and creates fresh metadata for the new volume.
	DataBytes int64
}

// Volume is a backing volume as the provider found it on the node.
type Volume struct {
	// Replica is the key of the replica this volume belongs to (read from the
	// ownership mark, not assumed from the name).
	Replica string
	// Name is the backing name: the LV name, or the file name in the pool.
	Name string
	// Pool names where the volume lives: "vg0", "vg0/tp" or the pool directory.
	Pool string
	// SizeBytes is the real size of the block device.
	SizeBytes int64
	// DevicePath is the block device to give DRBD as its backing disk.
	DevicePath string
}

// SnapshotRequest asks for a snapshot of a replica's volume.
type SnapshotRequest struct {
	// Name is the snapshot's identity (and backing name).
	Name string
	// Replica is the key of the replica whose volume is snapshotted.
	Replica string
}

// Snapshot is a point-in-time copy of a volume.
type Snapshot struct {
	Name string
	// Replica is the key of the replica whose volume was snapshotted. The snapshot outlives it:
	// removing the origin leaves its thin snapshots in place.
	Replica   string
	Pool      string
	SizeBytes int64
}

// Capacity describes one pool. For thick pools Free is what a new volume can
// get. Thin pools can promise more than they hold: Free is the unwritten part
// of the pool and ProvisionedBytes the sum of all thin volume sizes in it.
type Capacity struct {
	Pool       string
	TotalBytes int64
	FreeBytes  int64
	// ProvisionedBytes is the sum of the sizes of the volumes in the pool
	// (ours and others'); for thin pools it may exceed TotalBytes.
	ProvisionedBytes int64
	// MetadataPercent is a thin pool's metadata usage (0 for other pools): a
	// full metadata device stops the pool even with data space left.
	MetadataPercent float64
}
