package sandbox

import (
	"context"
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The storage classes the sandbox offers: one per layout worth showing, each
// a meshvol ReplicatedStorageClass and the Kubernetes StorageClass that
// names it.
type storageClass struct {
	name        string
	replication v1.Replication
	what        string
}

var storageClasses = []storageClass{
	{"meshvol-1d", v1.ReplicationNone, "one diskful replica: no protection"},
	{"meshvol-2d-1tb", v1.ReplicationAvailability, "two diskful replicas and a tie-breaker: survives one node"},
	{"meshvol-3d", v1.ReplicationConsistencyAndAvailability, "three diskful replicas: survives one node, never fewer than two copies"},
}

// DefaultStorageClass is the sandbox's default class (the demonstration uses
// DemoStorageClass).
const DefaultStorageClass = "meshvol-2d-1tb"

// PoolName is the sandbox's one storage pool: a file pool on every node.
const PoolName = "sandbox-files"

// createObjects creates the CSIDriver, the storage pool and the storage
// classes. The CSIDriver says what the kubelet, the attach/detach
// controller and the scheduler need: attach is required (ControllerPublish
// places the Primary), the driver needs no pod information at mount, and
// the scheduler must check the CSIStorageCapacity objects external-
// provisioner publishes, so a claim no node can hold keeps its pod Pending
// with a reason instead of failing in CreateVolume.
func createObjects(ctx context.Context, c client.Client) error {
	attach, podInfo, capacity := true, false, true
	fsPolicy := storagev1.FileFSGroupPolicy
	objs := []client.Object{
		&storagev1.CSIDriver{
			ObjectMeta: metav1.ObjectMeta{Name: v1.CSIDriverName},
			Spec: storagev1.CSIDriverSpec{
				AttachRequired:       &attach,
				PodInfoOnMount:       &podInfo,
				StorageCapacity:      &capacity,
				FSGroupPolicy:        &fsPolicy,
				VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent},
			},
		},
	}
	for _, sc := range storageClasses {
		repl := sc.replication
		wffc := storagev1.VolumeBindingWaitForFirstConsumer
		expand := true
		objs = append(objs,
			&v1.ReplicatedStorageClass{
				ObjectMeta: metav1.ObjectMeta{Name: sc.name},
				Spec: v1.ReplicatedStorageClassSpec{
					StoragePool: PoolName,
					Replication: &repl,
				},
			},
			&storagev1.StorageClass{
				ObjectMeta:           metav1.ObjectMeta{Name: sc.name, Annotations: map[string]string{"meshvol.io/description": sc.what}},
				Provisioner:          v1.CSIDriverName,
				Parameters:           map[string]string{v1.CSIParameterStorageClass: sc.name},
				VolumeBindingMode:    &wffc,
				AllowVolumeExpansion: &expand,
			},
		)
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("sandbox: creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}
