package drbdsim

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// A slow link delays the acknowledgment of every write replicated over it by the
// link's delay, not the write itself: the peer has the data when the writer hears
// of it, and the rest of the cluster is not held up meanwhile. Heal makes it fast.
func TestSlowLinkDelaysAcknowledgments(t *testing.T) {
	rg := formed(t, nil)
	n1 := rg.c.Node("node1")
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	const delay = 300 * time.Millisecond
	rg.c.SetLinkDelay("node1", "node2", delay)

	data := bytes.Repeat([]byte{7}, 4096)
	done := make(chan time.Duration, 1)
	began := time.Now()
	go func() {
		err := n1.Write(context.Background(), "r0", 0, data)
		if err != nil {
			t.Error(err)
		}
		done <- time.Since(began)
	}()
	// While the writer waits for its acknowledgment, the cluster answers: node2
	// already holds the block.
	for {
		if bytes.Equal(rg.backing("node2", 0, len(data)), data) {
			break
		}
		if time.Since(began) > 10*time.Second {
			t.Fatal("node2 never received the write")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if took := <-done; took < delay {
		t.Fatalf("the write over a link delayed %s was acknowledged after %s", delay, took)
	}
	if lost := rg.c.LostAckedWrites("r0"); len(lost) > 0 {
		t.Fatal(lost)
	}

	rg.c.Heal()
	rg.c.mu.Lock()
	d := rg.c.replicationDelay(rg.c.nodes["node1"].res["r0"])
	rg.c.mu.Unlock()
	if d != 0 {
		t.Fatalf("after Heal the link still delays writes by %s", d)
	}
}
