package api

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/meshvol/meshvol/config/crd"
	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/crdschema"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
)

// TestStartRefusesCRDsThatWouldDropFields: on CRDs of an earlier version (as helm
// upgrade leaves them: an RV CRD without a member's port or a derived reference's
// fields, an RVR CRD without backingVolume, no ReplicatedNodeMaintenance CRD at all),
// the apiserver drops the fields without an error; the controller's manager refuses to
// start, before the leader election, with one error naming each CRD, its fields and the
// command that fixes it, and the agent refuses too, naming only the CRDs of what it
// writes. This tree's CRDs applied, both checks pass, the apiserver keeps the fields
// and the controller leads. The test has its own apiserver: it replaces CRDs, which the
// package's shared one must not see (docs/install.md, "Upgrading").
func TestStartRefusesCRDsThatWouldDropFields(t *testing.T) {
	defs, err := crd.Definitions()
	if err != nil {
		t.Fatal(err)
	}
	rvName, rvrName, rnmName := crdschema.Name("replicatedvolumes"), crdschema.Name("replicatedvolumereplicas"), crdschema.Name("replicatednodemaintenances")
	earlierRV := defs[rvName].DeepCopy()
	for i := range earlierRV.Spec.Versions {
		dm := earlierRV.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"]
		members := dm.Properties["members"]
		delete(members.Items.Schema.Properties, "port")
		dm.Properties["members"] = members
		ss := dm.Properties["sharedSecret"]
		delete(ss.Properties, "derivation")
		delete(ss.Properties, "keyFingerprint")
		ss.XValidations = nil // its rules name the fields
		dm.Properties["sharedSecret"] = ss
		earlierRV.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"] = dm
	}
	earlierRVR := defs[rvrName].DeepCopy()
	for i := range earlierRVR.Spec.Versions {
		status := earlierRVR.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"]
		if _, ok := status.Properties["backingVolume"]; !ok {
			t.Fatal("the RVR CRD has no status.backingVolume: the test's premise is gone")
		}
		delete(status.Properties, "backingVolume")
		earlierRVR.Spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"] = status
	}
	dir := t.TempDir()
	for name, def := range defs {
		switch name {
		case rnmName:
			continue
		case rvName:
			def = earlierRV
		case rvrName:
			def = earlierRVR
		}
		out, err := yaml.Marshal(def)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e := testenv.StartT(t, testenv.Options{CRDDirs: []string{dir}})
	c, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// The premise: the apiserver drops a member's port from an update without an error,
	// and refuses a server-side apply that carries it.
	name := testenv.Name(t)
	if err := e.Client.Patch(c, rvSpec(t, name), client.Apply, client.FieldOwner(managerCSI)); err != nil {
		t.Fatal(err)
	}
	if port, err := memberPort(t, c, e.Client, name, false); err != nil || port != nil {
		t.Fatalf("an update on the earlier CRD: port %v, error %v; want the port dropped without an error", port, err)
	}
	if _, err := memberPort(t, c, e.Client, name, true); err == nil || !strings.Contains(err.Error(), "field not declared in schema") {
		t.Fatalf("an apply on the earlier CRD: %v, want it refused (field not declared in schema)", err)
	}

	lease := testenv.Name(t) + "-leader"
	// start starts a controller that takes part in the leader election and returns
	// once it refused to start (its error) or leads (a function that stops it).
	start := func() (stop func() error, err error) {
		mgr, err := controller.NewManager(e.Config, controller.Options{Namespace: "default"},
			controller.ManagerOptions{Scheme: e.Scheme, LeaderElection: true, LeaderElectionID: lease})
		if err != nil {
			t.Fatal(err)
		}
		mc, mcancel := context.WithCancel(c)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mc) }()
		select {
		case err := <-done:
			mcancel()
			return nil, err
		case <-mgr.Elected():
			mgr.GetCache().WaitForCacheSync(mc)
			return func() error { mcancel(); return <-done }, nil
		case <-time.After(60 * time.Second):
			mcancel()
			return nil, errors.New("the controller neither refused to start nor led in 60 s")
		}
	}

	_, err = start()
	if !crdschema.IsStale(err) {
		t.Fatalf("the controller on the earlier CRDs: %v, want a stale-CRD error", err)
	}
	for _, want := range []string{
		"CustomResourceDefinition " + rvName + " (v1alpha1) lacks status.datamesh.members[].port, status.datamesh.sharedSecret.derivation, status.datamesh.sharedSecret.keyFingerprint;",
		"CustomResourceDefinition " + rvrName + " (v1alpha1) lacks status.backingVolume;",
		"CustomResourceDefinition " + rnmName + " (v1alpha1) is not installed;",
		"kubectl apply --server-side --force-conflicts -f charts/meshvol/crds/",
		`docs/install.md, "Upgrading"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the controller's error does not say %q:\n%s", want, err)
		}
	}
	if strings.Contains(err.Error(), crdschema.Name("replicatedstoragepools")) {
		t.Errorf("the controller's error names a CRD that keeps every field:\n%s", err)
	}
	if err := e.Client.Get(c, client.ObjectKey{Namespace: "default", Name: lease}, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("the leader-election Lease after the refusal: %v, want none (the check comes first)", err)
	}

	err = agent.Run(c, e.Config, e.Scheme, agent.Config{
		NodeName: "node-a", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")},
		Namespace: "default",
		Driver:    drbd.NewExecDriver(drbd.ExecConfig{NodeName: "node-a"}),
		Pools:     func(context.Context, *v1.ReplicatedStoragePool) (storage.Provider, error) { return nil, nil },
	})
	if !crdschema.IsStale(err) || !strings.Contains(err.Error(), "CustomResourceDefinition "+rvrName+" (v1alpha1) lacks status.backingVolume;") ||
		strings.Contains(err.Error(), rvName+" ") || strings.Contains(err.Error(), rnmName) {
		t.Fatalf("the agent on the earlier CRDs: %v, want a stale-CRD error naming only the RVR CRD of the kinds it writes", err)
	}

	// This tree's CRDs applied, as docs/install.md says before helm upgrade.
	for _, def := range []*apiextensionsv1.CustomResourceDefinition{defs[rvName], defs[rvrName]} {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &apiextensionsv1.CustomResourceDefinition{}
			if err := e.Client.Get(c, client.ObjectKey{Name: def.Name}, cur); err != nil {
				return err
			}
			cur.Spec = def.Spec
			return e.Client.Update(c, cur)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Client.Create(c, defs[rnmName].DeepCopy()); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, c, e.Client, rnmName)
	if err := controller.CheckCRDs(c, e.Client); err != nil {
		t.Fatalf("the controller's check on this tree's CRDs: %v", err)
	}
	if err := crdschema.Check(c, e.Client, crdschema.Agent); err != nil {
		t.Fatalf("the agent's check on this tree's CRDs: %v", err)
	}
	// The apiserver takes a CRD's new schema a moment after the update.
	deadline := time.Now().Add(30 * time.Second)
	for {
		port, err := memberPort(t, c, e.Client, name, true)
		if err == nil && port == int64(7001) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("this tree's CRD applied, an apply of status.datamesh.members[].port: stored %v, error %v", port, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop, err := start()
	if err != nil {
		t.Fatalf("the controller on this tree's CRDs: %v", err)
	}
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the controller stopping: %v", err)
	}
}

// memberPort writes an RV status whose one member has port 7001: by a server-side
// apply, as the controller writes a status, or by an update of the whole status, as a
// writer that reads an object and writes it back does. It returns the write's error, or
// the port the apiserver stored (nil when it dropped it).
func memberPort(t *testing.T, c context.Context, cl client.Client, name string, apply bool) (any, error) {
	t.Helper()
	st := rvStatus(t, name, 1, "a")
	members, _, _ := unstructured.NestedSlice(st.Object, "status", "datamesh", "members")
	members[0].(map[string]any)["port"] = int64(7001)
	if err := unstructured.SetNestedSlice(st.Object, members, "status", "datamesh", "members"); err != nil {
		t.Fatal(err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(st.GroupVersionKind())
	if apply {
		if err := cl.Status().Patch(c, st, client.Apply, client.FieldOwner(managerController), client.ForceOwnership); err != nil {
			return nil, err
		}
	} else {
		if err := cl.Get(c, client.ObjectKey{Name: name}, got); err != nil {
			t.Fatal(err)
		}
		got.Object["status"] = st.Object["status"]
		if err := cl.Status().Update(c, got); err != nil {
			return nil, err
		}
	}
	if err := cl.Get(c, client.ObjectKey{Name: name}, got); err != nil {
		t.Fatal(err)
	}
	stored, _, _ := unstructured.NestedSlice(got.Object, "status", "datamesh", "members")
	if len(stored) != 1 {
		t.Fatalf("stored members %v, want the one written", stored)
	}
	return stored[0].(map[string]any)["port"], nil
}

// waitEstablished waits until the apiserver serves the CRD called name.
func waitEstablished(t *testing.T, c context.Context, cl client.Client, name string) {
	t.Helper()
	for {
		cur := &apiextensionsv1.CustomResourceDefinition{}
		if err := cl.Get(c, client.ObjectKey{Name: name}, cur); err != nil {
			t.Fatal(err)
		}
		for _, cond := range cur.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return
			}
		}
		select {
		case <-c.Done():
			t.Fatalf("CRD %s never established", name)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
