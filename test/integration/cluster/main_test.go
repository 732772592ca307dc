// Package cluster_test is the integration suite of the controller and the node
// agents together: one in-process cluster (internal/localcluster: a real
// kube-apiserver and etcd, the controller, nine agents over three zones on
// drbdsim and file pools on loop devices) shared by every scenario. Each
// scenario creates its own volumes, leaves the nodes as it found them, and
// checks DRBD on the simulated nodes themselves, not only what status says.
package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

var (
	env *testenv.Env
	lc  *localcluster.Cluster
	// dir holds the cluster's pools and drbdsim's files, on a tmpfs of the
	// suite's own: a file pool reports the free space of its file system, so
	// on a shared disk every other process's writes would change the pools'
	// status and TestWritesPerOperation's steady minute would count them.
	dir string
)

const pool = "pool"

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("SKIP: the cluster's file pools need loop devices (root)")
		return 0
	}
	var err error
	if dir, err = os.MkdirTemp("", "meshvol-cluster-suite-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16g,mode=0755"); err != nil {
		fmt.Fprintln(os.Stderr, "tmpfs for the cluster's files:", err)
		return 1
	}
	if err := os.Mkdir(filepath.Join(dir, "cluster"), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = unix.Unmount(dir, 0)
		return 1
	}
	// TestZZStop stops the cluster as a test of its own (a leftover then
	// fails a test); a selection of tests without it stops it here.
	code := testenv.Main(m, &env, testenv.Options{AfterTests: func() error {
		if lc == nil {
			return nil
		}
		err := lc.Stop()
		lc = nil
		return err
	}})
	if err := unix.Unmount(dir, 0); err != nil {
		// Detach it anyway so no mount outlives the suite, and fail: what
		// still holds it (a loop device, a FUSE device) is a leftover.
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		fmt.Fprintln(os.Stderr, "unmount the cluster's tmpfs (something still holds it):", err)
		return 1
	}
	return code
}

// cluster starts the shared cluster on first use (testenv.Main owns the
// control plane; TestZZStop in zz_test.go, the last file, stops the cluster).
func cluster(t *testing.T) *localcluster.Cluster {
	t.Helper()
	if lc != nil {
		return lc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var err error
	var log logr.Logger
	if path := os.Getenv("MESHVOL_SUITE_LOG"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		log = funcr.New(func(prefix, args string) { fmt.Fprintln(f, time.Now().Format("15:04:05.000"), prefix, args) }, funcr.Options{Verbosity: 1})
	}
	lc, err = localcluster.Start(ctx, localcluster.Options{
		// A directory inside the tmpfs, not its mount point: the cluster
		// counts any mount under its Dir as left behind.
		Env: env, Nodes: 9, Zones: 3, Log: log, Dir: filepath.Join(dir, "cluster"),
		// A Primary's device is a real loop device, as in the sandbox, so a
		// scenario can mount a file system on it as NodeStage does.
		LoopDevices: true,
		Controller:  localcluster.Controller(controller.Options{AgentGracePeriod: 3 * time.Second, DeleteLostPods: true}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lc.CreatePool(ctx, pool); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return lc
}

// rig is one scenario's handle on the shared cluster.
type rig struct {
	t   *testing.T
	ctx context.Context
	c   *localcluster.Cluster
	cl  client.Client
}

func newRig(t *testing.T) *rig {
	c := cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return &rig{t: t, ctx: ctx, c: c, cl: c.Client}
}

func (r *rig) must(err error) {
	r.t.Helper()
	if err != nil {
		r.t.Fatal(err)
	}
}

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

// class returns (creating once) a storage class for the layout and topology.
func (r *rig) class(ftt, gmdr int32, topo v1.Topology) string {
	name := strings.ToLower(fmt.Sprintf("f%dg%d-%s", ftt, gmdr, topo))
	if _, err := r.c.CreateClass(r.ctx, name, pool, ftt, gmdr, topo); err != nil && !apierrors.IsAlreadyExists(err) {
		r.t.Fatal(err)
	}
	return name
}

// volume creates an RV of the class.
func (r *rig) volume(name, class string, maxAttach int32) *v1.ReplicatedVolume {
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ReplicatedVolumeSpec{
		Size:                       resource.MustParse("64Mi"),
		ConfigurationMode:          v1.ConfigurationModeAuto,
		ReplicatedStorageClassName: class,
		MaxAttachments:             maxAttach,
	}}
	r.must(r.cl.Create(r.ctx, rv))
	return rv
}

func (r *rig) rv(name string) *v1.ReplicatedVolume {
	r.t.Helper()
	o := &v1.ReplicatedVolume{}
	r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: name}, o))
	return o
}

func (r *rig) rvrs(volume string) []v1.ReplicatedVolumeReplica {
	var list v1.ReplicatedVolumeReplicaList
	r.must(r.cl.List(r.ctx, &list, client.MatchingLabels{v1.LabelVolume: volume}))
	return list.Items
}

func phase(rv *v1.ReplicatedVolume) string {
	msg := ""
	for _, c := range rv.Status.Conditions {
		if c.Type == "Ready" {
			msg = c.Message
		}
	}
	return fmt.Sprintf("phase %s (%s), layout %s, revision %d, transitions %d", rv.Status.Phase, msg, rv.Status.Layout, rv.Status.DatameshRevision, len(rv.Status.DatameshTransitions))
}

// ready waits for phase Ready and returns the volume.
func (r *rig) ready(name string, d time.Duration) *v1.ReplicatedVolume {
	r.t.Helper()
	var cur *v1.ReplicatedVolume
	r.eventually(name+" Ready", d, func() string {
		cur = r.rv(name)
		if cur.Status.Phase == v1.VolumePhaseReady && len(cur.Status.DatameshTransitions) == 0 {
			return ""
		}
		return phase(cur)
	})
	return cur
}

// formed creates a volume of the layout (topology Ignored, one attachment at most) and
// returns it once Ready.
func (r *rig) formed(name string, l layoutCase) *v1.ReplicatedVolume {
	r.t.Helper()
	r.volume(name, r.class(l.ftt, l.gmdr, v1.TopologyIgnored), 1)
	return r.ready(name, 2*time.Minute)
}

// consistent fails the test when drbdsim saw an acknowledged write of the volume
// lost or its replicas' data diverge (split brain).
func (r *rig) consistent(vol string) {
	r.t.Helper()
	if lost := r.c.Sim.LostAckedWrites(vol); len(lost) > 0 {
		r.t.Fatalf("acknowledged writes lost: %v", lost)
	}
	if ok, msgs := r.c.Sim.Diverged(vol); ok {
		r.t.Fatalf("split brain: %v", msgs)
	}
}

// deleteVolume deletes an RV and waits until it and everything of it is gone.
func (r *rig) deleteVolume(name string) {
	r.t.Helper()
	err := r.cl.Delete(r.ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsNotFound(err) {
		r.t.Fatal(err)
	}
	r.gone(name)
}

// gone waits until nothing of the volume is left anywhere: no RV, RVR, RVA
// or Secret, no DRBD resource on any node, no backing file.
func (r *rig) gone(name string) {
	r.t.Helper()
	r.eventually(name+" gone", 2*time.Minute, func() string {
		cur := &v1.ReplicatedVolume{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: name}, cur); !apierrors.IsNotFound(err) {
			return "RV still exists: " + phase(cur)
		}
		if n := len(r.rvrs(name)); n > 0 {
			return fmt.Sprintf("%d RVRs left", n)
		}
		var rvas v1.ReplicatedVolumeAttachmentList
		r.must(r.cl.List(r.ctx, &rvas, client.MatchingLabels{v1.LabelVolume: name}))
		if len(rvas.Items) > 0 {
			return fmt.Sprintf("%d RVAs left", len(rvas.Items))
		}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Namespace: r.c.Namespace, Name: "drbd-" + name}, &corev1.Secret{}); err == nil {
			return "Secret left"
		}
		for _, n := range r.c.Nodes {
			res, err := n.Resources(r.ctx)
			if err != nil {
				continue // a crashed node runs nothing
			}
			for _, x := range res {
				if x == name {
					return "DRBD resource left on " + n.Name
				}
			}
			for _, f := range n.Files() {
				if strings.Contains(f, "/"+name+"-") {
					return "backing file left: " + f
				}
			}
		}
		return ""
	})
}
