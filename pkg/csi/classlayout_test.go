package csi

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// TestCreateRefusesAClassTheEngineRefuses: a class with failuresToTolerate and no
// guaranteedMinimumDataRedundancy decides no layout for the engine, so CreateVolume
// refuses it (InvalidArgument, with the engine's message) instead of creating a volume
// that would never be configured. The API's CEL rules refuse such a class today; one
// stored before them reaches the CSI service all the same, which the test shows by
// dropping the field from what the apiserver returns.
func TestCreateRefusesAClassTheEngineRefuses(t *testing.T) {
	ctx := context.Background()
	pfx := testenvName(t)
	pool, class := pfx+"-pool", pfx+"-ftt-only"
	// No pool and no agent Leases: the class alone decides, and the other tests of the
	// package count every agent Lease as a node.
	must(t, env.Client.Create(ctx, &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: v1.ReplicatedStorageClassSpec{StoragePool: pool, FailuresToTolerate: ptr.To[int32](1), GuaranteedMinimumDataRedundancy: ptr.To[int32](0)}}))
	real, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	must(t, err)
	cl := interceptor.NewClient(real, interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if err := c.Get(ctx, key, obj, opts...); err != nil {
			return err
		}
		if rsc, ok := obj.(*v1.ReplicatedStorageClass); ok && rsc.Name == class {
			rsc.Spec.GuaranteedMinimumDataRedundancy = nil
		}
		return nil
	}})
	ctl := &Controller{Client: cl, Namespace: v1.DefaultNamespace}

	_, engineErr := layout.FromClass(class, nil, ptr.To[int32](1), nil)
	if engineErr == nil {
		t.Fatal("layout.FromClass accepts failuresToTolerate without guaranteedMinimumDataRedundancy")
	}
	vol := pfx + "-v"
	_, err = ctl.CreateVolume(ctx, createVol(vol, class, 64*mib))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateVolume: %v, want InvalidArgument", err)
	}
	msg := status.Convert(err).Message()
	for _, want := range []string{`parameters["replicatedStorageClassName"]`, engineErr.Error()} {
		if !strings.Contains(msg, want) {
			t.Errorf("CreateVolume: %q does not say %q", msg, want)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: vol}, &v1.ReplicatedVolume{}); !apierrors.IsNotFound(err) {
		t.Errorf("CreateVolume refused the class but the volume exists (%v)", err)
	}
}
