package testenv

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TouchedAnnotation is the annotation Touch sets.
const TouchedAnnotation = "example.com/touched"

// Touch changes obj behind a caller's back, setting TouchedAnnotation to the time, and so
// moves its resourceVersion: a copy of obj read before is stale. Tests of writes
// conditional on the resourceVersion use it.
func Touch(tb testing.TB, ctx context.Context, c client.Client, obj client.Object) {
	tb.Helper()
	patch := []byte(`{"metadata":{"annotations":{"` + TouchedAnnotation + `":"` + time.Now().Format(time.RFC3339Nano) + `"}}}`)
	if err := c.Patch(ctx, obj.DeepCopyObject().(client.Object), client.RawPatch(types.MergePatchType, patch)); err != nil {
		tb.Fatal(err)
	}
}
