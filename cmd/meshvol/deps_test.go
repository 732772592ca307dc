package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoTestHarness checks that the binary users run carries the
// product only: the sandbox, the in-process clusters, envtest and the DRBD
// simulator are test harnesses and live in cmd/meshvol-sandbox and internal/.
func TestBinaryLinksNoTestHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	forbidden := []string{
		"sigs.k8s.io/controller-runtime/pkg/envtest",
		"github.com/meshvol/meshvol/internal/testenv",
		"github.com/meshvol/meshvol/internal/kubecluster",
		"github.com/meshvol/meshvol/internal/localcluster",
		"github.com/meshvol/meshvol/internal/sandbox",
		"github.com/meshvol/meshvol/internal/ociimage",
		"github.com/meshvol/meshvol/pkg/drbd/drbdsim",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps listed only %d packages; expected the whole graph:\n%s", len(deps), out)
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("cmd/meshvol links %s, a test harness; it belongs to cmd/meshvol-sandbox or the tests only", dep)
			}
		}
	}
}
