package api

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/meshvol/meshvol/internal/testenv"
)

const managerExamples = "examples-test"

// exampleDoc is one YAML document of an example file.
type exampleDoc struct {
	obj *unstructured.Unstructured
	raw string
}

// readExamples returns the YAML documents of file, skipping documents that hold only
// comments.
func readExamples(t *testing.T, file string) []exampleDoc {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []exampleDoc
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		docs = append(docs, exampleDoc{obj: u, raw: string(raw)})
	}
	if len(docs) == 0 {
		t.Fatalf("%s holds no object", file)
	}
	return docs
}

func exampleFiles(t *testing.T, dir string) []string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no examples in %s", dir)
	}
	return files
}

// strict makes the apiserver refuse unknown and duplicate fields instead of dropping
// them, as kubectl does by default: an example with a misspelt field must fail here,
// not mislead a user.
var strict = client.FieldValidation("Strict")

// TestExamplesAccepted applies every object in deploy/examples with server-side apply
// and dryRun=All: the apiserver runs defaulting, every validation rule and the field
// manager, and stores nothing.
func TestExamplesAccepted(t *testing.T) {
	type ref struct{ kind, name string }
	defined := map[ref]bool{}
	var refs []struct{ from, to ref }
	shapes := map[string]bool{}

	for _, file := range exampleFiles(t, "deploy/examples") {
		for _, doc := range readExamples(t, file) {
			u := doc.obj
			t.Run(filepath.Base(file)+"/"+u.GetName(), func(t *testing.T) {
				if u.GetAPIVersion() != apiVersion {
					t.Errorf("apiVersion %q, want %q", u.GetAPIVersion(), apiVersion)
				}
				if err := apply(ctx(t), u, managerExamples, client.DryRunAll, strict); err != nil {
					t.Errorf("example refused: %v", err)
				}
			})

			// Record what the example is and what it refers to, so the set of examples
			// can be checked as a whole below.
			kind, name := u.GetKind(), u.GetName()
			defined[ref{kind, name}] = true
			str := func(path ...string) string { s, _, _ := unstructured.NestedString(u.Object, path...); return s }
			switch kind {
			case "ReplicatedStorageClass":
				refs = append(refs, struct{ from, to ref }{ref{kind, name}, ref{"ReplicatedStoragePool", str("spec", "storagePool")}})
				switch {
				case str("spec", "replication") != "":
					shapes["rsc legacy replication"] = true
				case str("spec", "topology") == "TransZonal":
					shapes["rsc TransZonal"] = true
				default:
					shapes["rsc ftt/gmdr"] = true
				}
			case "ReplicatedStoragePool":
				shapes["rsp "+str("spec", "type")] = true
			case "ReplicatedVolume":
				if str("spec", "configurationMode") == "Manual" {
					shapes["rv Manual"] = true
					refs = append(refs, struct{ from, to ref }{ref{kind, name}, ref{"ReplicatedStoragePool", str("spec", "manualConfiguration", "storagePool")}})
				} else {
					shapes["rv Auto"] = true
					refs = append(refs, struct{ from, to ref }{ref{kind, name}, ref{"ReplicatedStorageClass", str("spec", "replicatedStorageClassName")}})
				}
			}
		}
	}

	// The examples are a set a user starts from: one of each shape, and every class
	// and volume names a pool or class that the examples define (the apiserver does
	// not check references, so this test does).
	for _, s := range []string{"rsc ftt/gmdr", "rsc legacy replication", "rsc TransZonal", "rsp LVM", "rsp LVMThin", "rsp File", "rv Auto", "rv Manual"} {
		if !shapes[s] {
			t.Errorf("deploy/examples has no %s example", s)
		}
	}
	for _, r := range refs {
		if !defined[r.to] {
			t.Errorf("example %s %s refers to %s %q, which no example defines", r.from.kind, r.from.name, r.to.kind, r.to.name)
		}
	}
}

// expectations returns the `# expect: ` lines of an example file.
func expectations(raw string) []string {
	var out []string
	for _, line := range strings.Split(raw, "\n") {
		if e, ok := strings.CutPrefix(strings.TrimSpace(line), "# expect:"); ok {
			out = append(out, strings.TrimSpace(e))
		}
	}
	return out
}

// TestBadExamplesRefused applies each file of deploy/examples/bad and checks that the
// apiserver refuses its last object with the message the file's `# expect:` line names.
// Earlier documents in a file are applied for real first: they set up an update.
func TestBadExamplesRefused(t *testing.T) {
	for _, file := range exampleFiles(t, "deploy/examples/bad") {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			expect := expectations(string(data))
			if len(expect) == 0 {
				t.Fatalf("%s has no `# expect: <message>` line", file)
			}
			docs := readExamples(t, file)
			for _, d := range docs[:len(docs)-1] {
				if err := apply(ctx(t), d.obj, managerExamples, strict); err != nil {
					t.Fatalf("setting up: the apiserver refused an earlier document: %v\n%s", err, d.raw)
				}
				cleanup(t, d.obj)
			}
			last := docs[len(docs)-1].obj
			cleanup(t, last) // in case the example is wrongly accepted
			err = apply(ctx(t), last, managerExamples, client.DryRunAll, strict)
			if err == nil {
				t.Fatalf("the apiserver accepted a bad example")
			}
			for _, e := range expect {
				if !strings.Contains(err.Error(), e) {
					t.Errorf("error does not contain the expected %q:\n%v", e, err)
				}
			}
		})
	}
}
