package packaging

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/meshvol/meshvol/internal/testenv"
)

// namespace is the release namespace every render uses.
const namespace = "meshvol-system"

var (
	env      *testenv.Env
	repoRoot string
)

func TestMain(m *testing.M) {
	root, err := testenv.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	repoRoot = root
	crds, err := testenv.DefaultCRDDirs()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin, err := testenv.DefaultBinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The ServiceMonitor CRD (monitoring on) comes from prometheus-operator's module.
	crds = append(crds, filepath.Join(bin, "monitoring-crds"))
	os.Exit(testenv.Main(m, &env, testenv.Options{CRDDirs: crds}))
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func helmBin(t *testing.T) string {
	t.Helper()
	p := filepath.Join(env.BinDir, "helm")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make k8s` (hack/build-k8s.sh builds helm from its Go module)", p)
	}
	return p
}

func chartDir() string { return filepath.Join(repoRoot, "charts", "meshvol") }

// helm runs the helm binary with values (YAML, may be empty) written to a file, and
// returns stdout, or an error carrying stderr.
func helm(t *testing.T, values string, args ...string) (string, error) {
	t.Helper()
	if values != "" {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-f", f)
	}
	// The chart requires Kubernetes 1.30 or later; offline, helm assumes 1.20 unless told.
	if args[0] == "template" || args[0] == "lint" {
		args = append(args, "--kube-version", testenv.KubernetesVersion)
	}
	cmd := exec.Command(helmBin(t), args...)
	// helm keeps caches and config under $HOME; keep them out of the user's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// render returns the objects the chart renders with values, CRDs included.
func render(t *testing.T, values string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, values, "template", "meshvol", chartDir(), "--namespace", namespace, "--include-crds")
	if err != nil {
		t.Fatal(err)
	}
	return parseObjects(t, out)
}

func parseObjects(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(manifests), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("rendered manifests do not parse: %v", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		objs = append(objs, u)
	}
	if len(objs) == 0 {
		t.Fatal("the chart rendered no objects")
	}
	return objs
}

// find returns the rendered object of kind and name, or fails.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q among the %d rendered objects", kind, name, len(objs))
	return nil
}

func count(objs []*unstructured.Unstructured, kind string) int {
	n := 0
	for _, o := range objs {
		if o.GetKind() == kind {
			n++
		}
	}
	return n
}

// ensureNamespace creates the release namespace once.
func ensureNamespace(t *testing.T) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := env.Client.Create(ctx(t), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
