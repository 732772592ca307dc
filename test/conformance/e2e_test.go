// Package conformance builds Kubernetes' own end-to-end test binary,
// e2e.test, from k8s.io/kubernetes at the version meshvol's cluster runs
// (bin/k8s), with only what the External Storage suite needs: the storage
// specs that read a driver's capabilities from a testdriver.yaml
// (test/e2e/storage/external) and the framework's init packages. It is a
// module of its own so that meshvol's module does not inherit Kubernetes'
// dependency graph. `make conformance` builds it with `go test -c` and runs
// it against the sandbox's chart-installed driver (README.md).
package conformance

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"k8s.io/component-base/version"
	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"

	// The feature labels, the External Storage suite, and what upstream's
	// e2e_test.go initialises the framework with.
	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/e2e/storage/external"
	_ "k8s.io/kubernetes/test/utils/format"
)

// TestMain registers and parses the framework's flags as upstream's
// test/e2e/e2e_test.go does.
func TestMain(m *testing.M) {
	versionFlag := flag.CommandLine.Bool("version", false, "Displays version information.")
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	if *versionFlag {
		fmt.Printf("%s\n", version.Get())
		os.Exit(0)
	}
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

// TestE2E runs the specs Ginkgo selects (--ginkgo.focus, --ginkgo.skip,
// --ginkgo.label-filter).
func TestE2E(t *testing.T) { e2e.RunE2ETests(t) }
