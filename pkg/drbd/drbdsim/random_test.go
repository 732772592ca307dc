package drbdsim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// TestRandomFaultsKeepPromises drives the formed three-node cluster
// (quorum majority, io-error) through random partitions, crashes,
// graceful downs, promotions, demotions and writes, and checks after every
// step what DRBD promises with quorum: no UpToDate quorate replica lacks an
// acknowledged write, no split brain is ever detected, and two nodes never
// both could write without replicating to each other (TwoWriters).
func TestRandomFaultsKeepPromises(t *testing.T) {
	runs, steps := 300, 40
	if testing.Short() {
		runs = 30
	}
	nodes := []string{"node1", "node2", "node3"}
	okWrites, okPromotions, failedWrites := 0, 0, 0
	defer func() {
		t.Logf("%d runs × %d steps: %d writes acknowledged, %d refused; %d promotions", runs, steps, okWrites, failedWrites, okPromotions)
	}()
	for run := range runs {
		rg := formed(t, nil)
		rg.c.SetConnectInt(time.Second) // shorter than DRBD's 10 s: fewer settle steps per run
		rnd := rand.New(rand.NewPCG(uint64(run), 42))
		var log []string
		fail := func(format string, args ...any) {
			t.Fatalf("run %d: %s\nsteps:\n  %s", run, fmt.Sprintf(format, args...), strings.Join(log, "\n  "))
		}
		for range steps {
			a, b := nodes[rnd.IntN(3)], nodes[rnd.IntN(3)]
			n := rg.c.Node(a)
			var step string
			var err error
			switch rnd.IntN(10) {
			case 0:
				if a != b {
					rg.c.Cut(a, b)
					step = "cut " + a + " " + b
				}
			case 1:
				// The link is used at the next connect attempt, up to
				// connect-int later. (Without that wait, a write can be acknowledged in
				// between by a Primary whose quorum went stale when the third
				// node left gracefully: the refusal of such a departure is not
				// modelled, see doc.go.)
				rg.c.Connect(a, b)
				rg.c.Advance(time.Second)
				step = "connect " + a + " " + b
			case 2:
				if rnd.IntN(4) == 0 {
					n.Crash()
					step = "crash " + a
				}
			case 3:
				n.Restart()
				err = n.Adjust(rg.ctx, "r0")
				step = "restart+adjust " + a
			case 4:
				err = n.Primary(rg.ctx, "r0", drbd.NoForce)
				step = "primary " + a
			case 5:
				err = n.Secondary(rg.ctx, "r0")
				step = "secondary " + a
			case 6, 7:
				for _, x := range nodes { // write where a Primary is, if any
					if r := rg.c.nodes[x].res["r0"]; r != nil && r.role == rolePrimary {
						a, n = x, rg.c.nodes[x]
					}
				}
				off := int64(rnd.IntN(64)) * 4096
				err = n.Write(rg.ctx, "r0", off, pattern(byte(rnd.IntN(256)), 4096))
				step = fmt.Sprintf("write %s @%d", a, off)
			case 8:
				rg.c.Advance(time.Duration(rnd.IntN(3000)) * time.Millisecond)
				step = "advance"
			case 9:
				if rnd.IntN(3) == 0 {
					err = n.Down(rg.ctx, "r0")
					step = "down " + a
				}
			}
			if step == "" {
				continue
			}
			switch {
			case err != nil && strings.HasPrefix(step, "write"):
				failedWrites++
			case err == nil && strings.HasPrefix(step, "write"):
				okWrites++
			case err == nil && strings.HasPrefix(step, "primary"):
				okPromotions++
			}
			if err != nil {
				step += " → " + firstLine(err.Error())
			}
			log = append(log, step)
			if lost := rg.c.LostAckedWrites("r0"); len(lost) > 0 {
				fail("acknowledged write lost: %v", lost)
			}
			if bad, msgs := rg.c.Diverged("r0"); bad {
				fail("split brain: %v", msgs)
			}
			if two := rg.c.TwoWriters("r0"); len(two) > 0 {
				fail("two writers: %v", two)
			}
		}
	}
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
