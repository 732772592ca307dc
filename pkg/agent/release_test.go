package agent_test

import (
	"context"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// These are the tests of the agent's release of its finalizer; the mechanism it shares
// with the controller (every kind, the fallback when the update is refused as Invalid)
// is tested in pkg/finalizer.

// otherFinalizer is someone else's finalizer on a replica, which the agent's release
// must leave in place.
const otherFinalizer = "example.com/hold"

// deletedReplica creates a replica of no node with finalizers and marks it deleted; it
// returns the replica as marked. No agent runs: the test releases it itself.
func deletedReplica(t *testing.T, ctx context.Context, name string, finalizers ...string) *v1.ReplicatedVolumeReplica {
	t.Helper()
	rvr := &v1.ReplicatedVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: finalizers},
		Spec: v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: name, NodeName: "nowhere",
			Type: v1.ReplicaTypeDiskful, Storage: &v1.ReplicaStorage{Pool: "pool"}},
	}
	mustDo(t, env.Client.Create(ctx, rvr))
	t.Cleanup(func() {
		cur := &v1.ReplicatedVolumeReplica{}
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(rvr), cur) == nil {
			cur.Finalizers = nil
			_ = env.Client.Update(context.Background(), cur)
		}
	})
	mustDo(t, env.Client.Delete(ctx, rvr))
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(rvr), rvr))
	return rvr
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The agent's finalizer, the last of a deleted replica, goes by an update of the
// replica as the agent read it (docs/scale.md, "Eighth pass"): read before someone
// else changed the replica, the release is refused with a Conflict and changes
// nothing; read again, it deletes the replica.
func TestReleaseOfTheLastFinalizerIsAnUpdate(t *testing.T) {
	ctx := context.Background()
	name := testenv.Name(t)
	stale := deletedReplica(t, ctx, name, v1.FinalizerAgent)
	testenv.Touch(t, ctx, env.Client, stale)

	err := agent.ReleaseFinalizer(ctx, env.Client, stale)
	if !apierrors.IsConflict(err) {
		t.Fatalf("releasing from a stale copy: %v, want a Conflict", err)
	}
	cur := &v1.ReplicatedVolumeReplica{}
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(stale), cur))
	if !slices.Equal(cur.Finalizers, []string{v1.FinalizerAgent}) {
		t.Fatalf("a refused release changed the finalizers to %v", cur.Finalizers)
	}

	mustDo(t, agent.ReleaseFinalizer(ctx, env.Client, cur))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cur), &v1.ReplicatedVolumeReplica{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the replica after its last finalizer's release: %v, want NotFound", err)
	}
}

// While someone else's finalizer remains, the agent releases only its own, by a patch
// that does not depend on the replica's resourceVersion: from a stale copy too, and
// nothing else of the replica changes.
func TestReleaseKeepsAnotherFinalizer(t *testing.T) {
	ctx := context.Background()
	name := testenv.Name(t)
	stale := deletedReplica(t, ctx, name, v1.FinalizerAgent, otherFinalizer)
	testenv.Touch(t, ctx, env.Client, stale)

	mustDo(t, agent.ReleaseFinalizer(ctx, env.Client, stale))
	cur := &v1.ReplicatedVolumeReplica{}
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(stale), cur))
	if !slices.Equal(cur.Finalizers, []string{otherFinalizer}) {
		t.Errorf("finalizers after the agent's release: %v, want only %s", cur.Finalizers, otherFinalizer)
	}
	if cur.Annotations[testenv.TouchedAnnotation] == "" {
		t.Errorf("the release from a stale copy undid a change made after it: annotations %v", cur.Annotations)
	}
}
