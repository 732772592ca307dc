package api

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/meshvol/meshvol/internal/testenv"
)

// TestStatusBecomesAtomicUnderRunningVolumes: an RV whose status was written while
// the status was not yet atomic in the schema carries managedFields that own each
// member and each condition apart. Once the CRD of now replaces the earlier one, as
// an upgrade applies it under running volumes, the controller's next apply lands,
// the status is what it applied, and its ownership shrinks to the one field
// (docs/contract.md). The test has its own apiserver: it replaces a CRD, which the
// package's shared one must not see.
func TestStatusBecomesAtomicUnderRunningVolumes(t *testing.T) {
	dirs, err := testenv.DefaultCRDDirs()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dirs[0], "storage.meshvol.io_replicatedvolumes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var now apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &now); err != nil {
		t.Fatal(err)
	}
	earlier := now.DeepCopy()
	for i := range earlier.Spec.Versions {
		status := earlier.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"]
		if status.XMapType == nil || *status.XMapType != "atomic" {
			t.Fatalf("the RV CRD's status (version %s) is not atomic: the test's premise is gone", earlier.Spec.Versions[i].Name)
		}
		status.XMapType = nil
		earlier.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"] = status
	}
	dir := t.TempDir()
	out, err := yaml.Marshal(earlier)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rv.yaml"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	e := testenv.StartT(t, testenv.Options{CRDDirs: []string{dir}})
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	name := testenv.Name(t)
	rv := rvSpec(t, name)
	if err := e.Client.Patch(c, rv.DeepCopy(), client.Apply, client.FieldOwner(managerCSI)); err != nil {
		t.Fatal(err)
	}
	applyStatus := func(u *unstructured.Unstructured) error {
		return e.Client.Status().Patch(c, u.DeepCopy(), client.Apply, client.FieldOwner(managerController), client.ForceOwnership)
	}
	read := func() *unstructured.Unstructured {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(rv.GroupVersionKind())
		if err := e.Client.Get(c, client.ObjectKey{Name: name}, got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	if err := applyStatus(rvStatus(t, name, 3, "a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	if ctl, _ := managed(t, read(), managerController, "status"); !ownsBeneath(ctl, ".status.datamesh.members") {
		t.Fatalf("under the earlier schema %s should own each member; owns %v", managerController, keys(ctl))
	}

	// The upgrade: the CRD of now, over the earlier one.
	installed := &apiextensionsv1.CustomResourceDefinition{}
	if err := e.Client.Get(c, client.ObjectKey{Name: now.Name}, installed); err != nil {
		t.Fatal(err)
	}
	installed.Spec.Versions = now.Spec.Versions
	if err := e.Client.Update(c, installed); err != nil {
		t.Fatalf("replacing the RV CRD: %v", err)
	}

	// The apiserver serves the new schema shortly after the CRD's update; until
	// then an apply is still tracked field by field. Every apply must land.
	revision := 4
	for {
		if err := applyStatus(rvStatus(t, name, revision, "a", "b", "d")); err != nil {
			t.Fatalf("the controller's apply over the earlier schema's ownership: %v", err)
		}
		got := read()
		if m := memberNames(t, got); !reflect.DeepEqual(m, []string{name + "-a", name + "-b", name + "-d"}) {
			t.Fatalf("members after the apply = %v, want a, b, d", m)
		}
		ctl, _ := managed(t, got, managerController, "status")
		if ctl[".status"] && !ownsBeneath(ctl, ".status") {
			break
		}
		if c.Err() != nil {
			t.Fatalf("%s still owns %v after the CRD's update", managerController, keys(ctl))
		}
		revision++
		time.Sleep(200 * time.Millisecond)
	}
}
