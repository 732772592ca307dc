package csi

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// CachedClient is a client whose reads come from informers started for exactly the
// kinds a CSI service reads, and whose writes go to the apiserver.
type CachedClient struct {
	client.Client
	cache cache.Cache
}

// Synced reports whether every informer has synced: the readiness Probe answers.
func (c *CachedClient) Synced(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if !c.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("informer caches have not synced")
	}
	return nil
}

// NewControllerClient starts the controller service's informers (RV, RVA, RVR, RSC,
// RSP, RVS, and agent Leases in namespace) and waits for them to sync or ctx to end.
func NewControllerClient(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, namespace string) (*CachedClient, error) {
	return newCachedClient(ctx, cfg, scheme, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{namespace: {}}},
		},
	}, &v1.ReplicatedVolume{}, &v1.ReplicatedVolumeAttachment{}, &v1.ReplicatedVolumeReplica{},
		&v1.ReplicatedStorageClass{}, &v1.ReplicatedStoragePool{}, &v1.ReplicatedVolumeSnapshot{}, &coordinationv1.Lease{})
}

// NewNodeClient starts the node service's one informer: the RVRs of its node.
func NewNodeClient(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, node string) (*CachedClient, error) {
	return newCachedClient(ctx, cfg, scheme, cache.Options{
		Scheme: scheme,
		ByObject: map[client.Object]cache.ByObject{
			&v1.ReplicatedVolumeReplica{}: {Label: labels.SelectorFromSet(labels.Set{v1.LabelNode: node})},
		},
	}, &v1.ReplicatedVolumeReplica{})
}

func newCachedClient(ctx context.Context, cfg *rest.Config, scheme *runtime.Scheme, opts cache.Options, objs ...client.Object) (*CachedClient, error) {
	ca, err := cache.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if _, err := ca.GetInformer(ctx, o); err != nil {
			return nil, fmt.Errorf("informer for %T: %w", o, err)
		}
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("informer caches did not sync: %w", ctx.Err())
	}
	// Read directly, not through an informer of every object of the kind: what
	// CreateVolume reads once per volume (the claim's StorageClass's
	// allowedTopologies, the Nodes' labels).
	uncached := []client.Object{&corev1.Node{}, &corev1.PersistentVolumeClaim{}, &storagev1.StorageClass{}}
	cl, err := client.New(cfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: ca, DisableFor: uncached}})
	if err != nil {
		return nil, err
	}
	return &CachedClient{Client: cl, cache: ca}, nil
}
