package soak_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// Minimal reproductions of what the campaign found. Each replays the few steps of a
// failing seed on a fresh cluster and asserts what should have happened.

// TestAttachMovesToSurvivorAfterVoterLoss (seed 0): a 2D+1TB volume is attached on a
// node without a replica (a diskless Access member); one Diskful node crashes; the
// attachment moves to the surviving Diskful. The move must complete once the lost
// node is declared lost and force-removed (docs/layouts.md: the survivor writes with
// q=1 after a confirmed loss), and the volume must be Ready again once the node is
// back.
//
// What the seed found: the Attach of the survivor is published while its DRBD has no
// quorum (one of two voters, the Access member that kept the tiebreaker's diskless
// majority having left), so its promotion is refused; then the force removal of the
// lost voter is published, and the survivor's agent cannot confirm it, because it
// confirms a revision only once the role the datamesh asks for is reached (Primary);
// the q↓ that would give it quorum waits for that confirmation. The volume stays
// "Failed: No replica has quorum" for good, also after the lost node returns.
func TestAttachMovesToSurvivorAfterVoterLoss(t *testing.T) {
	needs(t)
	if os.Getenv("MESHVOL_SOAK_KNOWN") == "" {
		t.Skip("known deadlock, reported and not fixed yet (docs/soak.md, Findings): set MESHVOL_SOAK_KNOWN=1 to run it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := localcluster.Start(ctx, localcluster.Options{Nodes: 4, NamePrefix: "repro", LoopDevices: true,
		Controller: localcluster.Controller(controller.Options{AgentGracePeriod: 3 * time.Second})})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, c: c, pool: "soak", dir: t.TempDir(), start: time.Now(),
		crashed: map[string]bool{}, agentStopped: map[string]bool{}, failedDisks: map[string]bool{}}
	t.Cleanup(func() {
		w.stopAllSessions()
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	if _, err := c.CreatePool(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	v := w.createLayout(layouts[2]) // 2D+1TB
	if why := w.waitReady(v.name, 2*time.Minute); why != "Ready" {
		t.Fatal(why)
	}
	rv := &v1.ReplicatedVolume{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: v.name}, rv); err != nil {
		t.Fatal(err)
	}
	var diskful []string
	used := map[string]bool{}
	for _, m := range rv.Status.Datamesh.Members {
		used[m.NodeName] = true
		if m.Type == v1.MemberTypeDiskful {
			diskful = append(diskful, m.NodeName)
		}
	}
	spare := ""
	for _, n := range w.nodeNames() {
		if !used[n] {
			spare = n
		}
	}
	w.attachOn(v, spare)
	if v.sess == nil {
		t.Fatalf("not attached on %s: %s", spare, w.history[len(w.history)-1])
	}
	lost, survivor := diskful[0], diskful[1]
	w.deactivate(v)
	if err := c.CrashNode(lost); err != nil {
		t.Fatal(err)
	}
	w.crashed[lost] = true
	w.step("crash %s", lost)
	w.step("detach %s from %s: %s", v.name, spare, w.detachVol(v))
	v.node = survivor
	w.attachOn(v, survivor)
	if v.sess == nil {
		w.step("settle: %s", w.activate(v, 90*time.Second))
	}
	if v.sess == nil {
		w.fail("the attachment did not move to the surviving Diskful %s after %s was lost", survivor, lost)
	}
	w.deactivate(v)
	if err := c.RestartNode(lost); err != nil {
		t.Fatal(err)
	}
	if why := w.waitReady(v.name, 2*time.Minute); why != "Ready" {
		w.fail("%s", why)
	}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: v.name}, rv); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionReady); cond == nil {
		t.Fatal(fmt.Sprint("no Ready condition: ", rv.Status.Conditions))
	}
}
