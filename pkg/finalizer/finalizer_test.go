package finalizer_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/finalizer"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env, testenv.Options{})) }

// otherFinalizer is someone else's finalizer, which a release must leave in place.
const otherFinalizer = "example.com/hold"

// kinds are the objects whose finalizers meshvol releases, each as its writer creates
// it: the controller's volumes, attachments and snapshots, the agent's replicas.
var kinds = []struct {
	kind, finalizer, owner string
	object                 func(name string) client.Object
}{
	{"ReplicatedVolume", v1.FinalizerController, v1.FieldManagerController, func(name string) client.Object {
		return &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ReplicatedVolumeSpec{Size: resource.MustParse("1Gi"), ReplicatedStorageClassName: "class"}}
	}},
	{"ReplicatedVolumeAttachment", v1.FinalizerController, v1.FieldManagerController, func(name string) client.Object {
		return &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: name, NodeName: "nowhere"}}
	}},
	{"ReplicatedVolumeSnapshot", v1.FinalizerController, v1.FieldManagerController, func(name string) client.Object {
		return &v1.ReplicatedVolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ReplicatedVolumeSnapshotSpec{ReplicatedVolumeName: name}}
	}},
	{"ReplicatedVolumeReplica", v1.FinalizerAgent, v1.FieldManagerAgent, func(name string) client.Object {
		return &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: name, NodeName: "nowhere",
				Type: v1.ReplicaTypeDiskful, Storage: &v1.ReplicaStorage{Pool: "pool"}}}
	}},
}

// created creates obj with finalizers, marks it deleted when deleted, and returns it as
// the apiserver then gives it back. The test's cleanup releases what is left.
func created(t *testing.T, ctx context.Context, obj client.Object, deleted bool, finalizers ...string) client.Object {
	t.Helper()
	obj.SetFinalizers(finalizers)
	mustDo(t, env.Client.Create(ctx, obj))
	t.Cleanup(func() {
		_ = env.Client.Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
		_ = env.Client.Delete(context.Background(), obj)
	})
	if deleted {
		mustDo(t, env.Client.Delete(ctx, obj))
	}
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	return obj
}

// removeByPatch is a release's patch, the controller's way: a JSON merge patch of the
// finalizer list without finalizer, under obj's resourceVersion. calls counts its uses.
func removeByPatch(ctx context.Context, obj client.Object, finalizer string, calls *int) func() error {
	return func() error {
		*calls++
		keep := slices.DeleteFunc(slices.Clone(obj.GetFinalizers()), func(f string) bool { return f == finalizer })
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": obj.GetResourceVersion(), "finalizers": keep}})
		if err != nil {
			return err
		}
		return env.Client.Patch(ctx, obj.DeepCopyObject().(client.Object), client.RawPatch(types.MergePatchType, patch))
	}
}

// The last finalizer of a deleted object goes by an update of the object as read, with
// no patch (docs/controller.md, "Deletion"): read before someone else changed the
// object, the release is refused with a Conflict and changes nothing; read again, it
// deletes the object. Each kind as its writer creates it passes the schema's rules as
// such an update, so its release is one request, not an update refused and a patch.
func TestReleaseOfTheLastFinalizerIsAnUpdate(t *testing.T) {
	ctx := context.Background()
	for _, k := range kinds {
		t.Run(k.kind, func(t *testing.T) {
			stale := created(t, ctx, k.object(testenv.Name(t)), true, k.finalizer)
			testenv.Touch(t, ctx, env.Client, stale)

			patches := 0
			err := finalizer.Release(ctx, env.Client, stale, k.finalizer, k.owner, removeByPatch(ctx, stale, k.finalizer, &patches))
			if !apierrors.IsConflict(err) {
				t.Fatalf("releasing from a stale copy: %v, want a Conflict", err)
			}
			cur := k.object(stale.GetName())
			mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(stale), cur))
			if !slices.Equal(cur.GetFinalizers(), []string{k.finalizer}) {
				t.Fatalf("a refused release changed the finalizers to %v", cur.GetFinalizers())
			}

			mustDo(t, finalizer.Release(ctx, env.Client, cur, k.finalizer, k.owner, removeByPatch(ctx, cur, k.finalizer, &patches)))
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cur), k.object(cur.GetName())); !apierrors.IsNotFound(err) {
				t.Fatalf("the object after its last finalizer's release: %v, want NotFound", err)
			}
			if patches != 0 {
				t.Errorf("the release patched %d time(s), want none: the update alone releases the last finalizer", patches)
			}
		})
	}
}

// An agent's replica of a volume that goes is released before the controller deletes it
// (docs/contract.md, "Deleting a volume"): its last finalizer goes by an update of the
// replica as read, which a stale copy has refused with a Conflict, and which leaves the
// replica in place, without finalizers, for its deletion to end at once. With someone
// else's finalizer there, the release is the patch.
func TestReleaseBeforeDeletion(t *testing.T) {
	ctx := context.Background()
	k := kinds[len(kinds)-1]
	stale := created(t, ctx, k.object(testenv.Name(t)), false, k.finalizer)
	testenv.Touch(t, ctx, env.Client, stale)
	patches := 0
	if err := finalizer.ReleaseBeforeDeletion(ctx, env.Client, stale, k.finalizer, k.owner, removeByPatch(ctx, stale, k.finalizer, &patches)); !apierrors.IsConflict(err) {
		t.Fatalf("releasing from a stale copy: %v, want a Conflict", err)
	}
	cur := k.object(stale.GetName())
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(stale), cur))
	mustDo(t, finalizer.ReleaseBeforeDeletion(ctx, env.Client, cur, k.finalizer, k.owner, removeByPatch(ctx, cur, k.finalizer, &patches)))
	if patches != 0 {
		t.Errorf("the release patched %d time(s), want none: the update alone releases the last finalizer", patches)
	}
	released := k.object(cur.GetName())
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(cur), released))
	if len(released.GetFinalizers()) != 0 || released.GetDeletionTimestamp() != nil {
		t.Fatalf("after the release: finalizers %v, deleted at %v; want none, and the object live", released.GetFinalizers(), released.GetDeletionTimestamp())
	}
	mustDo(t, env.Client.Delete(ctx, released))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cur), k.object(cur.GetName())); !apierrors.IsNotFound(err) {
		t.Fatalf("the released object after its deletion: %v, want NotFound at once", err)
	}

	shared := created(t, ctx, k.object(testenv.Name(t)+"-shared"), false, k.finalizer, otherFinalizer)
	mustDo(t, finalizer.ReleaseBeforeDeletion(ctx, env.Client, shared, k.finalizer, k.owner, removeByPatch(ctx, shared, k.finalizer, &patches)))
	if patches != 1 {
		t.Errorf("with another finalizer the release patched %d time(s), want once", patches)
	}
	mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(shared), cur))
	if !slices.Equal(cur.GetFinalizers(), []string{otherFinalizer}) {
		t.Errorf("finalizers after the release: %v, want %v", cur.GetFinalizers(), []string{otherFinalizer})
	}
}

// While someone else's finalizer remains, or the object is not being deleted, the
// release is the caller's patch, which leaves the object and every other finalizer in
// place.
func TestReleaseByPatch(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name       string
		deleted    bool
		finalizers []string
	}{
		{"another finalizer remains", true, []string{v1.FinalizerController, otherFinalizer}},
		{"not deleted", false, []string{v1.FinalizerController}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := kinds[0]
			obj := created(t, ctx, k.object(testenv.Name(t)), c.deleted, c.finalizers...)
			patches := 0
			mustDo(t, finalizer.Release(ctx, env.Client, obj, k.finalizer, k.owner, removeByPatch(ctx, obj, k.finalizer, &patches)))
			if patches != 1 {
				t.Errorf("the release patched %d time(s), want once", patches)
			}
			cur := k.object(obj.GetName())
			mustDo(t, env.Client.Get(ctx, client.ObjectKeyFromObject(obj), cur))
			want := slices.DeleteFunc(slices.Clone(c.finalizers), func(f string) bool { return f == k.finalizer })
			if !slices.Equal(cur.GetFinalizers(), want) {
				t.Errorf("finalizers after the release: %v, want %v", cur.GetFinalizers(), want)
			}
		})
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
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"replicatedVolumeName": name, "nodeName": "nowhere", "type": string(v1.ReplicaTypeDiskful),
			"storage": map[string]any{"pool": "pool", "volumeGroup": ""}},
	}}
	rvr := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: name}}
	created(t, ctx, u, false, v1.FinalizerAgent)
	// Retyped to a TieBreaker keeping its storage, as a Diskful retyped keeps it
	// (docs/controller.md, "Retyping a replica"): the schema then asks that the
	// storage stay as it was.
	mustDo(t, env.Client.Patch(ctx, rvr.DeepCopy(),
		client.RawPatch(types.MergePatchType, []byte(`{"spec":{"type":"`+string(v1.ReplicaTypeTieBreaker)+`"}}`))))
	mustDo(t, env.Client.Delete(ctx, rvr.DeepCopy()))
	mustDo(t, env.Client.Get(ctx, client.ObjectKey{Name: name}, rvr))

	// The premise: the update alone is refused.
	direct := rvr.DeepCopy()
	direct.Finalizers = nil
	err := env.Client.Update(ctx, direct)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("an update of the replica as decoded: %v, want it refused as Invalid (the test's premise)", err)
	}
	t.Logf("the update alone: %v", err)
	patches := 0
	mustDo(t, finalizer.Release(ctx, env.Client, rvr, v1.FinalizerAgent, v1.FieldManagerAgent, removeByPatch(ctx, rvr, v1.FinalizerAgent, &patches)))
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &v1.ReplicatedVolumeReplica{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the replica after its last finalizer's release: %v, want NotFound", err)
	}
	if patches != 1 {
		t.Errorf("the release patched %d time(s), want once, after the update refused as Invalid", patches)
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
