// Package finalizer releases a finalizer of meshvol's objects: the controller's of a
// volume, an attachment or a snapshot, and the agent's of a replica (which the
// controller releases too when the replica's node is lost).
package finalizer

import (
	"context"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Release removes finalizer from obj, the object as the caller's cache shows it, writing
// as the field manager owner. obj itself is not changed.
//
// When finalizer is the last one of an object being deleted, the write deletes the
// object, and it is an update of obj without its finalizers, under obj's
// resourceVersion, rather than a patch: the apiserver then neither encodes the stored
// object nor applies a patch to it, a part of the CPU of thousands of deletions
// (docs/controller.md, "Deletion"; docs/scale.md, "Eighth pass"). What such an update
// could lose does not matter, as the object goes with it: the status belongs to the
// status subresource, which an update of the object leaves as stored, so it is not
// even sent; the apiserver keeps the stored managedFields of an update that carries
// none (the caches drop them); fields of a newer API version than the writer knows
// would be dropped. An object that changed since obj was read refuses the update with
// a Conflict, which Release returns: the object's next event brings the release again
// with the object as it is then.
//
// Otherwise someone else's finalizer stays, and with it the object: patch, the caller's
// own patch of the finalizer list, removes finalizer and touches nothing else. patch
// is also the way when the update is refused as Invalid: the spec as the typed API
// decoded it does not pass the schema's rules as an update of the stored one (a field
// stored with an explicit empty value, which the typed API leaves out and a rule
// comparing it with the old value then sees changed, as a retyped TieBreaker's
// storage.volumeGroup; docs/controller.md, "Retyping a replica").
func Release(ctx context.Context, c client.Writer, obj client.Object, finalizer, owner string, patch func() error) error {
	return release(ctx, c, obj, finalizer, owner, obj.GetDeletionTimestamp() != nil, patch)
}

// ReleaseBeforeDeletion is Release for an object not deleted yet whose deletion comes
// next, from whoever waits for this release: a replica of a volume that goes, which its
// agent releases once its resource is down and its backing volume gone, and the
// controller deletes once released (docs/contract.md, "Deleting a volume"). When
// finalizer is the object's last, the update is as for a deleted object, and what it
// could lose matters as little: the object goes next, and no one reads it meanwhile.
// It does not delete the object.
func ReleaseBeforeDeletion(ctx context.Context, c client.Writer, obj client.Object, finalizer, owner string, patch func() error) error {
	return release(ctx, c, obj, finalizer, owner, true, patch)
}

// release is Release, by an update when finalizer is the last one of an object that
// goes.
func release(ctx context.Context, c client.Writer, obj client.Object, finalizer, owner string, goes bool, patch func() error) error {
	if !goes || !slices.Equal(obj.GetFinalizers(), []string{finalizer}) {
		return patch()
	}
	last := obj.DeepCopyObject().(client.Object)
	last.SetFinalizers(nil)
	clearStatus(last)
	err := c.Update(ctx, last, client.FieldOwner(owner))
	if !apierrors.IsInvalid(err) {
		return err
	}
	return patch()
}

// clearStatus leaves obj's status out of the update: the apiserver ignores the status
// of an update of the object itself, so sending it would only cost its bytes, encoded by
// the writer and decoded by the apiserver, and most of an object's bytes are its status
// (the request that deletes a formed 3D volume's RV is 3.4 KB with it, 0.45 KB without;
// a replica as its agent caches it, 1.6 and 0.56 KB). An object of another type keeps
// its status, which is as harmless.
func clearStatus(obj client.Object) {
	switch o := obj.(type) {
	case *v1.ReplicatedVolume:
		o.Status = v1.ReplicatedVolumeStatus{}
	case *v1.ReplicatedVolumeReplica:
		o.Status = v1.ReplicatedVolumeReplicaStatus{}
	case *v1.ReplicatedVolumeAttachment:
		o.Status = v1.ReplicatedVolumeAttachmentStatus{}
	case *v1.ReplicatedVolumeSnapshot:
		o.Status = v1.ReplicatedVolumeSnapshotStatus{}
	}
}
