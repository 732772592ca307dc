package drbdsim

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// suspend-io holds a Primary's writes, with quorum, until resume-io; the
// kernel's status and events2 say suspended:user meanwhile, and the write
// that waited lands on both diskful replicas once resumed.
func TestSuspendIOHoldsWritesUntilResume(t *testing.T) {
	rg, n1 := formedWithPrimary(t)
	rg.must(n1.SuspendIO(rg.ctx, "r0"))
	rg.must(n1.SuspendIO(rg.ctx, "r0")) // twice is a success, as in DRBD
	st := rg.state("node1")
	if !st.SuspendedUser || !st.Suspended || st.SuspendedQuorum {
		t.Fatalf("after suspend-io: suspended %v user %v quorum %v, want user only", st.Suspended, st.SuspendedUser, st.SuspendedQuorum)
	}
	data := bytes.Repeat([]byte{0xab}, blockSize)
	done := writeAsync(rg.ctx, n1, 0, data)
	select {
	case w := <-done:
		t.Fatalf("a write went through suspend-io: %v", w.err)
	case <-time.After(50 * time.Millisecond):
	}
	for _, n := range []string{"node1", "node2"} {
		got := make([]byte, blockSize)
		f, err := os.Open(filepath.Join(rg.dir, n+".img"))
		rg.must(err)
		_, err = f.ReadAt(got, 0)
		f.Close()
		rg.must(err)
		if bytes.Equal(got, data) {
			t.Fatalf("%s's backing file holds the suspended write", n)
		}
	}
	rg.must(n1.ResumeIO(rg.ctx, "r0"))
	if w := <-done; w.err != nil {
		t.Fatalf("write after resume-io: %v", w.err)
	}
	if st := rg.state("node1"); st.Suspended || st.SuspendedUser {
		t.Fatalf("after resume-io: suspended %v user %v", st.Suspended, st.SuspendedUser)
	}
	rg.must(n1.ResumeIO(rg.ctx, "r0")) // nothing suspended: a success
	rg.noLostWrites()
}

// suspend-io on a resource that is not up fails as DRBD does.
func TestSuspendIOUnknownResource(t *testing.T) {
	rg := newRig(t, nil)
	if err := rg.c.Node("node1").SuspendIO(rg.ctx, "r0"); !errors.Is(err, drbd.ErrUnknownResource) {
		t.Fatalf("suspend-io of a resource that is not up: %v, want ErrUnknownResource", err)
	}
}
