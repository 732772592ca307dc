package cluster_test

import "testing"

// TestZZStop runs last (tests run in source order, files in name order:
// this file sorts last) and
// stops the shared cluster, checking that nothing is left behind.
func TestZZStop(t *testing.T) {
	if lc == nil {
		t.Skip("no cluster was started")
	}
	if err := lc.Stop(); err != nil {
		t.Fatal(err)
	}
	lc = nil
}
