package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// Scenario 7: a volume deleted in each phase leaves nothing: no RV, RVR, RVA
// or Secret, no DRBD resource and no backing file on any node, no loop
// device.
func TestDeleteInEveryPhase(t *testing.T) {
	r := newRig(t)
	class := r.class(1, 1, v1.TopologyIgnored)

	t.Run("Forming", func(t *testing.T) {
		r := &rig{t: t, ctx: r.ctx, c: r.c, cl: r.cl}
		r.volume("del-forming", class, 1)
		r.eventually("replicas placed", time.Minute, func() string {
			if len(r.rvrs("del-forming")) == 0 {
				return "none yet"
			}
			return ""
		})
		r.deleteVolume("del-forming")
	})
	t.Run("Ready", func(t *testing.T) {
		r := &rig{t: t, ctx: r.ctx, c: r.c, cl: r.cl}
		r.volume("del-ready", class, 1)
		r.ready("del-ready", 2*time.Minute)
		r.deleteVolume("del-ready")
	})
	t.Run("Attached", func(t *testing.T) {
		r := &rig{t: t, ctx: r.ctx, c: r.c, cl: r.cl}
		r.volume("del-attached", class, 1)
		rv := r.ready("del-attached", 2*time.Minute)
		node := rv.Status.Datamesh.Members[0].NodeName
		r.attach("del-attached", node)
		r.must(r.cl.Delete(r.ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "del-attached"}}))
		// An attached volume waits for its attachment to go.
		time.Sleep(2 * time.Second)
		if r.role("del-attached", node) != "Primary" {
			t.Fatalf("deleting the volume took its attachment away")
		}
		r.detach("del-attached", node)
		r.gone("del-attached")
	})
	t.Run("Degraded", func(t *testing.T) {
		r := &rig{t: t, ctx: r.ctx, c: r.c, cl: r.cl}
		r.volume("del-degraded", class, 1)
		rv := r.ready("del-degraded", 2*time.Minute)
		lost := rv.Status.Datamesh.Members[2].NodeName
		r.must(r.c.CrashNode(lost))
		t.Cleanup(func() { _ = r.c.RestartNode(lost) })
		r.eventually("Degraded", time.Minute, func() string {
			if p := r.rv("del-degraded").Status.Phase; p != v1.VolumePhaseDegraded {
				return phase(r.rv("del-degraded"))
			}
			return ""
		})
		r.must(r.cl.Delete(r.ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "del-degraded"}}))
		// The crashed node comes back: its agent finds its replica gone and
		// cleans up what it held (never reusing the data).
		time.Sleep(time.Second)
		r.must(r.c.RestartNode(lost))
		r.gone("del-degraded")
	})
	// The simulator's device file system (a Primary's device is a loop device
	// over one of its files) stays mounted while the cluster runs; Stop
	// unmounts it and checks that nothing is left (TestZZStop).
	left := slices.DeleteFunc(r.c.Leftovers(), func(s string) bool {
		return s == "mount "+filepath.Join(r.c.Dir, "drbdsim", "fuse")
	})
	if len(left) > 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// Scenario 5: a partition. The minority side loses quorum and cannot
// promote; the majority keeps writing; after healing there is no split
// brain and no acknowledged write is lost.
func TestPartition(t *testing.T) {
	r := newRig(t)
	const vol = "partition-3d"
	r.volume(vol, r.class(1, 1, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	a, c := rv.Status.Datamesh.Members[0].NodeName, rv.Status.Datamesh.Members[2].NodeName
	t.Logf("attached on %s; %s is cut off first, then %s alone", a, c, a)
	r.attach(vol, a)
	write := func(i int) error {
		return r.c.Node(a).Sim.Write(r.ctx, vol, int64(i%64)*4096, bytes.Repeat([]byte{byte(i)}, 4096))
	}

	r.c.Partition(c)
	r.eventually(c+" loses quorum", 30*time.Second, func() string {
		st, err := r.c.Node(c).Sim.Status(r.ctx, vol)
		r.must(err)
		if st[0].Devices[0].Quorum {
			return "still quorate"
		}
		return ""
	})
	if err := r.c.Node(c).Sim.Primary(r.ctx, vol, drbd.NoForce); !errors.Is(err, drbd.ErrNoQuorum) {
		t.Fatalf("promotion on the minority side: %v, want no quorum", err)
	}
	for i := range 32 {
		r.must(write(i)) // the majority side keeps serving
	}
	r.c.Heal()
	r.inSync(vol, rv)
	r.consistent(vol)
	// The attached side alone is the minority now: it cannot write.
	others := []string{rv.Status.Datamesh.Members[1].NodeName, c}
	r.c.Partition(others...)
	ctx, cancel := context.WithTimeout(r.ctx, 2*time.Second)
	err := r.c.Node(a).Sim.Write(ctx, vol, 0, bytes.Repeat([]byte{9}, 4096))
	cancel()
	if err == nil {
		t.Fatalf("the isolated Primary acknowledged a write without quorum")
	}
	r.c.Heal()
	r.inSync(vol, rv)
	r.eventually("writes flow again", time.Minute, func() string {
		if err := write(99); err != nil {
			return err.Error()
		}
		return ""
	})
	r.consistent(vol)
	r.detach(vol, a)
	r.deleteVolume(vol)
}

// inSync waits until every member's DRBD is connected to every peer with no
// resync running and every diskful disk UpToDate. An isolated replica keeps
// calling itself UpToDate, and DRBD reconnects a healed link only at its next
// connect attempt, so "all UpToDate" alone proves nothing after a partition.
func (r *rig) inSync(vol string, rv *v1.ReplicatedVolume) {
	r.t.Helper()
	r.eventually("healed and in sync", 2*time.Minute, func() string {
		for _, m := range rv.Status.Datamesh.Members {
			st, err := r.c.Node(m.NodeName).Sim.Status(r.ctx, vol)
			r.must(err)
			if m.Type == v1.MemberTypeDiskful && st[0].Devices[0].DiskState != "UpToDate" {
				return m.NodeName + " " + st[0].Devices[0].DiskState
			}
			for _, c := range st[0].Connections {
				if c.ConnectionState != "Connected" || len(c.PeerDevices) == 0 || c.PeerDevices[0].ReplicationState != "Established" {
					return m.NodeName + " → " + c.Name + ": " + c.ConnectionState
				}
			}
		}
		return ""
	})
}
