package drbdsim

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// A slow link delays the acknowledgment of every write replicated over it by the
// link's delay, not the write itself: the peer has the data when the writer hears
// of it, and the rest of the cluster is not held up meanwhile. Heal makes it fast.
func TestSlowLinkDelaysAcknowledgments(t *testing.T) {
	rg, n1 := formedWithPrimary(t)
	const delay = 300 * time.Millisecond
	rg.c.SetLinkDelay("node1", "node2", delay)

	data := bytes.Repeat([]byte{7}, 4096)
	began := time.Now()
	done := writeAsync(context.Background(), n1, 0, data)
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
	w := <-done
	rg.must(w.err)
	if w.took < delay {
		t.Fatalf("the write over a link delayed %s was acknowledged after %s", delay, w.took)
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
