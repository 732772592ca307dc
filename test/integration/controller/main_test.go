// Package controller_test runs meshvol's controller on a real kube-apiserver and etcd
// (internal/testenv) with the manager in the test process. No agent runs: where a test needs
// replicas to report, it writes their status itself, the way docs/contract.md says an
// agent does (field manager meshvol-agent, server-side apply of its own fields); the
// agent issue's integration suite replaces that with real agents.
package controller_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

var env *testenv.Env

// logs holds every line the controller logged, for the test that greps them for the
// shared secret.
var logs struct {
	sync.Mutex
	bytes.Buffer
}

func TestMain(m *testing.M) {
	logger := logr.New(funcr.New(func(prefix, args string) {
		logs.Lock()
		fmt.Fprintln(&logs.Buffer, prefix, args)
		logs.Unlock()
	}, funcr.Options{Verbosity: 10}).GetSink())
	os.Exit(testenv.Main(m, &env, testenv.Options{Logger: logger}))
}

// writes records the controller's apiserver writes.
type writes struct {
	mu  sync.Mutex
	all []controller.Write
}

func (w *writes) add(x controller.Write) {
	w.mu.Lock()
	w.all = append(w.all, x)
	w.mu.Unlock()
}

// since returns the writes after mark whose object name starts with one of prefixes.
func (w *writes) since(mark int, prefixes ...string) []controller.Write {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []controller.Write
	for _, x := range w.all[mark:] {
		for _, p := range prefixes {
			if strings.HasPrefix(x.Name, p) || strings.HasPrefix(x.Name, "drbd-"+p) {
				out = append(out, x)
				break
			}
		}
	}
	return out
}

func (w *writes) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.all)
}

// settled waits until no write to an object named with one of prefixes has been made
// for quiet, and returns a mark taken then. A test that waits for a status by reading
// the apiserver sees it before the controller's cache does; until the cache catches up,
// a reconcile compares against the older status and applies the same one again. A
// window that must hold no write starts once those have passed.
func (w *writes) settled(t testing.TB, quiet time.Duration, prefixes ...string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	mark := w.mark()
	for last := time.Now(); time.Since(last) < quiet; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("writes to %v did not stop for %v in 30 s: %v", prefixes, quiet, w.since(mark, prefixes...))
		}
		cur := w.mark()
		if len(w.since(mark, prefixes...)) > 0 {
			mark, last = cur, time.Now()
		}
	}
	return mark
}

func summarizeWrites(ws []controller.Write) string {
	counts := map[string]int{}
	for _, x := range ws {
		counts[x.Kind+" "+x.Verb]++
	}
	var parts []string
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d (%s)", len(ws), strings.Join(parts, ", "))
}

// cluster is one test's world: its namespace, its nodes (named <prefix>-<n>), a file
// pool selecting them by a label of its own, and a running controller.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	c      client.Client
	ns     string
	prefix string
	pool   string
	writes *writes
	stop   func()
	grace  time.Duration
	// cache is the running controller's informer cache, for a test that must know the
	// controller has seen a write before it goes on.
	cache client.Reader

	mu      sync.Mutex
	renew   map[string]bool // node → its fake agent renews the Lease
	algs    map[string]string
	leaseSz int32
	taint   bool
	portMax int32
}

type nodeSpec struct {
	name, zone string
	freeGi     int64
}

func newCluster(t *testing.T, nodes ...nodeSpec) *cluster {
	t.Helper()
	return newClusterWith(t, clusterOptions{}, nodes...)
}

// clusterOptions are what a test may change of its cluster.
type clusterOptions struct {
	// taint runs the controller with --taint-lost-nodes.
	taint bool
	// leaseSeconds is the agent Leases' duration (default 2 s, renewed every 500 ms).
	// A test that counts writes over a window while every agent stays live takes a
	// longer one, so that a renewal late under load does not change a node's
	// liveness, and with it the status, inside the window.
	leaseSeconds int32
	// portMax is the top of the controller's --port-range (from 7000; default 7999).
	portMax int32
}

func newClusterWith(t *testing.T, o clusterOptions, nodes ...nodeSpec) *cluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	name := testenv.Name(t)
	cl := &cluster{t: t, ctx: ctx, c: env.Client, ns: name, prefix: "t" + strings.TrimLeft(name[len(name)-10:], "-"), pool: name, writes: &writes{},
		grace: 2 * time.Second, renew: map[string]bool{}, algs: map[string]string{}, leaseSz: 2, taint: o.taint, portMax: 7999}
	if o.portMax > 0 {
		cl.portMax = o.portMax
	}
	if o.leaseSeconds > 0 {
		cl.leaseSz = o.leaseSeconds
	}
	t.Cleanup(cancel)
	must(t, cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cl.ns}}))
	rsp := &v1.ReplicatedStoragePool{ObjectMeta: metav1.ObjectMeta{Name: cl.pool}, Spec: v1.ReplicatedStoragePoolSpec{
		Type: v1.PoolTypeFile, File: &v1.FilePool{Directory: "/var/lib/meshvol"},
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"test": cl.prefix}}}}
	must(t, cl.c.Create(ctx, rsp))
	for _, n := range nodes {
		cl.addNode(n)
	}
	go cl.renewLoop()
	cl.start()
	return cl
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (cl *cluster) node(short string) string { return cl.prefix + "-" + short }

// addNode creates the Node and its agent Lease with the facts an agent reports.
func (cl *cluster) addNode(n nodeSpec) {
	name := cl.node(n.name)
	labels := map[string]string{"test": cl.prefix}
	if n.zone != "" {
		labels[v1.LabelZone] = n.zone
	}
	must(cl.t, cl.c.Create(cl.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}))
	now := metav1.NewMicroTime(time.Now())
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: v1.AgentLeasePrefix + name, Namespace: cl.ns,
		Annotations: map[string]string{
			v1.AnnotationAddresses:                    "10.0.0.1",
			v1.AnnotationHMACAlgorithms:               "sha256,sha1,md5",
			v1.AnnotationPoolCapacityPrefix + cl.pool: capacityAnnotation(n.freeGi),
			// An agent of this version: it derives shared secrets and tears down
			// with its volume, and says so.
			v1.AnnotationAgentVersion:             agentVersion,
			v1.AnnotationCapabilities:             v1.CapabilityDerivedSharedSecret + "," + v1.CapabilityTearDownWithVolume,
			v1.AnnotationCapabilitiesAgentVersion: agentVersion,
		}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &cl.leaseSz, RenewTime: &now, AcquireTime: &now}}
	must(cl.t, cl.c.Create(cl.ctx, l))
	cl.mu.Lock()
	cl.renew[name] = true
	cl.mu.Unlock()
	cl.t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
}

// agentVersion is the version the fake agents' Leases carry.
const agentVersion = "v-test"

// capacityAnnotation is the pool capacity annotation's value for a node with freeGi GiB free.
func capacityAnnotation(freeGi int64) string {
	return v1.PoolCapacity{Total: 1000 << 30, Free: freeGi << 30}.String()
}

// renewLoop renews the Leases of the live nodes every 500 ms, as agents do (their
// period is 3 s for a 10 s Lease; the test's Leases last 2 s).
func (cl *cluster) renewLoop() {
	for {
		select {
		case <-cl.ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		cl.mu.Lock()
		var live []string
		for n, ok := range cl.renew {
			if ok {
				live = append(live, n)
			}
		}
		cl.mu.Unlock()
		for _, n := range live {
			l := &coordinationv1.Lease{}
			if err := cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: v1.AgentLeasePrefix + n}, l); err != nil {
				continue
			}
			now := metav1.NewMicroTime(time.Now())
			l.Spec.RenewTime = &now
			_ = cl.c.Update(cl.ctx, l)
		}
	}
}

// editLease changes the annotations of node's agent Lease, as its agent does. The
// cluster's renewer updates the same Leases every few hundred milliseconds, so an update
// may meet a newer resourceVersion: it reads again and retries, as an agent does.
func (cl *cluster) editLease(node string, edit func(annotations map[string]string)) {
	must(cl.t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l := &coordinationv1.Lease{}
		if err := cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: v1.AgentLeasePrefix + cl.node(node)}, l); err != nil {
			return err
		}
		edit(l.Annotations)
		return cl.c.Update(cl.ctx, l)
	}))
}

func (cl *cluster) setRenew(node string, on bool) {
	cl.mu.Lock()
	cl.renew[cl.node(node)] = on
	cl.mu.Unlock()
}

// start runs a controller for the cluster's namespace until the test ends or stop.
func (cl *cluster) start() {
	mgr, err := controller.NewManager(env.Config, controller.Options{
		Namespace: cl.ns, AgentGracePeriod: cl.grace, OnWrite: cl.writes.add, Workers: 2,
		PortMin: 7000, PortMax: cl.portMax, TaintLostNodes: cl.taint,
	}, controller.ManagerOptions{Scheme: env.Scheme})
	must(cl.t, err)
	cl.cache = mgr.GetCache()
	ctx, cancel := context.WithCancel(cl.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	cl.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				cl.t.Errorf("manager: %v", err)
			}
		})
	}
	cl.t.Cleanup(cl.stop)
}

func (cl *cluster) class(name string, ftt, gmdr int32, topo v1.Topology) string {
	rsc := &v1.ReplicatedStorageClass{ObjectMeta: metav1.ObjectMeta{Name: cl.prefix + "-" + name}, Spec: v1.ReplicatedStorageClassSpec{
		StoragePool: cl.pool, FailuresToTolerate: &ftt, GuaranteedMinimumDataRedundancy: &gmdr, Topology: topo}}
	must(cl.t, cl.c.Create(cl.ctx, rsc))
	return rsc.Name
}

func (cl *cluster) volume(name, class, size string) *v1.ReplicatedVolume {
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: cl.prefix + "-" + name}, Spec: v1.ReplicatedVolumeSpec{
		Size: resource.MustParse(size), ReplicatedStorageClassName: class}}
	must(cl.t, cl.c.Create(cl.ctx, rv))
	return rv
}

func (cl *cluster) rv(name string) *v1.ReplicatedVolume {
	rv := &v1.ReplicatedVolume{}
	if err := cl.c.Get(cl.ctx, types.NamespacedName{Name: name}, rv); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		cl.t.Fatal(err)
	}
	return rv
}

func (cl *cluster) rvrs(rv string) []v1.ReplicatedVolumeReplica {
	var list v1.ReplicatedVolumeReplicaList
	must(cl.t, cl.c.List(cl.ctx, &list, client.MatchingLabels{v1.LabelVolume: rv}))
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

// eventually polls cond until it holds or 30 s pass.
func (cl *cluster) eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

// agentStatus writes an RVR's status as its agent would: server-side apply with field
// manager meshvol-agent of the fields the agent owns.
func (cl *cluster) agentStatus(rvr string, st map[string]any) {
	u := &unstructured.Unstructured{Object: map[string]any{"status": st}}
	u.SetGroupVersionKind(v1.SchemeGroupVersion.WithKind("ReplicatedVolumeReplica"))
	u.SetName(rvr)
	must(cl.t, cl.c.Status().Patch(cl.ctx, u, client.Apply, client.FieldOwner(v1.FieldManagerAgent), client.ForceOwnership))
}

// agentConfirm makes every replica of rv report revision rev, its addresses, and disk
// state UpToDate (Diskful) or Diskless, connected to every peer.
func (cl *cluster) agentConfirm(rv string, rev int64, extra func(r *v1.ReplicatedVolumeReplica, st map[string]any)) {
	rvrs := cl.rvrs(rv)
	for i := range rvrs {
		r := &rvrs[i]
		if r.DeletionTimestamp != nil {
			continue
		}
		disk := "Diskless"
		if r.Spec.Type == v1.ReplicaTypeDiskful {
			disk = "UpToDate"
		}
		peers := []any{}
		for j := range rvrs {
			if j != i {
				peers = append(peers, map[string]any{"name": rvrs[j].Name, "connectionState": "Connected"})
			}
		}
		q := true
		st := map[string]any{
			"addresses": []any{"10.0.0." + fmt.Sprint(i+1)}, "datameshRevision": rev, "diskState": disk, "role": "Secondary",
			"quorum": q, "devicePath": "/dev/drbd-sim/" + r.Name, "peers": peers,
		}
		if extra != nil {
			extra(r, st)
		}
		cl.agentStatus(r.Name, st)
	}
}

// agentReleaseDeleted does what live agents do for replicas that are deleted and out of
// the datamesh, or of a volume that goes — deleted, nothing attached, no Attach or
// Detach in flight (docs/contract.md, "Deleting a volume") — deleted yet or, for an
// agent that announces CapabilityTearDownWithVolume, not: take DRBD down (nothing to do
// here) and remove their finalizer. A dead node's agent does nothing.
func (cl *cluster) agentReleaseDeleted(rv string) {
	cur := cl.rv(rv)
	goes := cur != nil && detachedDeleting(cur)
	for _, r := range cl.rvrs(rv) {
		if r.Spec.ReplicatedVolumeName != rv || !slices.Contains(r.Finalizers, v1.FinalizerAgent) {
			continue // an agent reads a replica's volume from its spec, not from a label
		}
		cl.mu.Lock()
		alive := cl.renew[r.Spec.NodeName]
		cl.mu.Unlock()
		if !alive {
			continue
		}
		if r.DeletionTimestamp == nil && !(goes && cl.announces(r.Spec.NodeName, v1.CapabilityTearDownWithVolume)) {
			continue
		}
		if cur != nil && slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == r.Name }) && !goes {
			continue
		}
		cl.releaseAgentFinalizer(r)
	}
}

// releaseAgentFinalizer removes the agent's finalizer from r, as an agent does.
func (cl *cluster) releaseAgentFinalizer(r v1.ReplicatedVolumeReplica) {
	p := r.DeepCopy()
	p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == v1.FinalizerAgent })
	if err := cl.c.Patch(cl.ctx, p, client.MergeFromWithOptions(&r, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		cl.t.Fatal(err)
	}
}

// announces: the agent Lease of node (its full name) announces capability.
func (cl *cluster) announces(node, capability string) bool {
	l := &coordinationv1.Lease{}
	if err := cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: v1.AgentLeasePrefix + node}, l); err != nil {
		return false
	}
	return agentlease.Announces(l, capability)
}

// detachedDeleting: rv is being deleted with no member attached and no Attach or Detach
// in flight, as the agents judge it (pkg/agent volumeGoes).
func detachedDeleting(rv *v1.ReplicatedVolume) bool {
	if rv.DeletionTimestamp == nil || slices.ContainsFunc(rv.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Attached }) {
		return false
	}
	return !slices.ContainsFunc(rv.Status.DatameshTransitions, func(t v1.DatameshTransition) bool {
		return t.Type == v1.TransitionAttach || t.Type == v1.TransitionDetach || t.Type == v1.TransitionForceDetach
	})
}

func cond(conds []metav1.Condition, t string) string {
	c := meta.FindStatusCondition(conds, t)
	if c == nil {
		return "<none>"
	}
	return string(c.Status) + "/" + c.Reason + ": " + c.Message
}

func phaseOf(rv *v1.ReplicatedVolume) string {
	if rv == nil {
		return "<gone>"
	}
	return string(rv.Status.Phase) + " (" + cond(rv.Status.Conditions, v1.ConditionReady) + ")"
}
