package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// A Primary cut off from its peers holds its writes (on-no-quorum suspend-io)
// while the controller force-removes its member and deletes its replica. Its
// agent, learning of it — at once, or when it comes back after the removal —
// fails the held writes with EIO (on-no-quorum io-error on the running
// resource), even while the device is still held open (here a demotion
// refused as DRBD refuses it under a mount), and takes the resource down once
// it may (docs/controller.md, "--delete-lost-pods"). No acknowledged write is
// lost and the stale node's write reaches no survivor.
func TestStalePrimaryFailsHeldWrites(t *testing.T) {
	for _, tc := range []struct {
		name string
		away bool // the agent is stopped while its member is removed
	}{
		{"agent running", false},
		{"agent back after the removal", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The collector's clock never fires here: only a pass asked for by
			// the agent's start, or by a refused take-down, takes it down.
			r := newRig(t, 3, func(c *agent.Config) { c.GCInterval = time.Hour })
			names := r.form3D()
			stale := r.node(2)
			rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[2].Attached = true })
			r.confirmed(rev, "", names...)
			r.must(stale.Sim.Write(r.ctx, r.rv, 0, bytes.Repeat([]byte{1}, 4096)))

			if tc.away {
				// Stopped before the cut, so that it is away for all of what follows.
				// (Stopped after it, with the write held, its shutdown outlasted the
				// manager's 20 s grace three times on a loaded machine; not diagnosed,
				// and not what this test is about.)
				r.must(r.c.StopAgent(stale.Name))
			}
			r.c.Partition(stale.Name)
			t.Cleanup(r.c.Heal)
			ctx, cancel := context.WithCancel(r.ctx)
			defer cancel()
			staleData := bytes.Repeat([]byte{0xaa}, 4096)
			pending := make(chan error, 1)
			go func() { pending <- stale.Sim.Write(ctx, r.rv, 4096, staleData) }()
			select {
			case err := <-pending:
				t.Fatalf("the cut-off Primary's write returned %v, want it held (on-no-quorum suspend-io)", err)
			case <-time.After(300 * time.Millisecond):
			}
			// As if its device were mounted: DRBD refuses the demotion (-12).
			stale.Sim.InjectFault("secondary", drbdsim.Fault{Err: fmt.Errorf("%s: State change failed: (-12) Device is held open by someone: %w", r.rv, drbd.ErrDeviceInUse)})

			// The controller force-removes the member, then releases and deletes
			// the replica; a survivor is promoted and writes.
			rev = r.publish(func(st *v1.ReplicatedVolumeStatus) {
				st.Datamesh.Members = st.Datamesh.Members[:2]
				st.Datamesh.Members[0].Attached = true
			})
			r.confirmed(rev, "", names[:2]...)
			survivors := bytes.Repeat([]byte{2}, 4096)
			r.must(r.node(0).Sim.Write(r.ctx, r.rv, 4096, survivors))
			r.releaseAndDelete(names[2])
			if tc.away {
				r.must(r.c.RestartAgent(stale.Name))
			}

			select {
			case err := <-pending:
				if !errors.Is(err, syscall.EIO) {
					t.Fatalf("the stale Primary's held write returned %v, want EIO", err)
				}
			case <-time.After(30 * time.Second):
				st, _ := stale.Sim.Status(r.ctx, r.rv)
				t.Fatalf("the stale Primary's held write still pending 30 s after its member was removed: %+v", st)
			}
			if err := stale.Sim.Write(r.ctx, r.rv, 4096, staleData); !errors.Is(err, syscall.EIO) {
				t.Fatalf("a later write of the stale Primary returned %v, want EIO", err)
			}
			st, err := stale.Sim.Status(r.ctx, r.rv)
			r.must(err)
			if len(st) != 1 || st[0].Role != "Primary" {
				t.Fatalf("the stale resource with its demotion refused: %+v, want it still Primary", st)
			}

			// The device let go: the resource goes down, its data never reused.
			stale.Sim.ClearFault("secondary")
			r.eventually("the stale resource taken down", 30*time.Second, func() string {
				st, err := stale.Sim.Status(r.ctx, r.rv)
				if errors.Is(err, drbd.ErrUnknownResource) || err == nil && len(st) == 0 {
					return ""
				}
				return fmt.Sprintf("still runs: %+v (%v)", st, err)
			})
			got, err := r.node(0).Sim.Read(r.ctx, r.rv, 4096, 4096)
			r.must(err)
			if !bytes.Equal(got, survivors) {
				t.Fatalf("the survivors read %d at 4096, want their own write %d", got[0], survivors[0])
			}
			if lost := r.c.Sim.LostAckedWrites(r.rv); len(lost) > 0 {
				t.Fatalf("acknowledged writes lost: %v", lost)
			}
			if split, msgs := r.c.Sim.Diverged(r.rv); split {
				t.Fatalf("split brain among the members: %v", msgs)
			}
		})
	}
}
