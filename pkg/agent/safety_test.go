package agent_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// The agent's two ways to lose data silently, checked by their meaning — what the
// simulated kernels end up holding, read from drbdsim, against every write it
// acknowledged — rather than by the calls the agent makes today:
//
//   - declaring a replica UpToDate that does not hold the data: DRBD's `primary
//     --force` on a replica without UpToDate data in reach, or `new-current-uuid
//     --clear-bitmap` on a replica that is not brand new and empty. Either way
//     drbdsim.StaleUpToDate names a replica that shows UpToDate but lacks an
//     acknowledged write;
//   - promoting without quorum (a forced promotion skips it): a Primary on the
//     losing side of a partition can write while the other side does.

// watchNoneStale polls for d that no replica of the volume shows UpToDate without
// every acknowledged write, that the named replica's node never becomes Primary and,
// when inconsistent is set, that its disk never becomes UpToDate.
func (r *rig) watchNoneStale(d time.Duration, node int, inconsistent bool) {
	r.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if stale := r.c.Sim.StaleUpToDate(r.rv); len(stale) > 0 {
			r.t.Fatalf("a replica shows UpToDate without the acknowledged writes: %v", stale)
		}
		st, err := r.node(node).Sim.Status(r.ctx, r.rv)
		if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
			continue
		}
		if st[0].Role == "Primary" {
			r.t.Fatalf("%s became Primary (disk %s, quorum %v)", r.node(node).Name, st[0].Devices[0].DiskState, st[0].Devices[0].Quorum)
		}
		if inconsistent && st[0].Devices[0].DiskState == "UpToDate" {
			r.t.Fatalf("%s's half-synced disk became UpToDate", r.node(node).Name)
		}
	}
}

// writeSpread writes n 4 KiB blocks through node i, 64 KiB apart, so that a resync in
// progress has copied the first few and not the rest.
func (r *rig) writeSpread(i, n int) {
	r.t.Helper()
	for b := range n {
		r.must(r.node(i).Sim.Write(r.ctx, r.rv, int64(b)*64<<10, bytes.Repeat([]byte{byte(b + 1)}, 4096)))
	}
}

// joinSyncing adds a Diskful replica on node i to the datamesh (not a formation: it
// must resync) and waits until it is a SyncTarget, Inconsistent; the resync is slowed
// so that it stays half done for the rest of the test.
func (r *rig) joinSyncing(i int, id int32) string {
	r.t.Helper()
	r.c.Sim.SetResyncRate(16 << 10)
	name := r.addReplica(i, v1.ReplicaTypeDiskful)
	m := r.member(name, v1.MemberTypeDiskful, id)
	r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members = append(st.Datamesh.Members, m)
	})
	r.eventually(name+" syncing", 60*time.Second, func() string {
		st, err := r.node(i).Sim.Status(r.ctx, r.rv)
		if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
			return fmt.Sprint(err)
		}
		for _, c := range st[0].Connections {
			if len(c.PeerDevices) == 1 && c.PeerDevices[0].ReplicationState == "SyncTarget" && st[0].Devices[0].DiskState == "Inconsistent" {
				return ""
			}
		}
		return fmt.Sprintf("disk %s, %+v", st[0].Devices[0].DiskState, st[0].Connections)
	})
	return name
}

// A member the datamesh marks attached is promoted only the way DRBD allows without
// force: not on the minority side of a partition (no quorum), not on a half-synced
// replica cut off from every UpToDate peer (no data). The agent retries and reports
// the refusal; it never forces, whatever the datamesh says.
func TestNeverPromotesWithForce(t *testing.T) {
	r := newRig(t, 4, nil)
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", names[0])
	r.writeSpread(0, 256)
	joining := r.joinSyncing(3, 3)

	// node-3 (half synced) and node-2 (UpToDate) are each cut off from everyone.
	r.c.Sim.Partition(r.node(2).Name)
	r.c.Sim.Partition(r.node(3).Name)
	r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Multiattach = true
		for i := range st.Datamesh.Members {
			if st.Datamesh.Members[i].Name == names[2] || st.Datamesh.Members[i].Name == joining {
				st.Datamesh.Members[i].Attached = true
			}
		}
	})
	// Several retry intervals (500 ms): a forced retry would have happened by now.
	r.watchNoneStale(4*time.Second, 3, true)
	r.watchNoneStale(time.Second, 2, false)
	r.eventually("the refusals reported", 30*time.Second, func() string {
		for _, n := range []string{names[2], joining} {
			c := meta.FindStatusCondition(r.rvr(n).Status.Conditions, v1.ConditionDRBDRole)
			// Refused for want of quorum (PromoteNoQuorum) or of UpToDate data
			// (PromoteFailed): either way reported, never forced.
			if c == nil || c.Status != metav1.ConditionFalse || (c.Reason != v1.ReasonPromoteFailed && c.Reason != v1.ReasonPromoteNoQuorum) {
				return fmt.Sprintf("%s: %v", n, c)
			}
		}
		return ""
	})
	// node-0 still writes: one writer, on the majority side.
	r.must(r.node(0).Sim.Write(r.ctx, r.rv, 0, bytes.Repeat([]byte{0xee}, 4096)))
	r.c.Sim.Heal()
}

// The day-0 skip of the initial sync (new-current-uuid --clear-bitmap) runs only while
// the volume forms. The case: the only UpToDate replica of the volume dies and
// is force-removed while its replacement is still syncing; the half-synced replica is
// now the only Diskful member, Inconsistent, "connected to every other Diskful member"
// — vacuously — exactly what day 0 looks like except that there is no Formation. It
// must stay Inconsistent (the data is gone with the dead node, and that must show),
// never declare itself UpToDate with half the data.
func TestNoDayZeroOutsideFormation(t *testing.T) {
	r := newRig(t, 2, nil)
	first := r.addReplica(0, v1.ReplicaTypeDiskful)
	m := r.member(first, v1.MemberTypeDiskful, 0)
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh = v1.Datamesh{Members: []v1.DatameshMember{m}, Quorum: 1, QuorumMinimumRedundancy: 1, Port: 7000, Minor: 1000}
		formation(st, st.DatameshRevision+1)
	})
	r.confirmed(rev, v1.DiskStateUpToDate, first)
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.DatameshTransitions = nil
		st.Datamesh.Members[0].Attached = true
	})
	r.confirmed(rev, "", first)
	r.writeSpread(0, 256)
	second := r.joinSyncing(1, 1)

	r.must(r.c.CrashNode(r.node(0).Name))
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members = []v1.DatameshMember{st.Datamesh.Members[1]}
		st.Datamesh.Members[0].Attached = false
	})
	r.confirmed(rev, "", second)
	r.watchNoneStale(4*time.Second, 1, true)
}

// laggingDriver delivers the kernel's events2 lines lag late, as an agent's
// stream falls behind under load, and counts the day-0 bitmap clears and how
// many the kernel refused.
type laggingDriver struct {
	drbd.Driver
	lag             time.Duration
	clears, refused *atomic.Int32
}

func (d laggingDriver) Events(ctx context.Context) (io.ReadCloser, error) {
	rc, err := d.Driver.Events(ctx)
	if err != nil {
		return nil, err
	}
	type line struct {
		at   time.Time
		text []byte
	}
	lines := make(chan line, 1<<14)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(rc)
		for sc.Scan() {
			lines <- line{time.Now(), append(slices.Clone(sc.Bytes()), '\n')}
		}
	}()
	pr, pw := io.Pipe()
	go func() {
		defer rc.Close()
		for l := range lines {
			select {
			case <-ctx.Done(): // the stream ends with its context, as drbdsetup's does
				pw.CloseWithError(ctx.Err())
				return
			case <-time.After(time.Until(l.at.Add(d.lag))):
			}
			if _, err := pw.Write(l.text); err != nil {
				return
			}
		}
		pw.Close()
	}()
	return pr, nil
}

func (d laggingDriver) NewCurrentUUIDClearBitmap(ctx context.Context, name string) error {
	d.clears.Add(1)
	err := d.Driver.NewCurrentUUIDClearBitmap(ctx, name)
	if err != nil {
		d.refused.Add(1)
	}
	return err
}

// The day-0 clear runs once per volume, on an Inconsistent disk, even when the
// agent's event stream lags the kernel: the agent reconciles again at once
// (its own status write), while its events still show the disk Inconsistent
// that the clear has already made UpToDate. The kernel's own state decides.
func TestDayZeroOnceWhenEventsLag(t *testing.T) {
	var clears, refused atomic.Int32
	r := newRig(t, 3, func(c *agent.Config) {
		c.Driver = laggingDriver{Driver: c.Driver, lag: 1500 * time.Millisecond, clears: &clears, refused: &refused}
	})
	r.form3D()
	time.Sleep(3 * time.Second) // every lagged line delivered, every reconcile it causes done
	if n, bad := clears.Load(), refused.Load(); n != 1 || bad != 0 {
		t.Fatalf("new-current-uuid --clear-bitmap ran %d times (%d refused by the kernel), want once", n, bad)
	}
}
