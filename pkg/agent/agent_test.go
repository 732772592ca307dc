package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/agent"
	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
	"github.com/meshvol/meshvol/pkg/storage"
)

// These tests run real agents (internal/localcluster without a controller) on a
// real apiserver, with drbdsim and file pools on loop devices. The test plays
// the controller: it writes RV status (the datamesh) the way the controller
// will, and reads what the agents report in RVR status and what each
// simulated kernel runs.

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env, testenv.Options{})) }

const size = 64 << 20

// rig is one in-process cluster and one volume on it.
type rig struct {
	t   *testing.T
	ctx context.Context
	c   *localcluster.Cluster
	cl  client.Client
	rv  string
}

func newRig(t *testing.T, nodes int, tweak func(*agent.Config)) *rig {
	t.Helper()
	return newRigWith(t, nodes, localcluster.Options{Agent: tweak})
}

func newRigWith(t *testing.T, nodes int, opts localcluster.Options) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("file pools need loop devices (root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	name := testenv.Name(t)
	prefix := name[len(name)-10:]
	opts.Env, opts.Nodes, opts.NamePrefix = env, nodes, "n"+prefix
	c, err := localcluster.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	r := &rig{t: t, ctx: ctx, c: c, cl: c.Client, rv: "v" + prefix}
	if _, err := c.CreatePool(ctx, "pool-"+prefix); err != nil {
		t.Fatal(err)
	}
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: r.rv}, Spec: v1.ReplicatedVolumeSpec{
		Size:              *resource.NewQuantity(size, resource.BinarySI),
		ConfigurationMode: v1.ConfigurationModeManual,
		ManualConfiguration: &v1.ReplicatedVolumeConfiguration{
			StoragePool: "pool-" + prefix, FailuresToTolerate: 1, GuaranteedMinimumDataRedundancy: 1},
	}}
	r.must(r.cl.Create(ctx, rv))
	return r
}

func (r *rig) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) pool() string { return "pool-" + r.rv[1:] }

func (r *rig) node(i int) *localcluster.Node { return r.c.Nodes[i] }

// recordEvents records node i's events2 stream from now on, until the test
// ends; the returned function gives what it has read so far.
func (r *rig) recordEvents(i int) func() string {
	stream, err := r.node(i).Sim.Events(r.ctx)
	r.must(err)
	r.t.Cleanup(func() { stream.Close() })
	var mu sync.Mutex
	var got bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := stream.Read(buf)
			mu.Lock()
			got.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return got.String()
	}
}

// addReplica creates the RVR of node i as the controller's placement would.
func (r *rig) addReplica(i int, typ v1.ReplicaType) string {
	n := r.node(i)
	rvr := &v1.ReplicatedVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{
			Name:       v1.ReplicaName(r.rv, n.Name),
			Labels:     map[string]string{v1.LabelVolume: r.rv, v1.LabelNode: n.Name},
			Finalizers: []string{v1.FinalizerAgent},
		},
		Spec: v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: r.rv, NodeName: n.Name, Type: typ},
	}
	if typ == v1.ReplicaTypeDiskful {
		rvr.Spec.Storage = &v1.ReplicaStorage{Pool: r.pool()}
	}
	r.must(r.cl.Create(r.ctx, rvr))
	return rvr.Name
}

// backing reads n bytes at off of node i's backing volume of the RV, as
// drbdsetup show names it: where a Secondary's data is read on real DRBD
// too (its DRBD device does not open with auto-promote no; internal
// metadata sits at the end, so the offsets are the device's).
func (r *rig) backing(i int, off int64, n int) []byte {
	r.t.Helper()
	show, err := r.node(i).Sim.Show(r.ctx, r.rv)
	r.must(err)
	if len(show) != 1 || len(show[0].ThisHost.Volumes) != 1 || show[0].ThisHost.Volumes[0].BackingDisk == "" {
		r.t.Fatalf("%s: no backing disk of %s in drbdsetup show: %+v", r.node(i).Name, r.rv, show)
	}
	f, err := os.Open(show[0].ThisHost.Volumes[0].BackingDisk)
	r.must(err)
	defer f.Close()
	buf := make([]byte, n)
	_, err = f.ReadAt(buf, off)
	r.must(err)
	return buf
}

func (r *rig) rvr(name string) *v1.ReplicatedVolumeReplica {
	r.t.Helper()
	o := &v1.ReplicatedVolumeReplica{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: name}, o))
	return o
}

// releaseAndDelete does what the controller does with a replica it removed from the
// datamesh: it releases the agent's finalizer and deletes the replica, then waits until
// the replica is gone. A running agent may write the replica's status meanwhile: the
// release is read again and retried then, as the controller's would be.
func (r *rig) releaseAndDelete(name string) {
	r.t.Helper()
	var patched *v1.ReplicatedVolumeReplica
	r.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := r.rvr(name)
		patched = cur.DeepCopy()
		patched.Finalizers = nil
		return r.cl.Patch(r.ctx, patched, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
	}))
	r.must(r.cl.Delete(r.ctx, patched))
	r.eventually("the removed replica gone", 30*time.Second, func() string {
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: name}, &v1.ReplicatedVolumeReplica{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("still there (%v)", err)
		}
		return ""
	})
}

// publish changes the datamesh as the controller would and bumps the revision.
func (r *rig) publish(change func(st *v1.ReplicatedVolumeStatus)) int64 {
	r.t.Helper()
	for {
		rv := &v1.ReplicatedVolume{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: r.rv}, rv))
		change(&rv.Status)
		rv.Status.DatameshRevision++
		err := r.cl.Status().Update(r.ctx, rv)
		if apierrors.IsConflict(err) {
			continue
		}
		r.must(err)
		return rv.Status.DatameshRevision
	}
}

// member makes a datamesh member of the RVR, with its node's addresses (the
// controller takes them from the agent's Lease: docs/contract.md).
func (r *rig) member(name string, typ v1.MemberType, id int32) v1.DatameshMember {
	rvr := r.rvr(name)
	var addrs []string
	for _, n := range r.c.Nodes {
		if n.Name == rvr.Spec.NodeName {
			addrs = []string{n.Address.String()}
		}
	}
	return v1.DatameshMember{Name: name, Type: typ, NodeName: rvr.Spec.NodeName, Addresses: addrs, NodeID: id}
}

// eventually polls cond until it returns "" or the deadline passes.
func (r *rig) eventually(what string, d time.Duration, cond func() string) {
	r.t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) {
		if last = cond(); last == "" {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("%s: not within %s: %s", what, d, last)
}

// confirmed waits until every named replica reports revision ≥ rev and the
// condition DRBDConfigured=True (and, when disk is set, that disk state).
func (r *rig) confirmed(rev int64, disk v1.DiskState, names ...string) {
	r.t.Helper()
	r.eventually(fmt.Sprintf("revision %d confirmed", rev), 60*time.Second, func() string {
		for _, n := range names {
			o := r.rvr(n)
			c := meta.FindStatusCondition(o.Status.Conditions, v1.ConditionDRBDConfigured)
			switch {
			case o.Status.DatameshRevision < rev:
				return fmt.Sprintf("%s reports revision %d (%v)", n, o.Status.DatameshRevision, c)
			case c == nil || c.Status != metav1.ConditionTrue:
				return fmt.Sprintf("%s: %v", n, c)
			case disk != "" && o.Status.DiskState != disk:
				return fmt.Sprintf("%s: disk %s", n, o.Status.DiskState)
			}
		}
		return ""
	})
}

func formation(st *v1.ReplicatedVolumeStatus, rev int64) {
	st.DatameshTransitions = []v1.DatameshTransition{{
		Type: v1.TransitionFormation, Group: v1.GroupFormation, PlanID: "formation", PlanVersion: 1,
		Steps: []v1.DatameshTransitionStep{
			{Name: "✦ → layout", Status: v1.StepCompleted, DatameshRevision: rev},
			{Name: "D → UpToDate", Status: v1.StepActive},
		},
	}}
}

// form3D creates three Diskful replicas and publishes them as a 3D datamesh
// (q=2, qmr=2) with a Formation transition; it returns the replica names.
func (r *rig) form3D() []string {
	r.t.Helper()
	names := []string{r.addReplica(0, v1.ReplicaTypeDiskful), r.addReplica(1, v1.ReplicaTypeDiskful), r.addReplica(2, v1.ReplicaTypeDiskful)}
	var members []v1.DatameshMember
	for i, n := range names {
		members = append(members, r.member(n, v1.MemberTypeDiskful, int32(i)))
	}
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh = v1.Datamesh{Members: members, Quorum: 2, QuorumMinimumRedundancy: 2, Port: 7000, Minor: 1000}
		formation(st, st.DatameshRevision+1)
	})
	r.confirmed(rev, v1.DiskStateUpToDate, names...)
	r.publish(func(st *v1.ReplicatedVolumeStatus) { st.DatameshTransitions = nil })
	return names
}

// Formation: replicas report their addresses before they join, configure
// when published, skip the initial sync at day 0 (all UpToDate without a
// resync), confirm the revision only once the kernel runs it, and every
// node's DRBD runs the q/qmr the datamesh says.
func TestFormationConfiguresEveryNode(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	for i := range 3 {
		sh, err := r.node(i).Show(r.ctx, r.rv)
		r.must(err)
		if sh == nil || sh.Options["quorum"] != "2" || sh.Options["quorum-minimum-redundancy"] != "2" || len(sh.Connections) != 2 {
			t.Fatalf("%s runs %+v, want quorum 2, qmr 2, two connections", r.node(i).Name, sh)
		}
		st, err := r.node(i).Sim.Status(r.ctx, r.rv)
		r.must(err)
		for _, c := range st[0].Connections {
			if c.PeerDevices[0].ReplicationState != "Established" {
				t.Errorf("%s → %s: replication %s, want Established (no initial resync at day 0)", r.node(i).Name, c.Name, c.PeerDevices[0].ReplicationState)
			}
		}
	}
	o := r.rvr(names[0])
	if o.Status.BackingVolume == nil || o.Status.BackingVolume.Size.Value() < size {
		t.Errorf("backing volume %+v, want at least %d bytes", o.Status.BackingVolume, size)
	}
	if len(o.Status.Peers) != 2 || o.Status.Peers[0].ConnectionState != "Connected" {
		t.Errorf("peers %+v, want two Connected", o.Status.Peers)
	}
	if o.Status.Quorum == nil || !*o.Status.Quorum {
		t.Errorf("quorum %v, want true", o.Status.Quorum)
	}
}

// Attach and detach: the member the datamesh marks attached is promoted and
// confirms only then; detaching demotes; a demotion refused because the
// device is open is retried, never forced (drbdsim refuses when the loop
// device is held; here the refusal is injected as DRBD's -12).
func TestAttachDetach(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Attached = true })
	r.confirmed(rev, "", names...)
	if o := r.rvr(names[1]); o.Status.Role != v1.RolePrimary {
		t.Fatalf("%s role %s after attach, want Primary", names[1], o.Status.Role)
	}
	r.must(r.node(1).Sim.Write(r.ctx, r.rv, 0, bytes.Repeat([]byte{7}, 4096)))

	r.node(1).Sim.InjectFault("secondary", drbdsim.Fault{Err: errors.New("r: State change failed: (-12) Device is held open by someone")})
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[1].Attached = false })
	r.eventually("demotion refused is reported", 30*time.Second, func() string {
		o := r.rvr(names[1])
		c := meta.FindStatusCondition(o.Status.Conditions, v1.ConditionDRBDRole)
		if c == nil || c.Reason != v1.ReasonDemoteRefused || o.Status.DatameshRevision >= rev {
			return fmt.Sprintf("role condition %v, revision %d", c, o.Status.DatameshRevision)
		}
		return ""
	})
	r.node(1).Sim.ClearFault("secondary")
	r.confirmed(rev, "", names...)
	if o := r.rvr(names[1]); o.Status.Role != v1.RoleSecondary {
		t.Fatalf("role %s after detach, want Secondary", o.Status.Role)
	}
}

// A replica added to a volume that holds data resyncs (no day-0 skip outside
// formation), and afterwards holds every acknowledged write.
func TestAddAfterWritesResyncs(t *testing.T) {
	r := newRig(t, 4, nil)
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", names...)
	for i := range 64 {
		r.must(r.node(0).Sim.Write(r.ctx, r.rv, int64(i)*4096*16, bytes.Repeat([]byte{byte(i + 1)}, 4096)))
	}
	n4 := r.addReplica(3, v1.ReplicaTypeDiskful)
	m := r.member(n4, v1.MemberTypeDiskful, 3)
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members = append(st.Datamesh.Members, m) })
	sawSync := false
	r.eventually("new replica UpToDate", 60*time.Second, func() string {
		o := r.rvr(n4)
		for _, p := range o.Status.Peers {
			if strings.HasPrefix(p.ReplicationState, "Sync") || strings.HasPrefix(p.ReplicationState, "WFBitMap") {
				sawSync = true
			}
		}
		if o.Status.DiskState != v1.DiskStateUpToDate || o.Status.DatameshRevision < rev {
			return fmt.Sprintf("disk %s revision %d", o.Status.DiskState, o.Status.DatameshRevision)
		}
		return ""
	})
	if lost := r.c.Sim.LostAckedWrites(r.rv); len(lost) > 0 {
		t.Fatalf("acknowledged writes lost: %v", lost)
	}
	if got := r.backing(3, 63*4096*16, 4096); got[0] != 64 {
		t.Fatalf("the new replica reads %d at the last written block, want 64 (it skipped the sync?)", got[0])
	}
	t.Logf("resync observed in status: %v", sawSync)
}

// Restart is invisible to IO: the agent of the Primary restarts while a
// writer runs; the resource is never taken down and no write fails.
func TestAgentRestartAdoptsRunningResource(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", names...)

	events := r.recordEvents(0)
	var writes, failures atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := r.node(0).Sim.Write(r.ctx, r.rv, (i%256)*4096, bytes.Repeat([]byte{byte(i)}, 4096)); err != nil {
				failures.Add(1)
			}
			writes.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	r.must(r.c.RestartAgent(r.node(0).Name))
	r.must(r.c.RestartAgent(r.node(1).Name))
	// A new revision after the restart is applied by the new agents.
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.QuorumMinimumRedundancy = 1 })
	r.confirmed(rev, "", names...)
	close(stop)
	<-done
	for _, line := range strings.Split(events(), "\n") {
		// The resource itself (not a peer's connection line) must never go
		// down or lose its Primary role.
		if strings.Contains(line, " destroy resource ") || (strings.Contains(line, " resource ") && strings.Contains(line, "role:Secondary")) {
			t.Fatalf("the Primary's resource went down or was demoted during the agent restart: %s", line)
		}
	}
	if failures.Load() > 0 {
		t.Fatalf("%d of %d writes failed across the agent restart", failures.Load(), writes.Load())
	}
	t.Logf("%d writes across two agent restarts and a new revision, none failed", writes.Load())
}

// A node that reboots loses its loop devices: its file pool's volume is still
// there, with no device bound to it. The new agent attaches it again, and the
// replica, still a member, runs the next revision and is UpToDate.
func TestRebootReattachesBackingVolume(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	dev := r.rvr(names[0]).Status.BackingVolume.DevicePath
	r.must(r.c.CrashNode(r.node(0).Name))
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v\n%s", dev, err, out)
	}
	r.must(r.c.RestartNode(r.node(0).Name))
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) {})
	r.confirmed(rev, v1.DiskStateUpToDate, names...)
	if bv := r.rvr(names[0]).Status.BackingVolume; bv == nil || bv.DevicePath == "" {
		t.Fatalf("backing volume after the reboot: %+v", bv)
	}
}

// A hung DRBD command becomes a condition (ConfigurationFailed naming the
// timeout), not a stuck worker, and the revision is not confirmed; once the
// command works again, the revision is applied.
func TestHungCommandBecomesCondition(t *testing.T) {
	r := newRig(t, 3, func(c *agent.Config) { c.CommandTimeout = time.Second })
	names := r.form3D()
	r.node(2).Sim.InjectFault("adjust", drbdsim.Fault{Hang: true})
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.QuorumMinimumRedundancy = 1 })
	r.eventually("hung adjust reported", 30*time.Second, func() string {
		o := r.rvr(names[2])
		c := meta.FindStatusCondition(o.Status.Conditions, v1.ConditionDRBDConfigured)
		if c == nil || c.Reason != v1.ReasonConfigurationFailed || !strings.Contains(c.Message, "timed out") || o.Status.DatameshRevision >= rev {
			return fmt.Sprintf("%v revision %d", c, o.Status.DatameshRevision)
		}
		return ""
	})
	t.Logf("condition: %s", meta.FindStatusCondition(r.rvr(names[2]).Status.Conditions, v1.ConditionDRBDConfigured).Message)
	r.node(2).Sim.ClearFault("adjust")
	r.confirmed(rev, "", names...)
}

// Deletion: a replica removed from the datamesh and deleted is taken down,
// its backing volume deleted and its finalizer released; nothing remains.
func TestDeleteTearsDown(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members = nil
		st.Datamesh.Quorum, st.Datamesh.QuorumMinimumRedundancy = 0, 0
	})
	for _, n := range names {
		r.must(r.cl.Delete(r.ctx, r.rvr(n)))
	}
	r.replicasGone(names)
	r.nothingLeftOnNodes()
	if left := r.c.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}

// replicasGone waits until none of the replicas names exists any more.
func (r *rig) replicasGone(names []string) {
	r.t.Helper()
	r.eventually("replicas gone", 60*time.Second, func() string {
		for _, n := range names {
			if err := r.cl.Get(r.ctx, client.ObjectKey{Name: n}, &v1.ReplicatedVolumeReplica{}); !apierrors.IsNotFound(err) {
				return n + " still exists"
			}
		}
		return ""
	})
}

// nothingLeftOnNodes fails the test if a node keeps a DRBD resource or a backing file.
func (r *rig) nothingLeftOnNodes() {
	r.t.Helper()
	for i := range r.c.Nodes {
		r.nothingLeftOn(i)
	}
}

// nothingLeftOn fails the test if node i keeps a DRBD resource or a backing file.
func (r *rig) nothingLeftOn(i int) {
	r.t.Helper()
	n := r.node(i)
	res, err := n.Resources(r.ctx)
	r.must(err)
	if len(res) > 0 || len(n.Files()) > 0 {
		r.t.Errorf("%s keeps resources %v and files %v", n.Name, res, n.Files())
	}
}

// holdVolume puts the controller's finalizer on the rig's volume, as the controller
// holds a volume while its replicas go, and takes it off at the end of the test; it
// returns the volume as updated.
func (r *rig) holdVolume() *v1.ReplicatedVolume {
	rv := &v1.ReplicatedVolume{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: r.rv}, rv))
	rv.Finalizers = append(rv.Finalizers, v1.FinalizerController)
	r.must(r.cl.Update(r.ctx, rv))
	r.t.Cleanup(func() {
		rv := &v1.ReplicatedVolume{}
		if r.cl.Get(context.Background(), client.ObjectKey{Name: r.rv}, rv) == nil {
			rv.Finalizers = nil
			_ = r.cl.Update(context.Background(), rv)
		}
	})
	return rv
}

// Deletion with the volume (docs/contract.md, "Deleting a volume"): while the volume
// is attached, a deleted member keeps running (it leaves as the engine decides), and
// the others too. Once it is detached, with no teardown revision published, each agent
// takes its replica down, deletes its backing volume and releases its finalizer,
// whether its replica is deleted yet or not.
func TestDeleteWithVolumeTearsDown(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rv := r.holdVolume()
	attached := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(attached, "", names...)
	r.must(r.cl.Delete(r.ctx, rv))
	r.must(r.cl.Delete(r.ctx, r.rvr(names[1])))
	time.Sleep(3 * time.Second)
	if res, err := r.node(1).Resources(r.ctx); err != nil || len(res) == 0 {
		t.Fatalf("a member deleted while its volume is attached was taken down: resources %v, %v", res, err)
	}

	for _, i := range []int{0, 2} {
		if res, err := r.node(i).Resources(r.ctx); err != nil || len(res) == 0 {
			t.Fatalf("a member of a volume marked deleted while attached was taken down on %s: resources %v, %v", r.node(i).Name, res, err)
		}
	}

	r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = false })
	r.replicasGone(names[1:2]) // deleted, detached: it leaves
	r.eventually("the live members released", 30*time.Second, func() string {
		for _, n := range []string{names[0], names[2]} {
			if slices.Contains(r.rvr(n).Finalizers, v1.FinalizerAgent) {
				return n + " keeps the agent's finalizer"
			}
		}
		return ""
	})
	for _, n := range []string{names[0], names[2]} {
		r.must(r.cl.Delete(r.ctx, r.rvr(n)))
	}
	r.replicasGone(names)
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: r.rv}, rv))
	if got := rv.Status.Datamesh.Members; len(got) != 3 {
		t.Fatalf("the volume's datamesh has %d members, want the 3 it had (no teardown revision)", len(got))
	}
	r.nothingLeftOnNodes()
}

// An agent may see its replica deleted before it sees the volume's deletion mark (two
// watches): the replica keeps running while its volume is not being deleted, and the
// mark of a volume that goes wakes it to leave.
func TestReplicaDeletedBeforeItsVolumesMark(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rv := r.holdVolume()
	for _, n := range names {
		r.must(r.cl.Delete(r.ctx, r.rvr(n)))
	}
	time.Sleep(3 * time.Second)
	for i := range names {
		if res, err := r.node(i).Resources(r.ctx); err != nil || len(res) == 0 {
			t.Fatalf("a member deleted while its volume is not was taken down on %s: resources %v, %v", r.node(i).Name, res, err)
		}
	}
	r.must(r.cl.Delete(r.ctx, rv))
	r.replicasGone(names)
}

// The members of a volume that goes (marked deleted, nothing attached, no Attach or
// Detach in flight) are taken down on its mark, before any of them is deleted: each
// agent takes its resource down, deletes its backing volume and releases its finalizer
// while the replica still lives, and the controller's deletion of a released replica
// then ends it at once (docs/contract.md, "Deleting a volume").
func TestMembersOfAGoingVolumeGoOnItsMark(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rv := r.holdVolume()
	r.must(r.cl.Delete(r.ctx, rv))
	r.eventually("every member taken down and released on the volume's mark", 30*time.Second, func() string {
		for i, n := range names {
			if res, err := r.node(i).Resources(r.ctx); err != nil || len(res) > 0 {
				return fmt.Sprintf("%s runs %v (%v)", r.node(i).Name, res, err)
			}
			if files := r.node(i).Files(); len(files) > 0 {
				return fmt.Sprintf("%s keeps backing files %v", r.node(i).Name, files)
			}
			o := r.rvr(n)
			if o.DeletionTimestamp != nil {
				return n + " is marked deleted: no one deleted it"
			}
			if slices.Contains(o.Finalizers, v1.FinalizerAgent) {
				return n + " keeps the agent's finalizer"
			}
		}
		return ""
	})
	for _, n := range names {
		r.must(r.cl.Delete(r.ctx, r.rvr(n)))
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: n}, &v1.ReplicatedVolumeReplica{}); !apierrors.IsNotFound(err) {
			t.Fatalf("%s, released, was not gone at once when deleted: %v", n, err)
		}
	}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: r.rv}, rv))
	if got := rv.Status.Datamesh.Members; len(got) != 3 {
		t.Fatalf("the volume's datamesh has %d members, want the 3 it had (no teardown revision)", len(got))
	}
	r.nothingLeftOnNodes()
}

// A member whose agent has not seen its volume's deletion mark yet sees its peers leave
// first, taken down by agents that saw the mark. It does not report their departure:
// its agent reads the volume from the apiserver on a peer's departure, finds it going,
// and the replica leaves on the mark without a report (pkg/agent peerLeft). The late
// agent is cut off from the apiserver while its peers go, so its cache cannot show the
// mark before its reconcile: without the read, its report of the departure is the
// write that waits at the cut and goes when the cut ends.
func TestAMemberThatSeesItsPeersGoBeforeTheMarkDoesNotReport(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	rv := r.holdVolume()
	late := r.node(2)
	r.must(r.c.CutOff(late.Name))
	cutOff := true
	t.Cleanup(func() {
		if cutOff {
			r.must(r.c.Reconnect(late.Name))
		}
	})
	before := r.c.Writes.Snapshot()
	r.must(r.cl.Delete(r.ctx, rv))
	r.eventually("the late member's kernel sees both peers leave", 30*time.Second, func() string {
		st, err := late.Sim.Status(r.ctx, r.rv)
		if err != nil || len(st) != 1 {
			return fmt.Sprintf("status of %s: %v %v", late.Name, st, err)
		}
		for _, c := range st[0].Connections {
			if c.ConnectionState == "Connected" {
				return fmt.Sprintf("%s → %s: Connected", late.Name, c.Name)
			}
		}
		return ""
	})
	// Its agent's reconcile of the departure, from the kernel's event, runs against a
	// cache the cut keeps unmarked; what it sends waits at the cut.
	time.Sleep(2 * time.Second)
	r.must(r.c.Reconnect(late.Name))
	cutOff = false
	r.eventually("every member taken down and released", 30*time.Second, func() string {
		for i, n := range names {
			if res, err := r.node(i).Resources(r.ctx); err != nil || len(res) > 0 {
				return fmt.Sprintf("%s runs %v (%v)", r.node(i).Name, res, err)
			}
			if slices.Contains(r.rvr(n).Finalizers, v1.FinalizerAgent) {
				return n + " keeps the agent's finalizer"
			}
		}
		return ""
	})
	writes, _ := r.c.Writes.Since(before)
	if n := writes["agent PATCH replicatedvolumereplicas/status"]; n > 0 {
		t.Errorf("the agents reported %d time(s) during the volume's deletion, want 0: %v", n, writes)
	}
	for _, n := range names {
		r.must(r.cl.Delete(r.ctx, r.rvr(n)))
	}
	r.replicasGone(names)
	r.nothingLeftOnNodes()
}

// Steady state writes nothing: after formation, no RVR is modified for a
// while (the Lease is the only periodic write, and it is not an RVR).
func TestSteadyStateWritesNothing(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	time.Sleep(time.Second) // let the last reports land
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	r.must(err)
	w, err := wc.Watch(r.ctx, &v1.ReplicatedVolumeReplicaList{}, client.MatchingLabels{v1.LabelVolume: r.rv})
	r.must(err)
	defer w.Stop()
	var modified []string
	timeout := time.After(10 * time.Second)
loop:
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified {
				o := ev.Object.(*v1.ReplicatedVolumeReplica)
				modified = append(modified, o.Name)
			}
		case <-timeout:
			break loop
		}
	}
	slices.Sort(modified)
	if len(modified) > 0 {
		t.Fatalf("in 10 s of steady state the replicas %v were modified %d times, want 0", slices.Compact(modified), len(modified))
	}
	_ = names
}

// Growing the volume: the agents grow each backing volume, then DRBD, and
// confirm the revision only once the device offers the new size.
func TestGrowVolume(t *testing.T) {
	r := newRig(t, 3, nil)
	names := r.form3D()
	bigger := resource.NewQuantity(2*size, resource.BinarySI)
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Size = bigger })
	r.confirmed(rev, "", names...)
	for i, n := range names {
		o := r.rvr(n)
		if o.Status.BackingVolume == nil || o.Status.BackingVolume.Size.Value() < 2*size {
			t.Errorf("%s: backing volume %+v, want at least %d bytes", n, o.Status.BackingVolume, 2*size)
		}
		st, err := r.node(i).Sim.Status(r.ctx, r.rv)
		r.must(err)
		if got := st[0].Devices[0].Size * 1024; got < 2*size {
			t.Errorf("%s: DRBD device %d bytes, want at least %d", r.node(i).Name, got, 2*size)
		}
	}
}

// The device path the agent reports is a real, replicated block device
// (drbdsim's FUSE-backed device): a file written through a filesystem and
// fsynced on the Primary survives the Primary's crash and reads back on the
// peer the datamesh attaches next.
func TestFilesystemSurvivesPrimaryCrash(t *testing.T) {
	for _, bin := range []string{"mkfs.ext4", "mount", "umount", "losetup"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	r := newRigWith(t, 3, localcluster.Options{LoopDevices: true})
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", names...)
	dev := r.rvr(names[0]).Status.DevicePath
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	run("mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev)
	mnt := t.TempDir()
	run("mount", dev, mnt)
	want := bytes.Repeat([]byte("meshvol "), 4096)
	f, err := os.Create(mnt + "/data")
	r.must(err)
	_, err = f.Write(want)
	r.must(err)
	r.must(f.Sync())
	r.must(f.Close())

	// The Primary's node crashes with the filesystem mounted.
	r.must(r.c.CrashNode(r.node(0).Name))
	_ = exec.Command("umount", "-l", mnt).Run()
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members[0].Attached = false
		st.Datamesh.Members[1].Attached = true
	})
	r.confirmed(rev, "", names[1], names[2])
	dev = r.rvr(names[1]).Status.DevicePath
	mnt2 := t.TempDir()
	run("mount", dev, mnt2)
	defer exec.Command("umount", mnt2).Run()
	got, err := os.ReadFile(mnt2 + "/data")
	r.must(err)
	if !bytes.Equal(got, want) {
		t.Fatalf("the fsynced file reads back %d bytes, not what was written", len(got))
	}
	if lost := r.c.Sim.LostAckedWrites(r.rv); len(lost) > 0 {
		t.Fatalf("acknowledged writes lost: %v", lost)
	}
}

// A pool whose capacity cannot be measured in time (lvs on a starved node: seconds
// per command) must cost the node neither its liveness nor its pools: the Lease
// is renewed meanwhile and keeps the capacity it carried. On the VM tier's loaded
// guests every renewal waited for an lvs that used up the write's budget, the
// Lease lapsed, and the controller declared the node lost.
func TestLeaseRenewedWhileCapacityHangs(t *testing.T) {
	var hang atomic.Bool
	r := newRigWith(t, 1, localcluster.Options{Agent: func(c *agent.Config) {
		c.RenewInterval = 200 * time.Millisecond
		pools := c.Pools
		c.Pools = func(ctx context.Context, rsp *v1.ReplicatedStoragePool) (storage.Provider, error) {
			p, err := pools(ctx, rsp)
			if p == nil || err != nil {
				return p, err
			}
			return hangingCapacity{Provider: p, hang: &hang}, nil
		}
	}})
	key := client.ObjectKey{Namespace: r.c.Namespace, Name: agent.LeaseName(r.node(0).Name)}
	annotation := v1.AnnotationPoolCapacityPrefix + r.pool()
	l := &coordinationv1.Lease{}
	r.eventually("the pool's capacity on the Lease", time.Minute, func() string {
		if err := r.cl.Get(r.ctx, key, l); err != nil {
			return err.Error()
		}
		if l.Annotations[annotation] == "" {
			return fmt.Sprintf("no capacity annotation: %v", l.Annotations)
		}
		return ""
	})
	hang.Store(true)
	from, capacity := time.Now(), l.Annotations[annotation]
	renewals := 0
	last := l.Spec.RenewTime.Time
	for time.Since(from) < 3*time.Second {
		time.Sleep(100 * time.Millisecond)
		r.must(r.cl.Get(r.ctx, key, l))
		if got := l.Annotations[annotation]; got != capacity {
			t.Fatalf("while the capacity hangs the Lease's %s is %q, want the %q it carried", annotation, got, capacity)
		}
		if l.Spec.RenewTime.After(last) {
			renewals++
			last = l.Spec.RenewTime.Time
		}
	}
	// Each renewal waits one renew interval for the capacity, then writes.
	if renewals < 3 {
		t.Fatalf("the Lease was renewed %d times in 3 s while the capacity hung, want at least 3", renewals)
	}
}

// hangingCapacity is a provider whose capacity, while hang is set, answers only
// when its context ends, as an lvs killed at its deadline does.
type hangingCapacity struct {
	storage.Provider
	hang *atomic.Bool
}

func (h hangingCapacity) Capacity(ctx context.Context) (storage.Capacity, error) {
	if !h.hang.Load() {
		return h.Provider.Capacity(ctx)
	}
	<-ctx.Done()
	return storage.Capacity{}, &storage.Error{Op: "capacity", Kind: storage.ErrTimeout, Err: ctx.Err()}
}

// An agent stops within moments of its context's end however long a pool takes to
// open: a file pool's first open scans every loop device of the machine, one directory
// at a time in the process, seconds a scan on a loaded machine with thousands of them,
// and an agent whose Lease and collector waited for their pools to open outlived its
// 20 s grace (docs/operating.md, "Stopping an agent"). Here a new pool's open answers
// only when its context ends, as the file pool's does.
func TestAgentStopsWhileAPoolOpens(t *testing.T) {
	var hang atomic.Bool
	opening := make(chan string, 8)
	r := newRigWith(t, 1, localcluster.Options{Agent: func(c *agent.Config) {
		c.RenewInterval = 200 * time.Millisecond
		pools := c.Pools
		c.Pools = func(ctx context.Context, rsp *v1.ReplicatedStoragePool) (storage.Provider, error) {
			if !hang.Load() {
				return pools(ctx, rsp)
			}
			select {
			case opening <- rsp.Name:
			default:
			}
			<-ctx.Done()
			return nil, &storage.Error{Op: "configure", Pool: rsp.Name, Kind: storage.ErrTimeout, Err: ctx.Err()}
		}
	}})
	node := r.node(0).Name
	lease := &coordinationv1.Lease{}
	r.eventually("the pool's capacity on the Lease", time.Minute, func() string {
		if err := r.cl.Get(r.ctx, client.ObjectKey{Namespace: r.c.Namespace, Name: agent.LeaseName(node)}, lease); err != nil {
			return err.Error()
		}
		if lease.Annotations[v1.AnnotationPoolCapacityPrefix+r.pool()] == "" {
			return fmt.Sprintf("no capacity annotation: %v", lease.Annotations)
		}
		return ""
	})
	hang.Store(true)
	slow := "slow-" + r.pool()
	_, err := r.c.CreatePool(r.ctx, slow)
	r.must(err)
	t.Cleanup(func() {
		_ = r.cl.Delete(context.Background(), &v1.ReplicatedStoragePool{ObjectMeta: metav1.ObjectMeta{Name: slow}})
	})
	select {
	case <-opening:
	case <-time.After(time.Minute):
		t.Fatal("the agent did not open the new pool within a minute")
	}
	start := time.Now()
	if err := r.c.StopAgent(node); err != nil {
		t.Fatalf("stopping the agent while a pool opens: %v", err)
	}
	// Half the grace: what is left of the stop is the manager's own.
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the agent took %s to stop while a pool opened, want it to give the open up at once", took.Round(time.Millisecond))
	}
}

// A Lease write that fails must not cost the node its pools: the controller counts a
// node ready in a pool only while its Lease carries the pool's capacity annotation
// (docs/contract.md "Node facts and liveness"), and an agent that remembered the
// capacity as written although the write failed (an apiserver restart, a write timed
// out on a loaded machine) never wrote it again, so an Access replica on that node
// waited for good ("Node … is not ready in storage pool"). Here the write fails because
// the Lease is gone (deleted under the agent): the Lease the agent creates again must
// carry the capacity.
func TestLeaseCarriesCapacityAfterAFailedWrite(t *testing.T) {
	r := newRigWith(t, 1, localcluster.Options{Agent: func(c *agent.Config) { c.RenewInterval = 200 * time.Millisecond }})
	key := client.ObjectKey{Namespace: r.c.Namespace, Name: agent.LeaseName(r.node(0).Name)}
	capacity := func(l *coordinationv1.Lease) string {
		return l.Annotations[v1.AnnotationPoolCapacityPrefix+r.pool()]
	}
	r.eventually("the pool's capacity on the Lease", time.Minute, func() string {
		l := &coordinationv1.Lease{}
		if err := r.cl.Get(r.ctx, key, l); err != nil {
			return err.Error()
		}
		if capacity(l) == "" {
			return fmt.Sprintf("no capacity annotation: %v", l.Annotations)
		}
		return ""
	})
	old := &coordinationv1.Lease{}
	r.must(r.cl.Get(r.ctx, key, old))
	r.must(r.cl.Delete(r.ctx, old))
	r.eventually("the Lease created again, with the pool's capacity", time.Minute, func() string {
		l := &coordinationv1.Lease{}
		if err := r.cl.Get(r.ctx, key, l); err != nil {
			return err.Error()
		}
		if l.UID == old.UID {
			return "not deleted yet"
		}
		if capacity(l) == "" {
			return fmt.Sprintf("created again without the capacity of pool %s: %v", r.pool(), l.Annotations)
		}
		return ""
	})
}

// The agent announces on its Lease that it derives shared secrets, with its version
// beside the announcement, in every write of the Lease: the controller derives a new
// volume's secret only while every agent does, and an earlier agent that replaces this
// one keeps the annotation but rewrites the version (docs/install.md, "Upgrading").
// Here the announcement is taken off the Lease, as an earlier agent's Lease lacks it:
// the next renewal carries it again, with no write of its own.
func TestLeaseAnnouncesDerivedSharedSecrets(t *testing.T) {
	r := newRigWith(t, 1, localcluster.Options{Agent: func(c *agent.Config) { c.RenewInterval = 200 * time.Millisecond }})
	key := client.ObjectKey{Namespace: r.c.Namespace, Name: agent.LeaseName(r.node(0).Name)}
	announced := func(what string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{}
		r.eventually(what, time.Minute, func() string {
			if err := r.cl.Get(r.ctx, key, l); err != nil {
				return err.Error()
			}
			if !agentlease.Announces(l, v1.CapabilityDerivedSharedSecret) {
				return fmt.Sprintf("the Lease does not announce %s: %v", v1.CapabilityDerivedSharedSecret, l.Annotations)
			}
			return ""
		})
		return l
	}
	l := announced("the Lease announcing derived shared secrets")
	if v := l.Annotations[v1.AnnotationCapabilitiesAgentVersion]; v == "" || v != l.Annotations[v1.AnnotationAgentVersion] {
		t.Fatalf("the announcement's version %q, want the agent's %q", v, l.Annotations[v1.AnnotationAgentVersion])
	}
	r.must(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := &coordinationv1.Lease{}
		if err := r.cl.Get(r.ctx, key, l); err != nil {
			return err
		}
		delete(l.Annotations, v1.AnnotationCapabilities)
		delete(l.Annotations, v1.AnnotationCapabilitiesAgentVersion)
		l.Annotations[v1.AnnotationAgentVersion] = "v-earlier"
		return r.cl.Update(r.ctx, l)
	}))
	announced("the announcement written again at the next renewal")
}

// A connection DRBD left StandAlone is connected again once the cause is gone: DRBD
// does not retry it by itself, and the kernel runs the configuration the datamesh asks
// for, so only the agent's own retry (Config.StandAloneRetryInterval) reconnects it.
// Here the volume's shared secret changes while node 2 is cut off and its agent cannot
// apply anything: when the network heals, its connections fail authentication and
// both ends go StandAlone. Once node 2 applies the new secret, its own ends are tried
// again by its adjust; the ends of nodes 1 and 3, whose configuration has not changed
// since, must be tried again too.
func TestStandAloneConnectionIsConnectedAgain(t *testing.T) {
	r := newRig(t, 3, func(c *agent.Config) { c.StandAloneRetryInterval = time.Second })
	names := r.form3D()
	secret := func(name, value string) *v1.SharedSecretReference {
		r.must(r.cl.Create(r.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.c.Namespace, Name: name},
			Data: map[string][]byte{v1.SecretKeySharedSecret: []byte(value)}}))
		return &v1.SharedSecretReference{SecretName: name, Algorithm: "sha256"}
	}
	first, second := secret(r.rv+"-a", "first-secret-value"), secret(r.rv+"-b", "second-secret-value")
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.SharedSecret = first })
	r.confirmed(rev, v1.DiskStateUpToDate, names...)

	cut := r.node(1)
	r.c.Partition(cut.Name)
	cut.Sim.InjectFault("adjust", drbdsim.Fault{Err: errors.New("held back by the test")})
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.SharedSecret = second })
	r.confirmed(rev, "", names[0], names[2])
	r.c.Heal()
	// The cut node cannot adjust: its end of the connection to node 1 stays
	// StandAlone once an attempt has failed authentication.
	r.eventually("the cut node's connection to node 1 StandAlone after the heal (authentication fails)", time.Minute, func() string {
		st, err := cut.Sim.Status(r.ctx, r.rv)
		if err != nil || len(st) != 1 {
			return fmt.Sprintf("status of %s: %v %v", cut.Name, st, err)
		}
		for _, c := range st[0].Connections {
			if c.Name == r.node(0).Name && c.ConnectionState == "StandAlone" {
				return ""
			}
		}
		return fmt.Sprintf("%s: %+v", cut.Name, st[0].Connections)
	})

	cut.Sim.ClearFault("adjust")
	r.confirmed(rev, "", names...)
	r.eventually("every connection Connected again", time.Minute, func() string {
		for i := range 3 {
			st, err := r.node(i).Sim.Status(r.ctx, r.rv)
			if err != nil || len(st) != 1 {
				return fmt.Sprintf("status of %s: %v %v", r.node(i).Name, st, err)
			}
			for _, c := range st[0].Connections {
				if c.ConnectionState != "Connected" {
					return fmt.Sprintf("%s → %s: %s", r.node(i).Name, c.Name, c.ConnectionState)
				}
			}
		}
		return ""
	})
}
