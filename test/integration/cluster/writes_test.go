package cluster_test

import (
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/internal/localcluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// formationBudget is the most apiserver writes, the controller's and the agents'
// together (Events included), one 3D formation may take: docs/controller.md, "Write
// budget", says what each is for.
const formationBudget = 16

// Scenario 8: apiserver writes per operation, counted at the HTTP layer for
// the controller and all agents: a 3D formation (at most formationBudget), an
// attach, and a steady minute (0 besides the agents' Lease renewals).
func TestWritesPerOperation(t *testing.T) {
	r := newRig(t)
	class := r.class(1, 1, v1.TopologyIgnored)
	time.Sleep(2 * time.Second) // let placement views settle after the class
	before := r.c.Writes.Snapshot()
	r.volume("writes-3d", class, 1)
	rv := r.ready("writes-3d", 2*time.Minute)
	formation, _ := r.c.Writes.Since(before)
	n := withoutLeases(formation)
	t.Logf("3D formation: %d writes besides Lease renewals\n%s", n, localcluster.Format(formation))
	if n > formationBudget {
		t.Errorf("a 3D formation took %d writes, more than its budget of %d (docs/controller.md, \"Write budget\")", n, formationBudget)
	}

	node := rv.Status.Datamesh.Members[0].NodeName
	before = r.c.Writes.Snapshot()
	r.attach("writes-3d", node)
	attach, na := r.c.Writes.Since(before)
	t.Logf("attach: %d writes\n%s", na, localcluster.Format(attach))

	time.Sleep(2 * time.Second)
	before = r.c.Writes.Snapshot()
	time.Sleep(time.Minute)
	steady, _ := r.c.Writes.Since(before)
	nonLease := withoutLeases(steady)
	t.Logf("steady minute: %d writes besides Lease renewals\n%s", nonLease, localcluster.Format(steady))
	if nonLease > 0 {
		t.Errorf("a steady volume caused %d writes in a minute, want 0", nonLease)
	}
	r.detach("writes-3d", node)
	r.deleteVolume("writes-3d")
}

// withoutLeases totals counts but the agents' Lease renewals, which are a function of
// time, not of the operation.
func withoutLeases(counts map[string]int) int {
	n := 0
	for k, v := range counts {
		if !strings.HasSuffix(k, " leases") {
			n += v
		}
	}
	return n
}
