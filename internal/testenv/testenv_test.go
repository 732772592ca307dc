package testenv_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	storagev1alpha1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// env is the control plane all tests of this package share, with meshvol's
// own CRDs, the VolumeSnapshot CRDs and the package's fixture CRD installed.
var env *testenv.Env

func TestMain(m *testing.M) {
	dirs, err := testenv.DefaultCRDDirs()
	if err != nil {
		panic(err)
	}
	snapshots, err := testenv.SnapshotCRDDir()
	if err != nil {
		panic(err)
	}
	os.Exit(testenv.Main(m, &env, testenv.Options{
		CRDDirs: append(dirs, snapshots, filepath.Join("testdata", "crd")),
	}))
}

var widgetGVK = schema.GroupVersionKind{Group: "testenv.meshvol.io", Version: "v1", Kind: "Widget"}

func widget(name string, size int64) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(widgetGVK)
	u.SetName(name)
	if err := unstructured.SetNestedField(u.Object, size, "spec", "size"); err != nil {
		panic(err)
	}
	return u
}

// The binaries in bin/k8s are the pinned release, not a build that forgot
// its -X version flags (which reports v0.0.0-master).
func TestAPIServerIsThePinnedRelease(t *testing.T) {
	if env.Version.GitVersion != testenv.KubernetesVersion {
		t.Fatalf("apiserver reports %s, want %s: rebuild with `make k8s` or update testenv.KubernetesVersion with the pin in hack/build-k8s.sh",
			env.Version.GitVersion, testenv.KubernetesVersion)
	}
	if env.Version.Major != "1" || env.Version.Minor != "33" {
		t.Fatalf("apiserver reports major %q minor %q, want 1 and 33", env.Version.Major, env.Version.Minor)
	}
	if env.EtcdVersion != "3.5.21" {
		t.Fatalf("etcd reports %s, want 3.5.21", env.EtcdVersion)
	}
	if env.StartDuration <= 0 {
		t.Fatalf("StartDuration = %s, want the measured start time", env.StartDuration)
	}
}

// The fixture CRD is served with its schema: the apiserver, not the client,
// rejects a Widget that breaks it, and the status subresource is separate.
func TestFixtureCRDIsServedAndValidated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := testenv.Name(t)

	if err := env.Client.Create(ctx, widget(name, 3)); err != nil {
		t.Fatalf("create widget: %v", err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(widgetGVK)
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
		t.Fatalf("get widget: %v", err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Fatalf("spec.size = %d, want 3", size)
	}

	err := env.Client.Create(ctx, widget(testenv.Name(t)+"-bad", 0))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.size") {
		t.Fatalf("create widget with size 0: got %v, want Invalid naming spec.size", err)
	}

	// A status write through the main resource is dropped by the apiserver
	// when the status subresource is enabled; through /status it sticks.
	if err := unstructured.SetNestedField(got.Object, true, "status", "ready"); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Status().Update(ctx, got); err != nil {
		t.Fatalf("status update: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
		t.Fatal(err)
	}
	if ready, _, _ := unstructured.NestedBool(got.Object, "status", "ready"); !ready {
		t.Fatal("status.ready not stored through the status subresource")
	}
}

// meshvol's own CRDs from config/crd are installed and the typed client
// reaches them through the scheme testenv builds.
func TestMeshvolCRDsInstalled(t *testing.T) {
	want := map[string]bool{}
	for _, plural := range []string{"replicatedvolumes", "replicatedvolumereplicas", "replicatedvolumeattachments", "replicatedstorageclasses", "replicatedstoragepools", "replicatedvolumesnapshots"} {
		want[plural+"."+storagev1alpha1.GroupName] = false
	}
	for _, crd := range env.CRDs {
		if _, ok := want[crd.Name]; ok {
			want[crd.Name] = true
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("CRD %s not installed from config/crd", name)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var list storagev1alpha1.ReplicatedVolumeList
	if err := env.Client.List(ctx, &list); err != nil {
		t.Fatalf("typed list of ReplicatedVolumes: %v", err)
	}
}

// The VolumeSnapshot CRDs that hack/build-k8s.sh copies from
// external-snapshotter install and serve, for the sidecar tests.
func TestSnapshotCRDsInstalled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, kind := range []string{"VolumeSnapshot", "VolumeSnapshotContent", "VolumeSnapshotClass"} {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: kind + "List"})
		if err := env.Client.List(ctx, list); err != nil {
			t.Errorf("list %s: %v", kind, err)
		}
	}
}

func TestMissingBinariesFailWithTheFix(t *testing.T) {
	_, err := testenv.Start(testenv.Options{BinDir: t.TempDir(), CRDDirs: []string{}})
	if !errors.Is(err, testenv.ErrBinariesMissing) {
		t.Fatalf("Start with an empty bin dir: got %v, want ErrBinariesMissing", err)
	}
	for _, want := range []string{"kube-apiserver and etcd", "make k8s"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestMissingCRDDirFails(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	_, err := testenv.Start(testenv.Options{CRDDirs: []string{missing}})
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Start with a missing CRD dir: got %v, want an error naming %s", err, missing)
	}
}

// A control plane of a test's own is independent of the shared one: an
// object created in one is not in the other, and it is stopped at the end.
func TestStartTIsIndependent(t *testing.T) {
	own := testenv.StartT(t, testenv.Options{CRDDirs: []string{filepath.Join("testdata", "crd")}})
	if own.Config.Host == env.Config.Host {
		t.Fatalf("StartT reused the shared apiserver at %s", own.Config.Host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := testenv.Name(t)
	if err := own.Client.Create(ctx, widget(name, 1)); err != nil {
		t.Fatal(err)
	}
	got := widget(name, 1)
	err := env.Client.Get(ctx, client.ObjectKey{Name: name}, got)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("widget created in the test's own control plane: shared one answered %v, want NotFound", err)
	}
}

func TestNameIsADNSLabel(t *testing.T) {
	t.Run("Sub_Test/With Spaces and a very long name that goes on and on past sixty-three characters", func(t *testing.T) {
		n := testenv.Name(t)
		if len(n) > 63 {
			t.Fatalf("Name = %q: %d characters, want at most 63", n, len(n))
		}
		for _, r := range n {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
				t.Fatalf("Name = %q: %q is not allowed in a DNS label", n, r)
			}
		}
		if n[0] == '-' || n[len(n)-1] == '-' {
			t.Fatalf("Name = %q: starts or ends with '-'", n)
		}
	})
}

// BenchmarkStartStop measures what one control plane costs a test package:
// etcd and kube-apiserver up, meshvol's CRDs served, then stopped.
func BenchmarkStartStop(b *testing.B) {
	var started time.Duration
	n := 0
	for b.Loop() {
		e, err := testenv.Start(testenv.Options{Log: discard{}})
		if err != nil {
			b.Fatal(err)
		}
		started += e.StartDuration
		n++
		if err := e.Stop(); err != nil {
			b.Fatal(err)
		}
	}
	// Start alone, without the stop that ns/op includes.
	b.ReportMetric(started.Seconds()/float64(n), "start-s/op")
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// An apiserver restart keeps every object and the address, and the clients made
// before it work again afterwards (the soak's "apiserver restart" fault relies on it).
func TestRestartAPIServerKeepsObjectsAndClients(t *testing.T) {
	t.Parallel()
	own := testenv.StartT(t, testenv.Options{CRDDirs: []string{filepath.Join("testdata", "crd")}})
	ctx := context.Background()
	w := widget("before-restart", 3)
	if err := own.Client.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := own.RestartAPIServer(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(widgetGVK)
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if err = own.Client.Get(ctx, client.ObjectKey{Name: "before-restart"}, got); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("the client made before the restart cannot read the widget after it: %v", err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 3 {
		t.Fatalf("the widget's size after the restart is %d, want 3", size)
	}
}
