package drbdsim

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// A Primary cut off by a partition, its writes suspended without quorum
// (on-no-quorum suspend-io), does not rejoin as a writer when the partition
// heals if the other side promoted and wrote meanwhile. Every connect of
// the stale Primary is refused: to the new Primary because it would become
// SyncTarget ("I shall become SyncTarget, but I am primary!"), to the
// diskless node because that would put two Primaries in one cluster
// (SS_TWO_PRIMARIES); both ends of each go StandAlone. The stale Primary
// never regains quorum, and its suspended write never completes: when it
// runs the refused connect to the new Primary itself (the lower node-id
// initiates, drbd_receiver.c), it learns that the peer has newer data, its
// disk goes Outdated and the suspended write fails with EIO
// (on-no-data-accessible io-error); otherwise the write stays suspended
// until on-no-quorum io-error is set on the running resource (drbdsetup
// resource-options), which fails it and every later request with EIO.
// Demoted and connected again (adjust on every node), it resyncs as a
// Secondary and holds the other side's data.
func TestStalePrimaryDoesNotRejoin(t *testing.T) {
	for _, tc := range []struct {
		stale, other string
		// outdated: the stale Primary initiates the connect to the other
		// diskful node (lower node-id), so it is outdated and its write
		// fails; otherwise its write stays suspended.
		outdated bool
	}{
		{stale: "node1", other: "node2", outdated: true},
		{stale: "node2", other: "node1", outdated: false},
	} {
		t.Run("stale "+tc.stale, func(t *testing.T) {
			rg := formed(t, func(_ string, o *drbd.OptionSet) { o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO) })
			stale, other := rg.c.Node(tc.stale), rg.c.Node(tc.other)
			rg.must(stale.Primary(rg.ctx, "r0", drbd.NoForce))
			rg.must(rg.write(tc.stale, 0, blockSize))

			rg.c.Partition(tc.stale)
			rg.wantQuorum(tc.stale, false)
			ctx, cancel := context.WithCancel(rg.ctx)
			defer cancel()
			staleData := pattern(0xaa, blockSize)
			pending := writeAsync(ctx, stale, blockSize, staleData)
			// The other diskful node keeps quorum with the diskless node3
			// (the tiebreaker), is promoted and writes.
			rg.wantQuorum(tc.other, true)
			rg.must(other.Primary(rg.ctx, "r0", drbd.NoForce))
			newer := pattern(0x55, blockSize)
			rg.must(other.Write(rg.ctx, "r0", 2*blockSize, newer))

			rg.healed()
			for _, end := range []struct{ node, peer string }{
				{tc.stale, tc.other}, {tc.other, tc.stale}, {tc.stale, "node3"}, {"node3", tc.stale},
			} {
				if cs := connState(rg.state(end.node), end.peer); cs != "StandAlone" {
					t.Fatalf("after the heal %s → %s: %q, want StandAlone (%s)", end.node, end.peer, cs, stale.QuorumView("r0"))
				}
			}
			rg.wantQuorum(tc.stale, false)
			rg.wantQuorum(tc.other, true)
			if w := rg.c.TwoWriters("r0"); len(w) > 0 {
				t.Fatalf("two writers: %v", w)
			}
			if tc.outdated {
				if d := rg.state(tc.stale).Devices[0].DiskState; d != "Outdated" {
					t.Fatalf("%s (stale Primary that learnt of newer data) is %s, want Outdated", tc.stale, d)
				}
				select {
				case o := <-pending:
					if !errors.Is(o.err, syscall.EIO) {
						t.Fatalf("the stale Primary's suspended write returned %v, want EIO", o.err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the outdated stale Primary's suspended write is still pending, want EIO")
				}
			} else {
				if d := rg.state(tc.stale).Devices[0].DiskState; d != "UpToDate" {
					t.Fatalf("%s (stale Primary, not the initiator) is %s, want UpToDate", tc.stale, d)
				}
				select {
				case o := <-pending:
					t.Fatalf("the stale Primary's suspended write returned (%v) after the heal", o.err)
				case <-time.After(50 * time.Millisecond):
				}
				// What the agent does to a stale Primary whose member was
				// removed (docs/controller.md, "--delete-lost-pods"): its
				// held write fails, as does any later request.
				rg.must(stale.FailIOWithoutQuorum(rg.ctx, "r0"))
				select {
				case o := <-pending:
					if !errors.Is(o.err, syscall.EIO) {
						t.Fatalf("the suspended write after on-no-quorum io-error returned %v, want EIO", o.err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the suspended write is still pending after on-no-quorum io-error")
				}
				if err := stale.Write(rg.ctx, "r0", blockSize, staleData); !errors.Is(err, syscall.EIO) {
					t.Fatalf("a write after on-no-quorum io-error returned %v, want EIO", err)
				}
				if _, err := stale.Read(rg.ctx, "r0", 0, blockSize); !errors.Is(err, syscall.EIO) {
					t.Fatalf("a read after on-no-quorum io-error returned %v, want EIO", err)
				}
				if st := rg.state(tc.stale); st.Suspended || st.SuspendedQuorum || st.Role != "Primary" {
					t.Fatalf("%s after on-no-quorum io-error: role %s, suspended %v (quorum %v), want a Primary not suspended", tc.stale, st.Role, st.Suspended, st.SuspendedQuorum)
				}
				shown, err := stale.Show(rg.ctx, "r0")
				rg.must(err)
				if got := shown[0].Options["on-no-quorum"]; got != string(drbd.OnNoQuorumIOError) {
					t.Fatalf("drbdsetup show after resource-options: on-no-quorum %v, want io-error", got)
				}
			}
			for _, n := range []string{"node1", "node2"} {
				if bytes.Equal(rg.backing(n, blockSize, blockSize), staleData) {
					t.Fatalf("%s's backing file holds the stale Primary's write", n)
				}
			}

			// The stale Primary is demoted and every node connected again.
			rg.must(stale.Secondary(rg.ctx, "r0"))
			for _, n := range []string{"node1", "node2", "node3"} {
				rg.must(rg.c.Node(n).Adjust(rg.ctx, "r0"))
			}
			rg.c.Advance(time.Minute)
			if d := rg.state(tc.stale).Devices[0].DiskState; d != "UpToDate" {
				t.Fatalf("%s after resyncing as a Secondary: %s", tc.stale, d)
			}
			if got := rg.backing(tc.stale, 2*blockSize, blockSize); !bytes.Equal(got, newer) {
				t.Fatalf("%s does not hold %s's write after its resync", tc.stale, tc.other)
			}
			rg.noLostWrites()
		})
	}
}

// connState is the state of st's connection to peer, "" without one.
func connState(st drbd.StatusResource, peer string) string {
	for _, k := range st.Connections {
		if k.Name == peer {
			return k.ConnectionState
		}
	}
	return ""
}
