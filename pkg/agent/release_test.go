package agent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

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

// touch changes the replica behind the caller's back (an annotation), moving its
// resourceVersion: a copy read before is stale.
func touch(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"annotations":{"example.com/touched":"` + time.Now().Format(time.RFC3339Nano) + `"}}}`)
	mustDo(t, env.Client.Patch(ctx, &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}}, client.RawPatch(types.MergePatchType, patch)))
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
	touch(t, ctx, name)

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
	touch(t, ctx, name)

	mustDo(t, agent.ReleaseFinalizer(ctx, env.Client, stale))
	cur := &v1.ReplicatedVolumeReplica{}
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(stale), cur))
	if !slices.Equal(cur.Finalizers, []string{otherFinalizer}) {
		t.Errorf("finalizers after the agent's release: %v, want only %s", cur.Finalizers, otherFinalizer)
	}
	if cur.Annotations["example.com/touched"] == "" {
		t.Errorf("the release from a stale copy undid a change made after it: annotations %v", cur.Annotations)
	}
}

// A replica whose stored spec does not survive the typed API's round trip (an optional
// field stored as an explicit empty string, which the typed API leaves out) fails the
// schema's rule that compares its storage with the old one as an update; its last
// finalizer goes by the patch then.
func TestReleaseOfASpecThatDoesNotRoundTrip(t *testing.T) {
	ctx := context.Background()
	name := testenv.Name(t)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1.SchemeGroupVersion.String(), "kind": "ReplicatedVolumeReplica",
		"metadata": map[string]any{"name": name, "finalizers": []any{v1.FinalizerAgent}},
		"spec": map[string]any{"replicatedVolumeName": name, "nodeName": "nowhere", "type": string(v1.ReplicaTypeDiskful),
			"storage": map[string]any{"pool": "pool", "volumeGroup": ""}},
	}}
	mustDo(t, env.Client.Create(ctx, u))
	t.Cleanup(func() {
		_ = env.Client.Patch(context.Background(), &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}},
			client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
	})
	// Retyped to a TieBreaker keeping its storage, as a Diskful retyped keeps it
	// (docs/controller.md, "Retyping a replica"): the schema then asks that the
	// storage stay as it was.
	mustDo(t, env.Client.Patch(ctx, &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}},
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"type":"`+string(v1.ReplicaTypeTieBreaker)+`"}}`))))
	mustDo(t, env.Client.Delete(ctx, &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	rvr := &v1.ReplicatedVolumeReplica{}
	mustDo(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, rvr))

	// The premise: the update alone is refused.
	direct := rvr.DeepCopy()
	direct.Finalizers = nil
	err := env.Client.Update(ctx, direct)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("an update of the replica as decoded: %v, want it refused as Invalid (the test's premise)", err)
	}
	t.Logf("the update alone: %v", err)
	mustDo(t, agent.ReleaseFinalizer(ctx, env.Client, rvr))
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &v1.ReplicatedVolumeReplica{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the replica after its last finalizer's release: %v, want NotFound", err)
	}
}
