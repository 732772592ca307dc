package cluster_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/csi"
)

// Scenario: snapshot, restore and clone (docs/snapshots.md) for 1D and 2D+1TB (3D in
// csi-sanity). A
// volume attached on a diskful node holds data A; CreateSnapshot; the volume is
// overwritten with B; a volume restored from the snapshot holds A on every diskful
// replica once in sync, a clone of the source holds B; the snapshot has a copy on
// every diskful node of the source; deleting everything leaves no file, no DRBD
// resource and no object behind.
func TestSnapshotRestoreClone(t *testing.T) {
	for _, l := range layoutsNamed("1D", "2D+1TB") {
		t.Run(l.slug(), func(t *testing.T) {
			r := newRig(t)
			cs := r.csiController()
			class := r.class(l.ftt, l.gmdr, v1.TopologyIgnored)
			src, snap := "snap-src-"+l.slug(), "snap-"+l.slug()
			rv := r.formed(src, l)
			diskful := diskfulNodes(rv)
			r.attach(src, diskful[0])
			a, b := pattern("A-"+l.slug()), pattern("B-"+l.slug())
			r.must(r.c.Node(diskful[0]).Sim.Write(r.ctx, src, 0, a))

			start := time.Now()
			res, err := cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: snap, SourceVolumeId: src})
			r.must(err)
			t.Logf("CreateSnapshot took %s", time.Since(start))
			if s := res.GetSnapshot(); !s.GetReadyToUse() || s.GetSourceVolumeId() != src || s.GetSizeBytes() != rv.Spec.Size.Value() || s.GetCreationTime() == nil {
				t.Fatalf("CreateSnapshot answered %+v", s)
			}
			rvs := &v1.ReplicatedVolumeSnapshot{}
			r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: snap}, rvs))
			if got := slices.Sorted(slices.Values(rvs.Status.Copies)); !slices.Equal(got, diskful) {
				t.Fatalf("copies on %v, want every diskful node %v", got, diskful)
			}
			again, err := cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: snap, SourceVolumeId: src})
			r.must(err)
			if again.GetSnapshot().GetSnapshotId() != snap {
				t.Fatalf("repeated CreateSnapshot answered %+v", again.GetSnapshot())
			}
			r.eventually("IO resumed on "+src, 30*time.Second, func() string { return r.suspendedAnywhere(src) })
			r.must(r.c.Node(diskful[0]).Sim.Write(r.ctx, src, 0, b))

			restored := "snap-restore-" + l.slug()
			r.createFrom(cs, restored, class, &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
				Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap}}})
			clone := "snap-clone-" + l.slug()
			r.createFrom(cs, clone, class, &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
				Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: src}}})
			r.holds(restored, a)
			r.holds(clone, b)
			if err := r.cl.Get(r.ctx, client.ObjectKey{Name: "clone-" + clone}, &v1.ReplicatedVolumeSnapshot{}); !apierrors.IsNotFound(err) {
				t.Errorf("the clone's own snapshot is still there once the clone is formed: %v", err)
			}

			r.detach(src, diskful[0])
			// The snapshot outlives its volume and is deleted on its own.
			r.deleteThenSnapshot(cs, snap, restored, clone, src)
		})
	}
}

// Error codes: a snapshot of a volume that does not exist is NotFound; a restore
// smaller than the snapshot is OutOfRange; a restore from a snapshot that does not
// exist is NotFound; ListSnapshots filters and pages.
func TestSnapshotErrors(t *testing.T) {
	r := newRig(t)
	cs := r.csiController()
	class := r.class(0, 0, v1.TopologyIgnored)
	_, err := cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: "snap-err-none", SourceVolumeId: "no-such-volume"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("snapshot of a missing volume: %v, want NotFound", err)
	}
	const vol, snap = "snap-err-src", "snap-err"
	r.volume(vol, class, 1)
	r.ready(vol, 2*time.Minute)
	_, err = cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: snap, SourceVolumeId: vol})
	r.must(err)
	_, err = cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: snap, SourceVolumeId: "snap-err-other"})
	if status.Code(err) != codes.AlreadyExists {
		t.Fatalf("same snapshot name, other volume: %v, want AlreadyExists", err)
	}
	small := &csipb.CreateVolumeRequest{Name: "snap-err-small", Parameters: map[string]string{v1.CSIParameterStorageClass: class},
		CapacityRange:       &csipb.CapacityRange{RequiredBytes: 32 << 20},
		VolumeCapabilities:  []*csipb.VolumeCapability{singleWriterMount},
		VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap}}}}
	if _, err := cs.CreateVolume(r.ctx, small); status.Code(err) != codes.OutOfRange {
		t.Fatalf("restore smaller than the snapshot: %v, want OutOfRange", err)
	}
	small.CapacityRange = nil
	small.VolumeContentSource.GetSnapshot().SnapshotId = "no-such-snapshot"
	if _, err := cs.CreateVolume(r.ctx, small); status.Code(err) != codes.NotFound {
		t.Fatalf("restore from a missing snapshot: %v, want NotFound", err)
	}
	l, err := cs.ListSnapshots(r.ctx, &csipb.ListSnapshotsRequest{SourceVolumeId: vol})
	r.must(err)
	if len(l.GetEntries()) != 1 || l.GetEntries()[0].GetSnapshot().GetSnapshotId() != snap {
		t.Fatalf("ListSnapshots of %s: %v", vol, l.GetEntries())
	}
	if _, err := cs.ListSnapshots(r.ctx, &csipb.ListSnapshotsRequest{StartingToken: "bogus"}); status.Code(err) != codes.Aborted {
		t.Fatalf("ListSnapshots with a bogus token: %v, want Aborted", err)
	}
	r.deleteThenSnapshot(cs, snap, vol)
}

func diskfulNodes(rv *v1.ReplicatedVolume) []string {
	var out []string
	for _, m := range rv.Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful {
			out = append(out, m.NodeName)
		}
	}
	slices.Sort(out)
	return out
}

// pattern is 1 MiB of data that names what it is.
func pattern(what string) []byte {
	sum := sha256.Sum256([]byte(what))
	return bytes.Repeat(sum[:], (1<<20)/len(sum))
}

func (r *rig) createFrom(cs *csi.Controller, name, class string, src *csipb.VolumeContentSource) {
	r.t.Helper()
	start := time.Now()
	res, err := cs.CreateVolume(r.ctx, &csipb.CreateVolumeRequest{Name: name, Parameters: map[string]string{v1.CSIParameterStorageClass: class},
		VolumeCapabilities: []*csipb.VolumeCapability{singleWriterMount}, VolumeContentSource: src})
	r.must(err)
	r.t.Logf("CreateVolume %s from %v took %s", name, src, time.Since(start))
	if res.GetVolume().GetContentSource() == nil {
		r.t.Fatalf("CreateVolume %s answered no content source", name)
	}
}

// holds waits until the volume is Ready (every replica in sync) and reads want at
// offset 0 on a diskful replica other than the seeded one when there is one: its data
// came by DRBD's sync from the seed.
func (r *rig) holds(vol string, want []byte) {
	r.t.Helper()
	rv := r.ready(vol, 3*time.Minute)
	ds := rv.Spec.DataSource
	if ds == nil {
		r.t.Fatalf("%s has no spec.dataSource", vol)
	}
	nodes := diskfulNodes(rv)
	if !slices.Contains(nodes, ds.NodeName) {
		r.t.Fatalf("%s: no diskful replica on %s, the node of its source's copy (diskful on %v)", vol, ds.NodeName, nodes)
	}
	n := nodes[0]
	if len(nodes) > 1 && n == ds.NodeName {
		n = nodes[1]
	}
	r.attach(vol, n)
	got, err := r.c.Node(n).Sim.Read(r.ctx, vol, 0, len(want))
	r.must(err)
	if !bytes.Equal(got, want) {
		r.t.Fatalf("%s read on %s (seeded on %s): %x..., want %x...", vol, n, ds.NodeName, got[:8], want[:8])
	}
	r.detach(vol, n)
}

// suspendedAnywhere names the nodes where the volume's IO is suspended by suspend-io.
func (r *rig) suspendedAnywhere(vol string) string {
	var out []string
	for _, n := range r.c.Nodes {
		st, err := n.Sim.Status(r.ctx, vol)
		if err == nil && len(st) == 1 && st[0].SuspendedUser {
			out = append(out, n.Name)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "suspended on " + strings.Join(out, ", ")
}

// noSnapshotFiles waits until the snapshot object and every copy file of it are gone.
func (r *rig) noSnapshotFiles(snap string) {
	r.t.Helper()
	r.eventually(snap+" gone", time.Minute, func() string {
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: snap}, &v1.ReplicatedVolumeSnapshot{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("snapshot object still there (%v)", err)
		}
		for _, n := range r.c.Nodes {
			for _, f := range n.Files() {
				if strings.HasPrefix(filepath.Base(f), snap+".") {
					return "copy left: " + f
				}
			}
		}
		return ""
	})
}

// The IO suspension a snapshot costs a writer: a 2D+1TB volume attached on a diskful
// node takes small writes in a loop while five snapshots are taken; the longest write
// of each snapshot is its suspend window as the application sees it. Every write
// completes (IO resumes) and no window outlasts the suspension's deadline.
func TestSnapshotSuspendWindow(t *testing.T) {
	if os.Getenv("MESHVOL_SNAPSHOT_WINDOW") == "" {
		t.Skip("a measurement (docs/benchmarks.md, \"Snapshots\"): set MESHVOL_SNAPSHOT_WINDOW=1 to run it")
	}
	r := newRig(t)
	cs := r.csiController()
	const vol = "snap-window"
	r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 1)
	node := diskfulNodes(r.ready(vol, 2*time.Minute))[0]
	r.attach(vol, node)
	sim := r.c.Node(node).Sim
	var windows, creates []time.Duration
	for i := range 5 {
		stop := make(chan struct{})
		longest := make(chan time.Duration, 1)
		go func() {
			var most time.Duration
			for off := int64(0); ; off = (off + 4096) % (1 << 20) {
				select {
				case <-stop:
					longest <- most
					return
				default:
				}
				began := time.Now()
				if err := sim.Write(r.ctx, vol, off, make([]byte, 4096)); err != nil {
					t.Errorf("write during snapshot %d: %v", i, err)
				}
				most = max(most, time.Since(began))
			}
		}()
		began := time.Now()
		name := fmt.Sprintf("snap-window-%d", i)
		_, err := cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: name, SourceVolumeId: vol})
		creates = append(creates, time.Since(began))
		r.eventually("IO resumed on "+vol, 30*time.Second, func() string { return r.suspendedAnywhere(vol) })
		time.Sleep(100 * time.Millisecond) // a write after the resume
		close(stop)
		windows = append(windows, <-longest)
		r.must(err)
		_, err = cs.DeleteSnapshot(r.ctx, &csipb.DeleteSnapshotRequest{SnapshotId: name})
		r.must(err)
	}
	slices.Sort(windows)
	slices.Sort(creates)
	t.Logf("suspend window seen by a writer: median %s, max %s (%v); CreateSnapshot: median %s, max %s",
		windows[len(windows)/2], windows[len(windows)-1], windows, creates[len(creates)/2], creates[len(creates)-1])
	if w := windows[len(windows)-1]; w > 2*time.Minute {
		t.Errorf("a write waited %s during a snapshot", w)
	}
	r.detach(vol, node)
	r.deleteVolume(vol)
	for i := range 5 {
		r.noSnapshotFiles(fmt.Sprintf("snap-window-%d", i))
	}
}

// Fault: an agent restarts while a snapshot holds the volume's IO suspended (a crash
// between suspend-io and resume-io). The window is made to last rather than caught: a 1D
// volume is attached on a diskless node and the agent of its diskful node is stopped, so
// the snapshot's attempt holds the attached node's IO suspended until that agent is back
// or the deadline passes (then the next attempt holds it again). A 1D snapshot with every
// agent up takes a few tens of milliseconds, less than one look at the nodes. Inside the
// window the attached node's agent restarts; then the diskful node's agent returns. The
// snapshot is taken (or its attempt aborted and retried), IO resumes, and a writer's write
// completes. Then a suspension no snapshot holds (an agent that died after suspend-io,
// its snapshot gone meanwhile) is resumed by the restarted agent.
func TestSnapshotAgentRestart(t *testing.T) {
	r := newRig(t)
	cs := r.csiController()
	const vol, snap = "snap-restart", "snap-restart"
	r.volume(vol, r.class(0, 0, v1.TopologyIgnored), 1)
	diskful := diskfulNodes(r.ready(vol, 2*time.Minute))[0]
	node := r.c.Nodes[0].Name
	if node == diskful {
		node = r.c.Nodes[1].Name
	}
	r.attach(vol, node)
	r.must(r.c.StopAgent(diskful))
	back := false
	t.Cleanup(func() {
		if !back {
			_ = r.c.RestartAgent(diskful)
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: snap, SourceVolumeId: vol})
		done <- err
	}()
	r.eventually("IO suspended on "+node, time.Minute, func() string {
		if got, want := r.suspendedAnywhere(vol), "suspended on "+node; got != want {
			return fmt.Sprintf("%q, want %q", got, want)
		}
		return ""
	})
	r.must(r.c.RestartAgent(node))
	wrote := make(chan error, 1)
	go func() { wrote <- r.c.Node(node).Sim.Write(r.ctx, vol, 0, pattern("after-restart")) }()
	back = true
	r.must(r.c.RestartAgent(diskful))
	r.must(<-done)
	r.must(<-wrote)
	r.eventually("IO resumed on "+vol, time.Minute, func() string { return r.suspendedAnywhere(vol) })

	r.must(r.c.Node(node).Sim.SuspendIO(r.ctx, vol))
	r.must(r.c.RestartAgent(node))
	r.eventually("a suspension no snapshot holds resumed", time.Minute, func() string { return r.suspendedAnywhere(vol) })
	r.must(r.c.Node(node).Sim.Write(r.ctx, vol, 0, pattern("after-second-restart")))

	r.detach(vol, node)
	_, err := cs.DeleteSnapshot(r.ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap})
	r.must(err)
	r.deleteVolume(vol)
	r.noSnapshotFiles(snap)
}

// Fault: a node that holds a copy is lost after the snapshot. The snapshot lives on every
// diskful replica's node (docs/snapshots.md, "Where snapshots live"), so a restore is
// seeded from the copy on the live node and holds the snapshot's data; a clone of the
// source, taken once the lost replica is replaced, holds the source's data. Once the
// node is back, deleting everything leaves no copy behind on it either.
func TestSnapshotRestoreAfterNodeLoss(t *testing.T) {
	r := newRig(t)
	cs := r.csiController()
	class := r.class(1, 0, v1.TopologyIgnored)
	const src, snap = "snap-lost-src", "snap-lost"
	r.volume(src, class, 1)
	diskful := diskfulNodes(r.ready(src, 2*time.Minute))
	// The copy a restore would start from, the first by name, is on the node lost.
	lost, survivor := diskful[0], diskful[1]
	r.attach(src, survivor)
	a := pattern("A-lost")
	r.must(r.c.Node(survivor).Sim.Write(r.ctx, src, 0, a))
	_, err := cs.CreateSnapshot(r.ctx, &csipb.CreateSnapshotRequest{Name: snap, SourceVolumeId: src})
	r.must(err)

	r.must(r.c.CrashNode(lost))
	back := false
	t.Cleanup(func() {
		if !back {
			_ = r.c.RestartNode(lost)
		}
	})
	r.eventually("the agent of "+lost+" not live", time.Minute, func() string {
		le := &coordinationv1.Lease{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Namespace: r.c.Namespace, Name: v1.AgentLeasePrefix + lost}, le); err != nil {
			return err.Error()
		}
		if agentlease.Judge(le, time.Now(), 0).Live {
			return "its Lease is valid"
		}
		return ""
	})
	restored, clone := "snap-lost-restore", "snap-lost-clone"
	r.createFrom(cs, restored, class, &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
		Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap}}})
	if ds := r.rv(restored).Spec.DataSource; ds.NodeName != survivor {
		t.Fatalf("the restore is seeded from the copy on %s, want the live %s (%s is lost)", ds.NodeName, survivor, lost)
	}
	r.holds(restored, a)
	r.createFrom(cs, clone, class, &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
		Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: src}}})
	r.holds(clone, a)

	back = true
	r.must(r.c.RestartNode(lost))
	r.detach(src, survivor)
	r.deleteThenSnapshot(cs, snap, restored, clone, src)
}

// deleteThenSnapshot deletes the volumes through CSI, waiting until each is gone, then
// the snapshot, waiting until it and its copies are.
func (r *rig) deleteThenSnapshot(cs *csi.Controller, snap string, volumes ...string) {
	r.t.Helper()
	for _, v := range volumes {
		_, err := cs.DeleteVolume(r.ctx, &csipb.DeleteVolumeRequest{VolumeId: v})
		r.must(err)
		r.gone(v)
	}
	_, err := cs.DeleteSnapshot(r.ctx, &csipb.DeleteSnapshotRequest{SnapshotId: snap})
	r.must(err)
	r.noSnapshotFiles(snap)
}
