package main

import (
	"testing"

	"github.com/meshvol/meshvol/test/sanity"
)

// A skipped spec as csi-sanity v5.6.0 prints it with --ginkgo.v --ginkgo.no-color.
const skippedLog = `  [SKIPPED] in [It] - github.com/kubernetes-csi/csi-test/v5@v5.6.0/pkg/sanity/controller.go:473 @ 11/25/26 23:08:09.56
S [SKIPPED] [0.004 seconds]
Controller Service [Controller Server] ModifyVolume [It] should fail if no volume id is given
github.com/kubernetes-csi/csi-test/v5@v5.6.0/pkg/sanity/controller.go:471

  [SKIPPED] Modify volume not supported
  In [It] at: github.com/kubernetes-csi/csi-test/v5@v5.6.0/pkg/sanity/controller.go:473 @ 11/25/26 23:08:09.56
------------------------------
S [SKIPPED] [0.003 seconds]
Node Service NodePublishVolume [BeforeEach] should do something new
github.com/kubernetes-csi/csi-test/v5@v5.6.0/pkg/sanity/node.go:425

  [SKIPPED] Service does not have a capability meshvol should have
------------------------------
Ran 57 of 103 Specs in 42.000 seconds
SUCCESS! -- 57 Passed | 0 Failed | 1 Pending | 45 Skipped
`

func TestSkipped(t *testing.T) {
	got := skipped([]byte(skippedLog))
	want := []skip{
		{"Controller Service [Controller Server] ModifyVolume [It] should fail if no volume id is given", "Modify volume not supported"},
		{"Node Service NodePublishVolume [BeforeEach] should do something new", "Service does not have a capability meshvol should have"},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("skipped: %q, want %q", got, want)
	}
	if !sanity.AllowedSkip(got[0].reason) || sanity.AllowedSkip(got[1].reason) {
		t.Fatalf("AllowedSkip: %v for %q, %v for %q; want true, false", sanity.AllowedSkip(got[0].reason), got[0].reason,
			sanity.AllowedSkip(got[1].reason), got[1].reason)
	}
	if s := summarize([]byte(skippedLog)); s != "Ran 57 of 103 Specs, 57 Passed | 0 Failed | 1 Pending | 45 Skipped" {
		t.Fatalf("summarize: %q", s)
	}
}
