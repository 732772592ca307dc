package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/internal/localcluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Scenario 8: apiserver writes per operation, counted at the HTTP layer for
// the controller and all agents: a 3D formation (goal ≤ 15), an attach, and a
// steady minute (goal 0 besides the agents' Lease renewals).
func TestWritesPerOperation(t *testing.T) {
	r := newRig(t)
	class := r.class(1, 1, v1.TopologyIgnored)
	time.Sleep(2 * time.Second) // let placement views settle after the class
	before := r.c.Writes.Snapshot()
	r.volume("writes-3d", class, 1)
	rv := r.ready("writes-3d", 2*time.Minute)
	formation, n := r.c.Writes.Since(before)
	t.Logf("3D formation: %d writes\n%s", n, localcluster.Format(formation))

	node := rv.Status.Datamesh.Members[0].NodeName
	before = r.c.Writes.Snapshot()
	r.attach("writes-3d", node)
	attach, na := r.c.Writes.Since(before)
	t.Logf("attach: %d writes\n%s", na, localcluster.Format(attach))

	time.Sleep(2 * time.Second)
	before = r.c.Writes.Snapshot()
	time.Sleep(time.Minute)
	steady, _ := r.c.Writes.Since(before)
	nonLease := 0
	for k, v := range steady {
		if !strings.HasSuffix(k, " leases") {
			nonLease += v
		}
	}
	t.Logf("steady minute: %d writes besides Lease renewals\n%s", nonLease, localcluster.Format(steady))
	if nonLease > 0 {
		t.Errorf("a steady volume caused %d writes in a minute, want 0", nonLease)
	}
	r.detach("writes-3d", node)
	r.deleteVolume("writes-3d")
}
