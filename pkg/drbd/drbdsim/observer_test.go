package drbdsim

import (
	"context"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// comparable strips what only one of the two sources carries (events2:
// backing device, paths, may_promote, promotion_score).
func comparable(s *drbd.ResourceState) *drbd.ResourceState {
	s = s.Clone()
	s.MayPromote, s.PromotionScore = nil, nil
	for _, d := range s.Devices {
		d.BackingDev = ""
	}
	for _, c := range s.Connections {
		c.Paths = nil
	}
	return s
}

// pkg/drbd's Observer, fed by the simulator's events2 stream, ends up with
// the same state as the simulator's status --json, through a formation, an
// initial sync, a partition with quorum loss, a crash and a return: the two
// outputs of the simulator agree with each other through the real parsers.
func TestObserverAgreesWithStatus(t *testing.T) {
	rg := newRig(t, nil)
	ctx, cancel := context.WithCancel(rg.ctx)
	defer cancel()
	nodes := []string{"node1", "node2", "node3"}
	obs := map[string]*drbd.Observer{}
	for _, n := range nodes {
		o := drbd.NewObserver(rg.c.Node(n).Events, drbd.ObserverOptions{Backoff: func(int) time.Duration { return time.Millisecond }})
		obs[n] = o
		go func() {
			for range o.Changes() {
			}
		}()
		go func() { _ = o.Run(ctx) }()
	}
	agree := func(stage string) {
		t.Helper()
		for _, n := range nodes {
			st, err := rg.c.Node(n).Status(rg.ctx, "r0")
			if err != nil {
				continue // down or crashed
			}
			var want *drbd.ResourceState
			if len(st) == 1 {
				want = drbd.StateFromStatus(st[0])
			}
			var diff string
			ok := false
			for range 2000 {
				snap, has := obs[n].Snapshot("r0")
				switch {
				case want == nil && !has:
					ok = true
				case want != nil && has:
					diff = comparable(snap).Diff(comparable(want))
					ok = diff == ""
				}
				if ok {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if !ok {
				t.Fatalf("%s: %s: observer and status disagree: %s", stage, n, diff)
			}
		}
	}
	rg.upAll()
	agree("up")
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", "initial sync"))
	agree("forced primary")
	rg.c.Advance(700 * time.Millisecond)
	agree("mid-sync")
	rg.c.Advance(2 * time.Second)
	agree("synced")
	rg.c.Partition("node1")
	agree("node1 isolated")
	rg.c.Heal()
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	rg.c.Node("node2").Crash()
	agree("node2 crashed")
	rg.c.Node("node2").Restart()
	rg.must(rg.c.Node("node2").Up(rg.ctx, "r0"))
	rg.c.Advance(time.Second)
	agree("node2 back")
	rg.must(rg.c.Node("node3").Down(rg.ctx, "r0"))
	agree("node3 down")
}
