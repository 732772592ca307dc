package drbdsim

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// formed brings r0 up on all three nodes and skips the initial sync, as
// meshvol does at formation: node1 and node2 UpToDate, node3 diskless.
func formed(t testing.TB, mutate func(node string, o *drbd.OptionSet)) *rig {
	t.Helper()
	rg := newRig(t, mutate)
	rg.upAll()
	rg.must(rg.c.Node("node1").NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
	for _, n := range []string{"node1", "node2"} {
		if d := rg.state(n).Devices[0].DiskState; d != "UpToDate" {
			t.Fatalf("%s after new-current-uuid --clear-bitmap: %s", n, d)
		}
	}
	return rg
}

// formedWithPrimary is formed with node1 Primary.
func formedWithPrimary(t testing.TB) (*rig, *Node) {
	t.Helper()
	rg := formed(t, nil)
	n1 := rg.c.Node("node1")
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	return rg, n1
}

// writeAsync writes data at off of r0 through n in the background: the channel gets
// the write's outcome once it returns, and how long it took.
func writeAsync(ctx context.Context, n *Node, off int64, data []byte) <-chan writeOutcome {
	done := make(chan writeOutcome, 1)
	began := time.Now()
	go func() {
		err := n.Write(ctx, "r0", off, data)
		done <- writeOutcome{err, time.Since(began)}
	}()
	return done
}

type writeOutcome struct {
	err  error
	took time.Duration
}

func (rg *rig) state(node string) drbd.StatusResource {
	rg.t.Helper()
	st, err := rg.c.Node(node).Status(rg.ctx, "r0")
	rg.must(err)
	if len(st) != 1 {
		rg.t.Fatalf("%s: %d resources", node, len(st))
	}
	return st[0]
}

func (rg *rig) quorum(node string) bool { return rg.state(node).Devices[0].Quorum }

// wantDisk fails unless node's disk is want; when says at what point, for the message.
func (rg *rig) wantDisk(node, want, when string) {
	rg.t.Helper()
	if d := rg.state(node).Devices[0].DiskState; d != want {
		rg.t.Fatalf("%s %s: disk %s, want %s (%+v)", node, when, d, want, rg.state(node))
	}
}

func (rg *rig) wantQuorum(node string, want bool) {
	rg.t.Helper()
	if got := rg.quorum(node); got != want {
		rg.t.Fatalf("%s quorum:%v, want %v (%+v)", node, got, want, rg.state(node).Devices[0])
	}
}

func (rg *rig) write(node string, off int64, n int) error {
	return rg.c.Node(node).Write(rg.ctx, "r0", off, pattern(byte(off), n))
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*13)
	}
	return b
}

func (rg *rig) noLostWrites() {
	rg.t.Helper()
	if lost := rg.c.LostAckedWrites("r0"); len(lost) > 0 {
		rg.t.Fatalf("acknowledged writes lost: %v", lost)
	}
}

func qmr2(_ string, o *drbd.OptionSet) {
	o.Resource.QuorumMinimumRedundancy = drbd.Ptr(drbd.QuorumCount(2))
}

// Row 1: 2D + diskless, cut node1–node2 only: both diskful nodes stay
// quorate (tiebreaker); the promotion agreement travels through node3 and
// outdates node2, which then may not promote.
func TestRow1TiebreakerBothQuorateAgreementOutdatesFarSide(t *testing.T) {
	rg := formed(t, nil)
	rg.c.Cut("node1", "node2")
	rg.wantQuorum("node1", true)
	rg.wantQuorum("node2", true)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.wantDisk("node2", "Outdated", "after node1's promotion")
	err := rg.c.Node("node2").Primary(rg.ctx, "r0", drbd.NoForce)
	if !errors.Is(err, drbd.ErrNoUpToDateData) || !strings.Contains(err.Error(), "Need access to UpToDate data") {
		t.Fatalf("node2 promotion: %v, want -2 Need access to UpToDate data", err)
	}
	rg.must(rg.write("node1", 0, 8192))
	rg.noLostWrites()
}

// Row 2: then isolate node2; later reconnect it to node3 only: node2 has
// no quorum and does not regain it (the tiebreaker keeps, never gains).
func TestRow2TiebreakerNeverGains(t *testing.T) {
	rg := formed(t, nil)
	rg.c.Cut("node1", "node2")
	rg.c.Cut("node2", "node3")
	rg.wantQuorum("node2", false)
	rg.wantQuorum("node1", true)
	rg.c.Connect("node2", "node3")
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	rg.wantQuorum("node2", false)
	err := rg.c.Node("node2").Primary(rg.ctx, "r0", drbd.NoForce)
	if !errors.Is(err, drbd.ErrNoQuorum) || !strings.Contains(err.Error(), "1 of 2 nodes visible, need 2 for quorum") {
		t.Fatalf("node2 promotion: %v", err)
	}
	rg.c.Heal()
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	rg.wantQuorum("node2", true)
}

// Row 4: qmr 2, node1 Primary, isolate node2: node1 keeps quorum via the
// tiebreaker (qmr not applied there) and writes.
func TestRow4PrimaryKeepsQuorumWithQmr(t *testing.T) {
	rg := formed(t, qmr2)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Cut("node1", "node2")
	rg.c.Cut("node2", "node3")
	rg.wantQuorum("node1", true)
	rg.must(rg.write("node1", 4096, 4096))
	rg.wantQuorum("node2", false)
	rg.noLostWrites()
	// node2 still calls itself UpToDate: only quorum keeps it from serving.
	if stale := rg.c.StaleUpToDate("r0"); len(stale) != 1 || !strings.HasPrefix(stale[0], "node2:") {
		t.Fatalf("StaleUpToDate = %v, want node2", stale)
	}
}

// Row 5: qmr 2, node2 down gracefully; node1 may not promote (1 of 1
// UpToDate, need 2) but the diskless node3 becomes Primary through node1's
// (stale) quorate report and writes with one UpToDate copy.
func TestRow5QmrNotAppliedOnQuoratePeerPath(t *testing.T) {
	rg := formed(t, qmr2)
	rg.must(rg.c.Node("node2").Down(rg.ctx, "r0"))
	err := rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce)
	if !errors.Is(err, drbd.ErrNoQuorum) || !strings.Contains(err.Error(), "1 of 1 nodes up_to_date, need 2 for quorum-minimum-redundancy") {
		t.Fatalf("node1 promotion: %v", err)
	}
	rg.wantQuorum("node1", true) // displayed, stale: a graceful departure is not node1's own state change
	rg.must(rg.c.Node("node3").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node3", 0, 65536))
	rg.noLostWrites()
}

// Row 6: a diskless node with quorum 32 is quorate exactly when connected
// to an UpToDate peer that reports quorum.
func TestRow6DisklessQuorum32(t *testing.T) {
	rg := formed(t, func(node string, o *drbd.OptionSet) {
		if node == "node3" {
			o.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(32))
		}
	})
	rg.wantQuorum("node3", true)
	rg.c.Partition("node3")
	rg.wantQuorum("node3", false)
	rg.c.Heal()
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	rg.wantQuorum("node3", true)
}

// Row 7: a diskful node with quorum 32 is never quorate while attached,
// and quorate through a peer once detached.
func TestRow7DiskfulQuorum32(t *testing.T) {
	rg := formed(t, func(node string, o *drbd.OptionSet) {
		if node == "node1" {
			o.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(32))
		}
	})
	rg.wantQuorum("node1", false)
	err := rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce)
	if !errors.Is(err, drbd.ErrNoQuorum) || !strings.Contains(err.Error(), "need 32 for quorum") {
		t.Fatalf("node1 promotion: %v", err)
	}
	cfg := r0(rg.dir, "node1", func(_ string, o *drbd.OptionSet) {
		o.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(32))
	})
	cfg.Disk = nil
	cfg.Peers = cfg.Peers[:1] // a diskless node connects only to diskful ones (drbd.Validate)
	rg.must(rg.c.Node("node1").WriteConfig(rg.ctx, cfg))
	rg.must(rg.c.Node("node1").Adjust(rg.ctx, "r0"))
	if d := rg.state("node1").Devices[0].DiskState; d != "Diskless" {
		t.Fatalf("node1 after detach: %s", d)
	}
	rg.wantQuorum("node1", true)
}

// Row 8: a non-UpToDate disk counts toward quorum, not toward minimum
// redundancy.
func TestRow8InconsistentCountsForQuorumNotRedundancy(t *testing.T) {
	rg := newRig(t, func(node string, o *drbd.OptionSet) {
		if node == "node1" {
			o.Resource.QuorumMinimumRedundancy = drbd.Ptr(drbd.QuorumCount(1))
		}
	})
	rg.upAll()
	rg.wantQuorum("node2", true)
	rg.wantQuorum("node1", false)
}

// Row 9: node2 left gracefully (Outdated), then node1 isolated: node1
// alone keeps quorum and writes (last man standing).
func TestRow9LastManStanding(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node2").Down(rg.ctx, "r0"))
	rg.c.Partition("node1")
	rg.wantQuorum("node1", true)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node1", 0, 4096))
	// node2 comes back: it was Outdated, it resyncs what changed.
	rg.c.Heal()
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	rg.must(rg.c.Node("node2").Up(rg.ctx, "r0"))
	rg.c.Advance(time.Second)
	if d := rg.state("node2").Devices[0].DiskState; d != "UpToDate" {
		t.Fatalf("node2 after return: %s", d)
	}
	rg.noLostWrites()
}

// Row 10: suspend-io: the isolated Primary's write blocks, and completes
// by itself once the partition heals.
func TestRow10SuspendIOResumes(t *testing.T) {
	rg := formed(t, func(_ string, o *drbd.OptionSet) {
		o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO)
	})
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Partition("node1")
	rg.wantQuorum("node1", false)
	done := make(chan error, 1)
	go func() { done <- rg.write("node1", 0, 4096) }()
	waitFor(t, func() bool { return rg.state("node1").SuspendedQuorum })
	select {
	case err := <-done:
		t.Fatalf("write returned while suspended: %v", err)
	default:
	}
	rg.c.Heal()
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	if err := <-done; err != nil {
		t.Fatalf("suspended write after heal: %v", err)
	}
	if rg.state("node1").Suspended {
		t.Fatal("still suspended after quorum returned")
	}
	rg.noLostWrites()
}

// A suspended write gives up when its context ends.
func TestSuspendedWriteHonoursContext(t *testing.T) {
	rg := formed(t, func(_ string, o *drbd.OptionSet) {
		o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO)
	})
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Partition("node1")
	ctx, cancel := context.WithCancel(rg.ctx)
	done := make(chan error, 1)
	go func() { done <- rg.c.Node("node1").Write(ctx, "r0", 0, make([]byte, 512)) }()
	waitFor(t, func() bool { return rg.state("node1").SuspendedQuorum })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
}

// waitFor polls for a state another goroutine reaches (a blocked writer):
// the only place these tests wait on the scheduler rather than the sim.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("condition not reached")
}

// io-error: an isolated Primary's write fails with EIO and nothing is
// acknowledged.
func TestNoQuorumWriteEIO(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Partition("node1")
	if err := rg.write("node1", 0, 4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("got %v, want EIO", err)
	}
}

// A diskless Primary that loses every diskful peer fails IO with EIO
// (on-no-data-accessible io-error), even with quorum off.
func TestDisklessPrimaryWithoutDataEIO(t *testing.T) {
	rg := formed(t, func(_ string, o *drbd.OptionSet) { o.Resource.Quorum = drbd.Ptr(drbd.QuorumOff) })
	rg.must(rg.c.Node("node3").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Partition("node3")
	if err := rg.write("node3", 0, 4096); !errors.Is(err, syscall.EIO) {
		t.Fatalf("got %v, want EIO", err)
	}
}

// Two primaries are refused unless allowed.
func TestTwoPrimariesRefused(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	err := rg.c.Node("node2").Primary(rg.ctx, "r0", drbd.NoForce)
	if !errors.Is(err, drbd.ErrTwoPrimaries) {
		t.Fatalf("got %v, want ErrTwoPrimaries", err)
	}
}

// With quorum off both sides of a partition write; on reconnect DRBD
// detects the split brain and drops the connection (StandAlone).
func TestSplitBrainDetected(t *testing.T) {
	rg := formed(t, func(_ string, o *drbd.OptionSet) { o.Resource.Quorum = drbd.Ptr(drbd.QuorumOff) })
	rg.c.Partition("node1")
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node1", 0, 4096))
	rg.must(rg.c.Node("node2").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node2", 8192, 4096))
	rg.c.Heal()
	rg.c.Advance(10 * time.Second) // connect-int: the link is used at the next attempt
	bad, msgs := rg.c.Diverged("r0")
	if !bad {
		t.Fatal("split brain not detected")
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "Split-Brain detected but unresolved, dropping connection!") {
		t.Fatalf("messages: %v", msgs)
	}
	if cs := rg.state("node1").Connections[0].ConnectionState; cs != "StandAlone" {
		t.Fatalf("node1 → node2: %s, want StandAlone", cs)
	}
}

// A crashed Primary's peers continue (tiebreaker keeps quorum), the
// survivor is promoted and writes; the old Primary comes back, resyncs
// only what changed, and no acknowledged write is lost.
func TestCrashFailoverAndReturn(t *testing.T) {
	rg, n1 := formedWithPrimary(t)
	rg.must(rg.write("node1", 0, 1<<20))
	n1.Crash()
	if err := n1.Up(rg.ctx, "r0"); err == nil {
		t.Fatal("command on a crashed node succeeded")
	}
	if cs := rg.state("node2").Connections[0].ConnectionState; cs != "Connecting" {
		t.Fatalf("node2 → node1 after crash: %s", cs)
	}
	rg.wantQuorum("node2", true)
	rg.must(rg.c.Node("node2").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node2", 1<<20, 1<<20))
	n1.Restart()
	rg.must(n1.Up(rg.ctx, "r0"))
	st := rg.state("node1")
	if st.Connections[0].PeerDevices[0].ReplicationState != "WFBitMapT" {
		t.Fatalf("node1 after restart: %v", st.Connections[0].PeerDevices[0])
	}
	rg.wantDisk("node1", "Outdated", "in the bitmap exchange (sanitize_state caps a sync target's disk)")
	if oos := st.Connections[0].PeerDevices[0].OutOfSync; oos != 1024 {
		t.Fatalf("node1 out of sync %d KiB, want 1024 (only what node2 wrote)", oos)
	}
	rg.c.Advance(time.Second)
	if d := rg.state("node1").Devices[0].DiskState; d != "UpToDate" {
		t.Fatalf("node1 after resync: %s", d)
	}
	rg.noLostWrites()
}

// A failed disk detaches; the Primary continues through its peer.
func TestDiskFailureDetaches(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.c.Node("node1").FailDisk("r0"))
	if d := rg.state("node1").Devices[0].DiskState; d != "Diskless" {
		t.Fatalf("node1 disk after failure: %s", d)
	}
	if pd := rg.state("node2").Connections[0].PeerDevices[0].PeerDiskState; pd != "Diskless" {
		t.Fatalf("node2 sees node1's disk as %s", pd)
	}
	rg.must(rg.write("node1", 0, 4096))
	rg.noLostWrites()
}

// A disk that detaches during its resync ends the resync on both ends: DRBD's
// sanitize_state goes back to Established when a disk of a syncing pair fails or
// detaches (drbd_state.c). A failed disk attached again by an adjust resyncs as
// SyncTarget; detached again before the resync ends, it must not leave the pair in
// SyncTarget/SyncSource with no disk to sync to (the soak saw a diskless Primary stay
// "SyncTarget" for good after its failed disk's member was retyped to Access).
func TestDetachEndsTheResync(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.c.Node("node2").FailDisk("r0"))
	rg.must(rg.write("node1", 0, 4096))
	rg.must(rg.c.Node("node2").Adjust(rg.ctx, "r0")) // the configuration still names the disk: attached again
	syncing := func() []string {
		var out []string
		for _, n := range []string{"node1", "node2", "node3"} {
			for _, c := range rg.state(n).Connections {
				for _, pd := range c.PeerDevices {
					if pd.ReplicationState != "Established" && pd.ReplicationState != "Off" {
						out = append(out, n+"→"+c.Name+": "+pd.ReplicationState)
					}
				}
			}
		}
		return out
	}
	if s := syncing(); len(s) == 0 {
		t.Fatalf("node2's disk attached again without a resync: %s", rg.state("node2").Devices[0].DiskState)
	}
	rg.must(rg.c.Node("node2").FailDisk("r0"))
	if s := syncing(); len(s) != 0 {
		t.Fatalf("node2's disk detached during its resync, yet %v", s)
	}
	rg.c.Advance(10 * time.Second)
	if s := syncing(); len(s) != 0 {
		t.Fatalf("10 s after node2's disk detached during its resync: %v", s)
	}
	rg.must(rg.write("node1", 4096, 4096))
	rg.noLostWrites()
}

// Connections come up only when both ends agree on authentication. With
// different secrets both ends go StandAlone and do not retry (DRBD:
// "Authentication of peer failed"); adjust with the same secret on both
// connects them.
func TestSharedSecretMismatch(t *testing.T) {
	secret := map[string]string{"node1": "s3cret-b", "node2": "s3cret-a", "node3": "s3cret-b"}
	tune := func(node string, o *drbd.OptionSet) {
		o.Net.CramHMACAlg = drbd.Ptr("sha256")
		o.Net.SharedSecret = drbd.Ptr(secret[node])
	}
	rg := newRig(t, tune)
	rg.upAll()
	rg.c.Advance(30 * time.Second) // three connect-ints: no retry
	if cs := rg.state("node1").Connections[0].ConnectionState; cs != "StandAlone" {
		t.Fatalf("node1 → node2 with different secrets: %s", cs)
	}
	if cs := rg.state("node2").Connections[0].ConnectionState; cs != "StandAlone" {
		t.Fatalf("node2 → node1 with different secrets: %s", cs)
	}
	if cs := rg.state("node1").Connections[1].ConnectionState; cs != "Connected" {
		t.Fatalf("node1 → node3 with the same secret: %s", cs)
	}
	secret["node2"] = "s3cret-b"
	rg.must(rg.c.Node("node2").WriteConfig(rg.ctx, r0(rg.dir, "node2", tune)))
	rg.must(rg.c.Node("node2").Adjust(rg.ctx, "r0"))
	if cs := rg.state("node1").Connections[0].ConnectionState; cs != "StandAlone" {
		t.Fatalf("node1 → node2 after adjust on node2 only: %s (node1 does not retry)", cs)
	}
	rg.must(rg.c.Node("node1").Adjust(rg.ctx, "r0"))
	for _, n := range []string{"node1", "node2"} {
		if cs := rg.state(n).Connections[0].ConnectionState; cs != "Connected" {
			t.Fatalf("%s after adjust on both: %s", n, cs)
		}
	}
}

// A hung command returns drbd.ErrTimeout at its deadline; a failing one
// ErrCommandFailed; nothing is applied.
func TestCommandFaults(t *testing.T) {
	rg := formed(t, nil)
	n1 := rg.c.Node("node1")
	n1.InjectFault("primary", Fault{Hang: true})
	ctx, cancel := context.WithTimeout(rg.ctx, 20*time.Millisecond)
	defer cancel()
	if err := n1.Primary(ctx, "r0", drbd.NoForce); !errors.Is(err, drbd.ErrTimeout) {
		t.Fatalf("hung primary: %v", err)
	}
	n1.InjectFault("primary", Fault{Err: errors.New("injected")})
	if err := n1.Primary(rg.ctx, "r0", drbd.NoForce); !errors.Is(err, drbd.ErrCommandFailed) {
		t.Fatalf("failing primary: %v", err)
	}
	n1.ClearFault("primary")
	if r := rg.state("node1").Role; r != "Secondary" {
		t.Fatalf("a failed command changed the role: %s", r)
	}
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
}

// A slower resync takes proportionally longer in virtual time.
func TestResyncRate(t *testing.T) {
	rg := newRig(t, nil)
	rg.c.SetResyncRate(16 << 20) // 16 MiB/s: 128 MiB take 8 s
	rg.upAll()
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", "test"))
	rg.c.Advance(4 * time.Second)
	st := rg.state("node2")
	pd := st.Connections[0].PeerDevices[0]
	if pd.ReplicationState != "SyncTarget" || pd.PercentInSync < 40 || pd.PercentInSync > 60 {
		t.Fatalf("after 4 s at 16 MiB/s: %s %.2f%%", pd.ReplicationState, pd.PercentInSync)
	}
	if !pd.HasSyncDetails || pd.RSTotal != 262056 {
		t.Fatalf("sync details: has=%v rs-total=%d", pd.HasSyncDetails, pd.RSTotal)
	}
	rg.c.Advance(5 * time.Second)
	if d := rg.state("node2").Devices[0].DiskState; d != "UpToDate" {
		t.Fatalf("after 9 s: %s", d)
	}
}

// Non-voting (a non-upstream option, modelled for drbdsim only): a
// non-voting diskful replica is not counted by its peers, so node1 with a
// non-voting node2 is a single voter and keeps quorum alone.
func TestNonVotingPeerNotCounted(t *testing.T) {
	rg := formed(t, func(node string, o *drbd.OptionSet) {
		if node == "node2" {
			o.Disk.NonVoting = drbd.Ptr(true)
		}
	})
	rg.c.Partition("node1")
	rg.wantQuorum("node1", true)
	rg.wantQuorum("node2", false)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
}

// A connected peer counts by the disk it reports, not by what the local configuration
// calls it (the kernel's __calc_quorum_with_disk counts a peer as a diskless vote only
// when it reports Diskless *and* the local peer device has `bitmap no`): node1 still
// runs a configuration that names node2 diskless — as a survivor does while it has not
// applied the step in which a diskless joiner attached its disk — and counts node2,
// connected and UpToDate, as an UpToDate voter: 2 of 2 under quorum 2, so it keeps
// quorum with node3 cut away and may promote.
func TestConnectedPeerCountsByItsReportedDisk(t *testing.T) {
	q2 := func(_ string, o *drbd.OptionSet) { o.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(2)) }
	rg := formed(t, q2)
	cfg := r0(rg.dir, "node1", q2)
	for i := range cfg.Peers {
		if cfg.Peers[i].Name == "node2" {
			cfg.Peers[i].Diskless = true
		}
	}
	node1 := rg.c.Node("node1")
	rg.must(node1.WriteConfig(rg.ctx, cfg))
	rg.must(node1.Adjust(rg.ctx, "r0"))
	rg.c.Partition("node3")
	if pd := rg.state("node1").Connections; len(pd) == 0 {
		t.Fatal("node1 has no connections")
	}
	rg.wantQuorum("node1", true)
	rg.must(node1.Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node1", 0, 4096))
	rg.noLostWrites()
}

// explicitQuorum2 is what meshvol renders for 2D+1TB (docs/layouts.md): an
// explicit `quorum 2` and qmr 1 instead of the captures' majority.
func explicitQuorum2(_ string, o *drbd.OptionSet) {
	o.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(2))
	o.Resource.QuorumMinimumRedundancy = drbd.Ptr(drbd.QuorumCount(1))
}

// Row 11: under an explicit `quorum 2`, the survivors of a lost Primary
// lose their quorum: the tiebreaker keeps it at the loss, then the
// survivors' lost-peer agreement drops the Primary from their members set,
// the Diskful survivor is one voter of an odd electorate under q=2 and the
// TieBreaker loses its quorate peer. DRBD 9.2.18 did exactly this on the
// product tier's guests (test/vm/FINDINGS.md, "The product on real DRBD",
// 3: the TieBreaker's `quorum( yes -> no ) [disconnected]` a second after
// the Primary's `PingAck did not arrive in time`, the Diskful survivor
// `quorum:false suspended`, a promotion refused with "1 of 2 nodes
// visible, need 2 for quorum"). Under the captures' majority the same
// survivors keep quorum (TestCrashFailoverAndReturn).
func TestRow11LostPrimarysSurvivorsLoseExplicitQuorum(t *testing.T) {
	for _, how := range []string{"crash", "partition"} {
		t.Run(how, func(t *testing.T) {
			rg := formed(t, explicitQuorum2)
			n1 := rg.c.Node("node1")
			rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
			rg.must(rg.write("node1", 0, 8192))
			if how == "crash" {
				n1.Crash()
			} else {
				rg.c.Cut("node1", "node2")
				rg.c.Cut("node1", "node3")
				rg.wantQuorum("node1", false)
			}
			rg.wantQuorum("node2", false)
			rg.wantQuorum("node3", false)
			err := rg.c.Node("node2").Primary(rg.ctx, "r0", drbd.NoForce)
			if !errors.Is(err, drbd.ErrNoQuorum) || !strings.Contains(err.Error(), "1 of 2 nodes visible, need 2 for quorum") {
				t.Fatalf("node2 promotion after the Primary's loss: %v, want -25 \"1 of 2 nodes visible, need 2 for quorum\"", err)
			}
			rg.noLostWrites()
		})
	}
}

// Row 11, the other side: a Primary refuses the soft state change that
// would take its quorum (drbd_state.c, SS_NO_QUORUM), the lost-peer
// agreement included, so under the same `quorum 2` the Primary whose
// Diskful peer crashes keeps its quorum through the tiebreaker and writes;
// so does the TieBreaker through it.
func TestRow11PrimaryKeepsExplicitQuorumWhenItsPeerGoes(t *testing.T) {
	rg := formed(t, explicitQuorum2)
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
	rg.c.Node("node2").Crash()
	rg.c.Advance(10 * time.Second)
	rg.wantQuorum("node1", true)
	rg.wantQuorum("node3", true)
	rg.must(rg.write("node1", 0, 8192))
	rg.noLostWrites()
}

// An Outdated replica that connects to a diskless Primary is resynced from an
// UpToDate peer it is already connected to (DRBD 9.2.18, drbd_state.c: "Got
// connected to a diskless primary" sets TRY_TO_GET_RESYNC, and
// drbd_try_to_get_resynced, drbd_receiver.c, starts a resync from the best
// UpToDate peer, or goes UpToDate when nothing differs). node1, cut from node3
// only, is outdated by node3's promotion (the agreement travels through node2);
// node3 writes through node2; once node1 reaches node3 again it is resynced
// from node2 over the connection that never dropped. Soak seed 27 ended with
// such a replica Outdated for good.
func TestOutdatedResyncedOnConnectToDisklessPrimary(t *testing.T) {
	rg := formed(t, nil)
	rg.c.Cut("node1", "node3")
	n3 := rg.c.Node("node3")
	rg.must(n3.Primary(rg.ctx, "r0", drbd.NoForce))
	rg.wantDisk("node1", "Outdated", "after node3's promotion")
	rg.must(n3.Write(rg.ctx, "r0", 0, pattern(7, 8192)))
	rg.c.Connect("node1", "node3")
	rg.c.Advance(30 * time.Second) // connect-int, the bitmap exchange and the resync
	rg.wantDisk("node1", "UpToDate", "connected to the diskless Primary and to UpToDate node2")
	// node1, UpToDate and quorate, holds node3's acknowledged write.
	rg.noLostWrites()
}

// A crashed replica's disk comes back UpToDate when it attaches, as on DRBD 9.2.18
// without a fencing policy (drbd_state.c, disk_state_from_md: may_be_up_to_date skips
// every peer without MDF_PEER_FENCING, and meshvol renders no fencing policy;
// test/vm/FINDINGS.md 7), and it stops counting as current the moment a handshake
// finds a newer peer: from the bitmap exchange on a sync target is at most Outdated
// (sanitize_state, L_WF_BITMAP_T). So a lone copy that restarts can be promoted, and
// an UpToDate replica never serves without an acknowledged write.
func TestReturningDiskComesBackUpToDate(t *testing.T) {
	rg, _ := formedWithPrimary(t)
	rg.must(rg.write("node1", 0, 8192))
	n2 := rg.c.Node("node2")
	n2.Crash()
	rg.c.Cut("node2", "node1")
	rg.c.Cut("node2", "node3")
	n2.Restart()
	rg.must(n2.Up(rg.ctx, "r0"))
	rg.wantDisk("node2", "UpToDate", "after its restart, alone")
	rg.noLostWrites()

	// node1 writes on without it (the tiebreaker keeps its quorum): node2 is now a
	// stale UpToDate disk without quorum, which nothing may read from.
	rg.must(rg.write("node1", 1<<20, 8192))
	rg.wantQuorum("node2", false)
	if stale := rg.c.StaleUpToDate("r0"); len(stale) != 1 || !strings.HasPrefix(stale[0], "node2:") {
		t.Fatalf("stale UpToDate replicas: %v, want node2's only", stale)
	}
	rg.noLostWrites()

	rg.c.Connect("node2", "node1")
	rg.c.Connect("node2", "node3")
	// The next connect attempt (connect-int) finds node1 newer: node2 is its sync
	// target, Outdated from the bitmap exchange on.
	inExchange := false
	for range 200 {
		rg.c.Advance(100 * time.Millisecond)
		st := rg.state("node2")
		for _, c := range st.Connections {
			for _, pd := range c.PeerDevices {
				if pd.ReplicationState == "WFBitMapT" {
					inExchange = true
					if d := st.Devices[0].DiskState; d != "Outdated" {
						t.Fatalf("node2 in the bitmap exchange: disk %s, want Outdated", d)
					}
				}
			}
		}
		rg.noLostWrites()
		if inExchange && st.Devices[0].DiskState == "UpToDate" {
			break
		}
	}
	if !inExchange {
		t.Fatalf("node2 never became node1's sync target: %+v", rg.state("node2"))
	}
	rg.wantDisk("node2", "UpToDate", "after its resync")
	if stale := rg.c.StaleUpToDate("r0"); len(stale) != 0 {
		t.Fatalf("stale UpToDate replicas after the resync: %v", stale)
	}
	rg.noLostWrites()
}
