package api

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/meshvol/meshvol/internal/testenv"
)

// env is the control plane every test of this package shares. The kinds are cluster
// scoped, so tests keep apart by object names (testenv.Name), never by fresh clusters.
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env, testenv.Options{})) }

const apiVersion = "storage.meshvol.io/v1alpha1"

// Field managers. The controller and agent names are the ones the real writers use
// (docs/contract.md, "Objects, names, writers"), so the ownership tests read like the
// production flows.
const (
	managerUser       = "kubectl-user"
	managerCSI        = "meshvol-csi-controller"
	managerController = "meshvol-controller"
	managerAgent      = "meshvol-agent"
	managerHealth     = "meshvol-health"
)

// ctx bounds one test's calls to the apiserver; a hung apiserver fails the test
// instead of hanging the package until go test's global timeout.
func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// fromYAML parses one YAML document into an unstructured object. The placeholder
// $NAME is replaced by name, so a table of YAML snippets can stay readable while every
// subtest gets its own object.
func fromYAML(t *testing.T, doc, name string) *unstructured.Unstructured {
	t.Helper()
	doc = strings.ReplaceAll(doc, "$NAME", name)
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		t.Fatalf("test YAML does not parse: %v\n%s", err, doc)
	}
	if u.GetAPIVersion() == "" {
		u.SetAPIVersion(apiVersion)
	}
	return u
}

// apply server-side applies u to the main resource as manager. The object's status is
// ignored there: the status subresource owns it.
func apply(c context.Context, u *unstructured.Unstructured, manager string, opts ...client.PatchOption) error {
	opts = append([]client.PatchOption{client.FieldOwner(manager)}, opts...)
	return env.Client.Patch(c, u.DeepCopy(), client.Apply, opts...)
}

// applyStatus server-side applies u to the status subresource as manager.
func applyStatus(c context.Context, u *unstructured.Unstructured, manager string, opts ...client.SubResourcePatchOption) error {
	opts = append([]client.SubResourcePatchOption{client.FieldOwner(manager)}, opts...)
	return env.Client.Status().Patch(c, u.DeepCopy(), client.Apply, opts...)
}

// mustApply and mustApplyStatus fail the test on any error and register the object's
// deletion, so a failing test leaves nothing behind for the next one.
func mustApply(t *testing.T, u *unstructured.Unstructured, manager string) {
	t.Helper()
	if err := apply(ctx(t), u, manager); err != nil {
		t.Fatalf("apply %s %s as %s: %v", u.GetKind(), u.GetName(), manager, err)
	}
	cleanup(t, u)
}

func mustApplyStatus(t *testing.T, u *unstructured.Unstructured, manager string) {
	t.Helper()
	if err := applyStatus(ctx(t), u, manager); err != nil {
		t.Fatalf("apply status of %s %s as %s: %v", u.GetKind(), u.GetName(), manager, err)
	}
}

// cleanup deletes the object when the test ends; NotFound is fine (the test may have
// deleted it, or the create may have been refused).
func cleanup(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	del := &unstructured.Unstructured{}
	del.SetGroupVersionKind(u.GroupVersionKind())
	del.SetName(u.GetName())
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := env.Client.Delete(c, del); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s %s: %v", del.GetKind(), del.GetName(), err)
		}
	})
}

// get reads the object named like u, as unstructured.
func get(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	out := &unstructured.Unstructured{}
	out.SetGroupVersionKind(u.GroupVersionKind())
	if err := env.Client.Get(ctx(t), client.ObjectKey{Name: u.GetName()}, out); err != nil {
		t.Fatalf("get %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// field reads a nested field of an unstructured object, failing the test when it is
// absent. Path elements are map keys.
func field(t *testing.T, u *unstructured.Unstructured, path ...string) any {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if err != nil || !ok {
		t.Fatalf("%s %s has no .%s (err %v)", u.GetKind(), u.GetName(), strings.Join(path, "."), err)
	}
	return v
}

// invalidCause checks that err is the apiserver's 422 Invalid answer and that one of its
// causes names fieldPath and carries a message containing msg. It returns a description
// of the mismatch, or "" when the error is the expected one. Checking the cause rather
// than "some error happened" is the point: a rule that fires for the wrong reason, or
// another rule firing first, must fail the test.
func invalidCause(err error, fieldPath, msg string) string {
	if err == nil {
		return "the apiserver accepted the object"
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) || !apierrors.IsInvalid(err) {
		return fmt.Sprintf("want a 422 Invalid answer, got %v", err)
	}
	details := st.Status().Details
	if details == nil || len(details.Causes) == 0 {
		return fmt.Sprintf("Invalid answer without causes: %v", err)
	}
	// A CEL rule that fails to evaluate (a missing key, a wrong overload) still refuses
	// the object, but the user reads the expression's runtime error instead of the
	// rule's message. That is a bug in the rule, whichever cause the test looks for.
	for _, c := range details.Causes {
		for _, celError := range []string{"evaluating rule", "no such key", "no such overload", "call arguments did not match"} {
			if strings.Contains(c.Message, celError) {
				return fmt.Sprintf("a validation rule failed to evaluate instead of answering with its message; causes:\n%s", causes(details.Causes))
			}
		}
	}
	for _, c := range details.Causes {
		if c.Field == fieldPath && strings.Contains(c.Message, msg) {
			return ""
		}
	}
	return fmt.Sprintf("no cause with field %q and message containing %q; causes:\n%s", fieldPath, msg, causes(details.Causes))
}

func causes(cs []metav1.StatusCause) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "  field %q type %s: %s\n", c.Field, c.Type, c.Message)
	}
	return b.String()
}
