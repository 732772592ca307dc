package modelcheck

import (
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

// The model check of the real engine. `go test` runs the CI depth;
// `make modelcheck` runs `-modelcheck.depth=deep`. docs/modelcheck.md has
// the invariants, the bounds and the recorded figures.
var (
	depthFlag    = flag.String("modelcheck.depth", "ci", "model check depth: ci or deep")
	maxDepthFlag = flag.Int("modelcheck.maxdepth", 0, "override the depth bound (actions per run)")
	requestsFlag = flag.Int("modelcheck.requests", -1, "override the number of requests per run")
	returnsFlag  = flag.Int("modelcheck.returns", -1, "override the number of lost nodes that may come back behind a partition per run")
	attachFlag   = flag.Int("modelcheck.attach", -1, "override the number of attach/detach requests per run beyond -modelcheck.requests")
)

// depths are the bounds per depth: for small layouts (up to 3 replicas),
// for large ones (4D+1TB, 5D), and a second pass over the small layouts
// that spends its requests on attachments only (two of them: enough to move
// the attachment, detach here and attach there, with a node loss or an agent
// restart in between; the mutation check found an unsafe second Attach that a single
// request per run never reaches). A run injects up to Requests requests of
// any kind plus AttachRequests attach/detach requests, loses up to Losses
// nodes, restarts up to Restarts agents, and stops after Depth actions; every
// state at the bound (and every state where nothing can happen) is drained
// to check liveness.
var depths = map[string][3]Bounds{
	"ci": {
		{Depth: 11, Requests: 1, Losses: 1, Returns: 1, Restarts: 1, Spare: 2, MaxStates: 200000},
		{Depth: 7, Requests: 1, Losses: 1, Returns: 1, Restarts: 0, Spare: 2, MaxStates: 200000},
		{Depth: 11, Requests: 0, AttachRequests: 2, Losses: 1, Returns: 1, Restarts: 1, Spare: 2, MaxStates: 200000},
	},
	"deep": {
		{Depth: 14, Requests: 2, Losses: 1, Returns: 1, Restarts: 1, DiskFailures: 1, Spare: 2, MaxStates: 1000000},
		{Depth: 10, Requests: 1, Losses: 1, Returns: 1, Restarts: 1, DiskFailures: 1, Spare: 2, MaxStates: 1000000},
		{Depth: 14, Requests: 0, AttachRequests: 3, Losses: 1, Returns: 1, Restarts: 1, DiskFailures: 1, Spare: 2, MaxStates: 1000000},
	},
}

func scenarios(small, large, attach Bounds) []*Scenario {
	var out []*Scenario
	for _, l := range StartLayouts {
		b := small
		if l.D+l.TB > 3 {
			b = large
		}
		for _, topo := range []v1alpha1.Topology{v1alpha1.TopologyZonal, v1alpha1.TopologyTransZonal} {
			for _, shadow := range []bool{false, true} {
				out = append(out, NewScenario(l, shadow, topo, b))
				if l.D+l.TB <= 3 && attach.AttachRequests > 0 {
					s := NewScenario(l, shadow, topo, attach)
					s.Name += "/attach"
					out = append(out, s)
				}
			}
		}
	}
	return out
}

func TestModelCheck(t *testing.T) {
	bs, ok := depths[*depthFlag]
	if !ok {
		t.Fatalf("-modelcheck.depth=%q: want ci or deep", *depthFlag)
	}
	for i := range bs {
		if *maxDepthFlag > 0 {
			bs[i].Depth = *maxDepthFlag
		}
		if *requestsFlag >= 0 {
			bs[i].Requests = int8(*requestsFlag)
		}
		if *returnsFlag >= 0 {
			bs[i].Returns = int8(*returnsFlag)
		}
		if *attachFlag >= 0 {
			bs[i].AttachRequests = int8(*attachFlag)
		}
	}
	start := time.Now()
	var mu sync.Mutex
	var total Stats
	t.Run("layouts", func(t *testing.T) {
		for _, s := range scenarios(bs[0], bs[1], bs[2]) {
			s := s
			t.Run(s.Name, func(t *testing.T) {
				t.Parallel()
				c := NewChecker(s, datamesh.NewEngine(nil, datamesh.Features{ShadowDiskful: s.Shadow}))
				err := c.Run()
				capped := ""
				if c.Stats.Capped {
					capped = " (state cap reached)"
				}
				t.Logf("%-28s depth=%d states=%d actions=%d process=%d leaves=%d%s", s.Name, s.MaxDepth, c.Stats.States, c.Stats.Transitions, c.Stats.Process, c.Stats.Leaves, capped)
				mu.Lock()
				total.States += c.Stats.States
				total.Transitions += c.Stats.Transitions
				total.Process += c.Stats.Process
				total.Leaves += c.Stats.Leaves
				mu.Unlock()
				if err != nil {
					for _, f := range c.Failures {
						t.Error(f)
					}
				}
			})
		}
	})
	msg := fmt.Sprintf("model check (%s): %d states explored, %d actions, %d engine calls, %d leaves drained, in %s",
		*depthFlag, total.States, total.Transitions, total.Process, total.Leaves, time.Since(start).Round(time.Millisecond))
	t.Log(msg)
	fmt.Println(msg)
}

// checkScenario explores s with the real engine and fails t on each violation found,
// or on the error that kept the exploration from starting.
func checkScenario(t *testing.T, s *Scenario) {
	t.Helper()
	c := NewChecker(s, datamesh.NewEngine(nil, datamesh.Features{}))
	err := c.Run()
	t.Logf("%s: states=%d actions=%d capped=%v", s.Name, c.Stats.States, c.Stats.Transitions, c.Stats.Capped)
	if err == nil {
		return
	}
	for _, f := range c.Failures {
		t.Error(f)
	}
	if len(c.Failures) == 0 {
		t.Error(err)
	}
}
