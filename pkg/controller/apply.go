package controller

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/finalizer"
)

// Every write of the controller is a server-side apply of the fields it owns, with field
// manager meshvol-controller (docs/contract.md), or a create/delete. The helpers build
// the apply request as unstructured JSON from the typed values: the API has no generated
// apply configurations, and a typed object would send every zero-valued field of the
// half the controller does not own.

func gvk(kind string) schema.GroupVersionKind {
	return v1.SchemeGroupVersion.WithKind(kind)
}

// toMap turns a typed value into its JSON map.
func toMap(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// applyObject builds an apply request for kind/name. resourceVersion, when set, makes the
// apply conditional: it fails with a Conflict if the object changed since it was read,
// so a status computed from a stale cache is never written.
func applyObject(kind, namespace, name, resourceVersion string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetGroupVersionKind(gvk(kind))
	if kind == "Secret" {
		u.SetAPIVersion("v1")
	}
	u.SetName(name)
	if namespace != "" {
		u.SetNamespace(namespace)
	}
	if resourceVersion != "" {
		u.SetResourceVersion(resourceVersion)
	}
	return u
}

var applyOpts = []client.PatchOption{client.FieldOwner(v1.FieldManagerController), client.ForceOwnership}

func applyStatusOpts() []client.SubResourcePatchOption {
	return []client.SubResourcePatchOption{client.FieldOwner(v1.FieldManagerController), client.ForceOwnership}
}

// applyStatus writes status (a typed status struct) of kind/name as the whole set of
// status fields the controller owns.
func applyStatus(ctx context.Context, c client.Client, kind, name, resourceVersion string, status any) error {
	m, err := toMap(status)
	if err != nil {
		return fmt.Errorf("encoding %s %s status: %w", kind, name, err)
	}
	u := applyObject(kind, "", name, resourceVersion)
	u.Object["status"] = m
	return c.Status().Patch(ctx, u, client.Apply, applyStatusOpts()...)
}

// applyFinalizer adds the controller's finalizer to kind/name by applying it as a set
// member, conditional on resourceVersion (what the cache showed), so that it never
// recreates an object that is already gone; a Conflict or NotFound means the cache was
// behind, and the watch brings the next reconcile (ignoreStale).
func applyFinalizer(ctx context.Context, c client.Client, kind, name, resourceVersion string) error {
	u := applyObject(kind, "", name, resourceVersion)
	u.SetFinalizers([]string{v1.FinalizerController})
	return c.Patch(ctx, u, client.Apply, applyOpts...)
}

// releaseFinalizer removes the controller's finalizer from obj, an object of kind as the
// cache shows it, conditional on its resourceVersion (a Conflict or NotFound: the cache
// was behind, ignoreStale). When it is the last finalizer of a deleted object, the
// release is an update that deletes the object (finalizer.Release). Otherwise it is a
// JSON merge patch of the list under resourceVersion, which touches nothing but the
// list: not an apply, which would release only an entry this manager owns, not one
// set by whoever created the object.
func releaseFinalizer(ctx context.Context, c client.Client, kind string, obj client.Object) error {
	return finalizer.Release(ctx, c, obj, v1.FinalizerController, v1.FieldManagerController, func() error {
		keep := []any{}
		for _, f := range obj.GetFinalizers() {
			if f != v1.FinalizerController {
				keep = append(keep, f)
			}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": obj.GetResourceVersion(), "finalizers": keep}})
		if err != nil {
			return err
		}
		u := applyObject(kind, "", obj.GetName(), "")
		return c.Patch(ctx, u, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(v1.FieldManagerController))
	})
}

// ignoreStale drops the errors of a conditional write made from a cache that was behind:
// the object changed (Conflict) or is gone (NotFound). Its watch event brings the next
// reconcile, which reads the new state.
func ignoreStale(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
