package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// The cases are the shapes of the real upstream go.mod files build-k8s.sh
// wraps, cut down to the lines that decide something.
func TestTargetVersion(t *testing.T) {
	cases := []struct {
		name, path, required, upstream, want string
	}{
		{"kubernetes staging module at placeholder", "k8s.io/api", "v0.0.0", "v1.33.13", "v0.33.13"},
		{"etcd sibling, same major", "go.etcd.io/etcd/api/v3", "v3.5.21", "v3.5.21", "v3.5.21"},
		{"etcd client/v2 beside server/v3", "go.etcd.io/etcd/client/v2", "v2.305.21", "v3.5.21", "v2.305.21"},
		{"snapshotter client lagging require", "github.com/kubernetes-csi/external-snapshotter/client/v8", "v8.6.0", "v8.7.0", "v8.7.0"},
		{"path without major suffix keeps its require", "example.com/lib", "v1.2.0", "v1.9.0", "v1.2.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := targetVersion(c.path, c.required, c.upstream); got != c.want {
				t.Fatalf("targetVersion(%q, %q, %q) = %q, want %q", c.path, c.required, c.upstream, got, c.want)
			}
		})
	}
}

func TestWrapperGoMod(t *testing.T) {
	// As `go mod edit -json` prints it.
	const upstreamJSON = `{
		"Module": {"Path": "example.com/server/v3"},
		"Go": "1.24.0",
		"GoDebug": [{"Key": "default", "Value": "go1.24"}],
		"Require": [
			{"Path": "example.com/api/v3", "Version": "v3.5.21"},
			{"Path": "example.com/client/v2", "Version": "v2.305.21"},
			{"Path": "k8s.io/api", "Version": "v0.0.0"}
		],
		"Exclude": [{"Path": "example.com/bad", "Version": "v1.0.0"}],
		"Replace": [
			{"Old": {"Path": "example.com/api/v3"}, "New": {"Path": "../api"}},
			{"Old": {"Path": "example.com/client/v2"}, "New": {"Path": "../client/v2"}},
			{"Old": {"Path": "k8s.io/api"}, "New": {"Path": "./staging/src/k8s.io/api"}},
			{"Old": {"Path": "k8s.io/sample-controller"}, "New": {"Path": "./staging/src/k8s.io/sample-controller"}},
			{"Old": {"Path": "example.com/etcd"}, "New": {"Path": "./FORBIDDEN_DEPENDENCY"}},
			{"Old": {"Path": "k8s.io/client-go", "Version": "v0.1.0"}, "New": {"Path": "k8s.io/client-go", "Version": "v0.33.0"}}
		]
	}`
	var upstream modFile
	if err := json.Unmarshal([]byte(upstreamJSON), &upstream); err != nil {
		t.Fatal(err)
	}
	out, err := wrapperGoMod(upstream, "v3.5.21")
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{
		"\nmodule meshvol.build/wrapper/example.com/server/v3\n",
		"\ngo 1.24.0\n",
		"\ngodebug default=go1.24\n",
		"\nrequire example.com/server/v3 v3.5.21\n",
		"\nexclude example.com/bad v1.0.0\n",
		"\nreplace example.com/api/v3 => example.com/api/v3 v3.5.21\n",
		"\nreplace example.com/client/v2 => example.com/client/v2 v2.305.21\n",
		"\nreplace k8s.io/api => k8s.io/api v0.5.21\n",
		"\n// dropped: replace k8s.io/sample-controller => ./staging/src/k8s.io/sample-controller (not required by upstream)\n",
		"\nreplace k8s.io/client-go v0.1.0 => k8s.io/client-go v0.33.0\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("wrapper go.mod lacks %q; it is:\n%s", strings.TrimSpace(want), got)
		}
	}
	if strings.Contains(got, "FORBIDDEN_DEPENDENCY") || strings.Contains(got, "example.com/etcd") {
		t.Errorf("wrapper go.mod keeps the FORBIDDEN_DEPENDENCY guard:\n%s", got)
	}
	// Every replace target must be a published version, never a directory.
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(line, "replace ") && (strings.Contains(line, "=> ./") || strings.Contains(line, "=> ../")) {
			t.Errorf("local replace left in the wrapper: %s", line)
		}
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, c := range []struct{ dir, module, version, want string }{
		{"", "m", "v1.0.0", "-dir"},
		{"d", "", "v1.0.0", "-module"},
		{"d", "m", "1.0", "-version"},
	} {
		err := run(c.dir, c.module, c.version)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q, %q, %q) = %v, want an error naming %s", c.dir, c.module, c.version, err, c.want)
		}
	}
}
