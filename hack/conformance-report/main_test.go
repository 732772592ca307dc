package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A ginkgo v2 JSON report as e2e.test writes it, cut to one spec per
// outcome: passed, failed, skipped by the suite (twice, one rule with two
// sizes), and left out by the pass's focus (no message).
const sample = `[{"SuiteDescription":"Kubernetes e2e suite","SpecReports":[
 {"ContainerHierarchyTexts":["External Storage [Driver: csi.meshvol.io]","[Testpattern: Dynamic PV (default fs)] volumes"],"LeafNodeText":"should store data","LeafNodeType":"It","State":"passed","RunTime":2000000000},
 {"ContainerHierarchyTexts":["External Storage [Driver: csi.meshvol.io]","[Testpattern: Dynamic PV (block volmode)] multiVolume"],"LeafNodeText":"should access to two volumes","LeafNodeType":"It","State":"failed","RunTime":3000000000,
  "Failure":{"Message":"timed out waiting\nfor the pod","Location":{"FileName":"multivolume.go","LineNumber":42}}},
 {"LeafNodeText":"a","LeafNodeType":"It","State":"skipped","Failure":{"Message":"Driver csi.meshvol.io doesn't support 10Gi -- skipping"}},
 {"LeafNodeText":"b","LeafNodeType":"It","State":"skipped","Failure":{"Message":"Driver csi.meshvol.io doesn't support 20Gi -- skipping"}},
 {"LeafNodeText":"c","LeafNodeType":"It","State":"skipped"},
 {"LeafNodeType":"SynchronizedBeforeSuite","State":"passed"}
]}]`

func TestReportCountsAndGroupsSkips(t *testing.T) {
	p := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(p, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := read("parallel", p)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.passed) != 1 || len(got.failed) != 1 || len(got.skipped) != 2 || len(got.unselected) != 1 {
		t.Fatalf("passed %d failed %d skipped %d unselected %d, want 1 1 2 1", len(got.passed), len(got.failed), len(got.skipped), len(got.unselected))
	}
	var out strings.Builder
	notRun := []notHere{{re: regexp.MustCompile("^c$"), why: "needs what this machine lacks"}}
	if failed := write(&out, []pass{got}, notRun, 0); !failed {
		t.Error("write reported no failure")
	}
	for _, want := range []string{
		"| parallel | 1 | 1 | 2 | 0 | 5s |",
		"- External Storage [Driver: csi.meshvol.io] [Testpattern: Dynamic PV (block volmode)] multiVolume should access to two volumes (failed)\n  - multivolume.go:42: timed out waiting …",
		"| 2 | Driver csi.meshvol.io doesn't support NGi -- skipping |",
		"| 1 | `^c$` | needs what this machine lacks |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the summary lacks %q:\n%s", want, out.String())
		}
	}
}
