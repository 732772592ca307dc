package soak_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

const (
	nodeCount  = 5
	maxVolumes = 3
	volSize    = 64 << 20
	maxSize    = 160 << 20
	// attachWait bounds how long a step waits for an attachment; one that takes
	// longer stays requested and a later "settle" step mounts it.
	attachWait = 20 * time.Second
	// leaseDuration is the controllers' leader-election Lease: controller-runtime's
	// default, as `meshvol controller --leader-elect` runs, so a killed leader's
	// successor takes over as late as in production.
	leaseDuration = 15 * time.Second
	// maxLinkDelay bounds a slow link's one-way delay: below DRBD's default ping
	// timeout (0.5 s), so the link slows writes without dropping the connection.
	maxLinkDelay = 400 * time.Millisecond
)

// layout is a protection a Manual volume can ask for.
type layout struct {
	name      string
	ftt, gmdr int32
}

var layouts = []layout{{"1D", 0, 0}, {"2D", 0, 1}, {"2D+1TB", 1, 0}, {"3D", 1, 1}}

// vol is the test's record of one volume: what it asked for, where it is attached,
// the workload on it and every write the workload had acknowledged.
type vol struct {
	name      string
	layout    layout
	size      int64
	node      string // the node of its RVA, "" when none is requested
	formatted bool
	sess      *session
	acked     map[int]int64 // slot → last acknowledged sequence number
	nextSeq   int64
	// newerAck: when a session started after one of the volume's sessions was
	// isolated first acknowledged a write (the majority side wrote); zero until
	// then. Guarded by world.mu.
	newerAck time.Time
	// isolatedOnce: one of its sessions was isolated (guarded by world.mu).
	isolatedOnce bool
}

// session is a mounted filesystem and a writer on it.
type session struct {
	node, dev, mnt string
	w              *writer
	// isolated: when its node was cut off from every peer and from the control
	// plane while the session ran on (isolateWriter); zero otherwise. Guarded by
	// world.mu.
	isolated time.Time
}

// staleAck is a write that a session acknowledged after its node was isolated.
type staleAck struct {
	vol, node string
	slot      int
	seq       int64
	at        time.Time
}

// world is one seed's run.
type world struct {
	t     *testing.T
	ctx   context.Context
	c     *localcluster.Cluster
	rnd   *rand.Rand
	seed  uint64
	pool  string
	dir   string
	start time.Time

	mu      sync.Mutex // guards vols' acked maps and stats.acked (writer goroutines)
	vols    []*vol
	deleted []string
	nextVol int

	crashed      map[string]bool
	agentStopped map[string]bool
	partitioned  []string
	// stale are the sessions left running behind an isolation (isolateWriter)
	// until the network heals; staleAcks what they acknowledged after it (guarded
	// by mu).
	stale       []*session
	staleAcks   []staleAck
	slowLinks   bool
	failedDisks map[string]bool // volume/node

	history []string
	stats   stats

	// exits are the controllers that returned on their own and were restarted
	// (superviseControllers), until the seed's goroutine records them (noteExits).
	exitMu sync.Mutex
	exits  []controllerExit
}

// controllerExit is one restart of a controller whose run returned on its own.
type controllerExit struct {
	at  time.Duration // since the seed began
	why string
}

// replay is the command that runs this seed (or this reproduction) again.
func (w *world) replay() string {
	if w.seed == 0 {
		return fmt.Sprintf("go test ./test/soak/ -run '^%s$' -v", w.t.Name())
	}
	return fmt.Sprintf("go test ./test/soak/ -run TestSoak -soak.seed=%d -soak.seeds=1 -soak.duration=%s -v", w.seed, *flagDuration)
}

// step records one step of the history, with the time since the seed began.
func (w *world) step(format string, args ...any) {
	line := fmt.Sprintf("%7.2fs %s", time.Since(w.start).Seconds(), fmt.Sprintf(format, args...))
	w.history = append(w.history, line)
}

// superviseControllers restarts, within a second, a controller whose run returned on
// its own — a leader whose Lease renewal failed (a loaded machine, an apiserver
// restart) exits, as `meshvol controller` does — as Kubernetes restarts the
// container, so the seed runs on as production would. The returned func stops it.
func (w *world) superviseControllers() (stop func()) {
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, err := range w.c.RestartExitedControllers() {
				w.exitMu.Lock()
				w.exits = append(w.exits, controllerExit{time.Since(w.start), err.Error()})
				w.exitMu.Unlock()
			}
		}
	}()
	return func() { cancel(); <-done }
}

// noteExits adds the controller restarts superviseControllers made to the history,
// one line for a run of restarts for the same reason (a controller that cannot reach
// the apiserver exits again every second until it can), and to the figures.
func (w *world) noteExits() {
	w.exitMu.Lock()
	exits := w.exits
	w.exits = nil
	w.exitMu.Unlock()
	for i := 0; i < len(exits); {
		j := i + 1
		for j < len(exits) && exits[j].why == exits[i].why {
			j++
		}
		line := fmt.Sprintf("%7.2fs controller exited (%s): restarted", exits[i].at.Seconds(), exits[i].why)
		if j-i > 1 {
			line += fmt.Sprintf(", %d times until %.2fs", j-i, exits[j-1].at.Seconds())
		}
		w.history = append(w.history, line)
		for range j - i {
			w.stats.count("controller exit restarted")
		}
		i = j
	}
}

// fail stops the seed with the history and the command that replays it.
func (w *world) fail(format string, args ...any) {
	w.t.Helper()
	w.noteExits()
	w.t.Fatalf("%s: %s\nreplay: %s\nhistory:\n  %s\nstate:\n%s",
		w.t.Name(), fmt.Sprintf(format, args...), w.replay(), strings.Join(w.history, "\n  "), w.dump())
}

// openSeedLog returns the logger of the controller and the agents: a file called name
// in -soak.logdir, closed when t ends, or none without that flag. It becomes the
// running seed's log (seedLog), which controller-runtime's lines go to.
func openSeedLog(t *testing.T, name string) logr.Logger {
	if *flagLogDir == "" {
		return logr.Discard()
	}
	f, err := os.Create(filepath.Join(*flagLogDir, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var mu sync.Mutex
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		fmt.Fprintln(f, time.Now().Format("15:04:05.000"), prefix, args)
		mu.Unlock()
	}, funcr.Options{Verbosity: 1})
	seedLog.Store(&log)
	return log
}

// runSeed runs one seed for d and adds its figures to total, whether it passes or not.
func runSeed(t *testing.T, seed uint64, d time.Duration, total *stats) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := openSeedLog(t, fmt.Sprintf("soak-seed-%d.log", seed))
	defer seedLog.Store(nil)
	c, err := localcluster.Start(ctx, localcluster.Options{
		Nodes: nodeCount, NamePrefix: fmt.Sprintf("s%d", seed), LoopDevices: true, Log: log,
		Controller:         localcluster.ElectedController(controller.Options{AgentGracePeriod: 3 * time.Second}, leaseDuration),
		ControllerReplicas: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, c: c, seed: seed, rnd: rand.New(rand.NewPCG(seed, 0x736f616b)),
		pool: "soak", dir: t.TempDir(), start: time.Now(),
		crashed: map[string]bool{}, agentStopped: map[string]bool{}, failedDisks: map[string]bool{}}
	t.Cleanup(func() {
		w.stopAllSessions()
		if err := c.Stop(); err != nil {
			t.Errorf("seed %d: stopping the cluster: %v", seed, err)
		}
	})
	t.Cleanup(w.superviseControllers()) // stops before the cluster (cleanups run last first)
	if _, err := c.CreatePool(ctx, w.pool); err != nil {
		t.Fatal(err)
	}
	w.step("seed %d: %d nodes, pool %s", seed, nodeCount, w.pool)
	defer func() {
		w.noteExits()
		w.mu.Lock() // writers may still run when the seed failed
		w.stats.seeds, w.stats.minutes = 1, d.Minutes()
		s := w.stats
		w.mu.Unlock()
		t.Logf("seed %d: %s", seed, s.String())
		total.add(s)
		if l := seedLog.Load(); l != nil {
			l.Info("soak history", "seed", seed, "steps", "\n"+strings.Join(w.history, "\n"))
		}
	}()
	for time.Since(w.start) < d {
		w.randomStep()
		w.noteExits()
		w.checkNow()
		time.Sleep(time.Duration(w.rnd.IntN(400)) * time.Millisecond)
	}
	w.heal()
	w.checkEnd()
}

// randomStep picks the next operation or fault by the seed's generator; the choice
// depends only on the generator and the test's own record, so the same seed asks for
// the same kinds of steps (their outcomes depend on timing).
func (w *world) randomStep() {
	switch k := w.rnd.IntN(100); {
	case k < 12:
		w.create()
	case k < 26:
		w.attach()
	case k < 32:
		w.detach()
	case k < 40:
		w.move()
	case k < 45:
		w.expand()
	case k < 51:
		w.protect()
	case k < 55:
		w.deleteOne()
	case k < 62:
		w.settle()
	case k < 68:
		w.crash()
	case k < 74:
		w.restart()
	case k < 76:
		w.partition()
	case k < 79:
		w.isolateWriter()
	case k < 84:
		w.healNet()
	case k < 88:
		w.stopAgent()
	case k < 90:
		w.restartAgent()
	case k < 92:
		w.restartController()
	case k < 94:
		w.killLeader()
	case k < 96:
		w.slowLink()
	case k < 97:
		w.restartAPIServer()
	default:
		w.failDisk()
	}
}

func (w *world) pick(n int) int { return w.rnd.IntN(n) }

func (w *world) nodeNames() []string {
	var out []string
	for _, n := range w.c.Nodes {
		out = append(out, n.Name)
	}
	return out
}

// upNodes are the nodes that run and whose agent runs.
func (w *world) upNodes() []string {
	var out []string
	for _, n := range w.nodeNames() {
		if !w.crashed[n] && !w.agentStopped[n] {
			out = append(out, n)
		}
	}
	return out
}

func (w *world) volsWhere(pred func(v *vol) bool) []*vol {
	var out []*vol
	for _, v := range w.vols {
		if pred(v) {
			out = append(out, v)
		}
	}
	return out
}

// ---- operations ----

func (w *world) create() {
	if len(w.vols) >= maxVolumes {
		return
	}
	l := layouts[1+w.pick(len(layouts)-1)]
	if w.pick(8) == 0 {
		l = layouts[0]
	}
	w.createLayout(l)
}

// createLayout creates a Manual volume of layout l.
func (w *world) createLayout(l layout) *vol {
	w.nextVol++
	v := &vol{name: fmt.Sprintf("s%d-v%d", w.seed, w.nextVol), layout: l, size: volSize, acked: map[int]int64{}}
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: v.name}, Spec: v1.ReplicatedVolumeSpec{
		Size:              *resource.NewQuantity(v.size, resource.BinarySI),
		ConfigurationMode: v1.ConfigurationModeManual,
		ManualConfiguration: &v1.ReplicatedVolumeConfiguration{StoragePool: w.pool,
			FailuresToTolerate: l.ftt, GuaranteedMinimumDataRedundancy: l.gmdr, Topology: v1.TopologyIgnored},
		MaxAttachments: 1,
	}}
	if err := w.c.Client.Create(w.ctx, rv); err != nil {
		w.fail("create %s: %v", v.name, err)
	}
	w.vols = append(w.vols, v)
	w.stats.count("op create")
	w.step("create %s %s", v.name, l.name)
	return v
}

func rvaName(v *vol, node string) string { return v1.AttachmentName(v.name, node) }

func (w *world) attach() {
	vs := w.volsWhere(func(v *vol) bool { return v.node == "" })
	up := w.upNodes()
	if len(vs) == 0 || len(up) == 0 {
		return
	}
	v := vs[w.pick(len(vs))]
	w.attachOn(v, up[w.pick(len(up))])
}

func (w *world) attachOn(v *vol, node string) {
	rva := &v1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: rvaName(v, node), Labels: map[string]string{v1.LabelVolume: v.name, v1.LabelNode: node}},
		Spec:       v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: v.name, NodeName: node},
	}
	if err := w.c.Client.Create(w.ctx, rva); err != nil && !apierrors.IsAlreadyExists(err) {
		w.fail("attach %s on %s: %v", v.name, node, err)
	}
	v.node = node
	w.stats.count("op attach")
	w.step("attach %s on %s: %s", v.name, node, w.activate(v, attachWait))
}

// activate waits (up to d) for v's attachment, mounts its filesystem (formatting it
// the first time), checks every acknowledged write and starts a writer. It returns
// what happened, for the history.
func (w *world) activate(v *vol, d time.Duration) string {
	if v.sess != nil || v.node == "" {
		return "already active"
	}
	var rva v1.ReplicatedVolumeAttachment
	deadline := time.Now().Add(d)
	for {
		err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: rvaName(v, v.node)}, &rva)
		if err == nil && rva.Status.Phase == v1.AttachmentAttached && rva.Status.DevicePath != "" && w.role(v.name, v.node) == "Primary" {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("pending (phase %q, %s)", rva.Status.Phase, attachedMessage(&rva))
		}
		time.Sleep(100 * time.Millisecond)
	}
	dev := rva.Status.DevicePath
	if !v.formatted {
		if out, err := runFor(2*time.Minute, "mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev); err != nil {
			return fmt.Sprintf("mkfs failed (%v: %s)", err, out)
		}
		v.formatted = true
	}
	mnt, err := os.MkdirTemp(w.dir, v.name+"-")
	if err != nil {
		w.fail("%v", err)
	}
	if out, err := runFor(30*time.Second, "mount", dev, mnt); err != nil {
		_ = os.Remove(mnt)
		return fmt.Sprintf("mount failed (%v: %s)", err, out)
	}
	n := w.verify(v, mnt)
	v.nextSeq += 1 << 20 // a new session's numbers are above every earlier one
	sess := &session{node: v.node, dev: dev, mnt: mnt}
	wr, err := startWriter(mnt, v.nextSeq, func(slot int, seq int64) {
		w.mu.Lock()
		defer w.mu.Unlock()
		if !sess.isolated.IsZero() {
			// Behind the cut: its writes are not the volume's any more (the
			// majority side moved on), so they are not what must read back;
			// one acknowledged after the majority side wrote is two writers.
			w.staleAcks = append(w.staleAcks, staleAck{v.name, sess.node, slot, seq, time.Now()})
			w.stats.count("stale ack")
			return
		}
		if v.isolatedOnce && v.newerAck.IsZero() {
			v.newerAck = time.Now()
		}
		v.acked[slot] = seq
		w.stats.acked++
	})
	if err != nil {
		w.fail("starting a writer: %v", err)
	}
	sess.w = wr
	v.sess = sess
	return fmt.Sprintf("attached, mounted, %d acknowledged writes read back", n)
}

func attachedMessage(rva *v1.ReplicatedVolumeAttachment) string {
	for _, c := range rva.Status.Conditions {
		if c.Type == v1.ConditionAttached {
			return c.Reason + ": " + c.Message
		}
	}
	return "no Attached condition"
}

// verify reads every slot that had an acknowledged write back from the mounted
// filesystem: each must hold its last acknowledged sequence number or a later one.
func (w *world) verify(v *vol, mnt string) int {
	w.mu.Lock()
	acked := make(map[int]int64, len(v.acked))
	for k, s := range v.acked {
		acked[k] = s
	}
	w.mu.Unlock()
	for slot, want := range acked {
		got, err := readSlot(filepath.Join(mnt, fmt.Sprintf("s%d", slot)))
		if err != nil {
			w.fail("%s: acknowledged write seq %d of slot %d: %v", v.name, want, slot, err)
		}
		if got < want {
			w.fail("%s: slot %d holds seq %d, but seq %d was acknowledged: an acknowledged write is lost", v.name, slot, got, want)
		}
		if got > v.nextSeq {
			v.nextSeq = got
		}
	}
	w.stats.checked += int64(len(acked))
	return len(acked)
}

// deactivate stops v's writer and unmounts its filesystem (lazily when the device no
// longer answers: a crashed node's, or one whose IO is suspended).
func (w *world) deactivate(v *vol) string {
	s := v.sess
	if s == nil {
		return "no session"
	}
	v.sess = nil
	return w.endSession(s, 4)
}

// endSession stops s's writer and unmounts its filesystem, trying a plain unmount
// tries times before a lazy one.
func (w *world) endSession(s *session, tries int) string {
	what := "writer stopped"
	if s.w.exited() {
		what = "writer had stopped: " + s.w.lastError()
	} else if !s.w.stop(10 * time.Second) {
		what = "writer abandoned (blocked in the kernel)"
	}
	// A plain unmount, retried: a lazy one would leave the filesystem alive on its
	// loop device, out of anyone's reach, until its IO can complete.
	var err error
	for try := 0; try < tries; try++ {
		if _, err = runFor(20*time.Second, "umount", s.mnt); err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		_, _ = runFor(10*time.Second, "umount", "-l", s.mnt)
		what += ", unmounted lazily"
	}
	_ = os.Remove(s.mnt)
	return what
}

func (w *world) stopAllSessions() {
	for _, v := range w.vols {
		w.deactivate(v)
	}
	w.endStale()
}

// endStale ends the sessions left behind isolations: once the cut heals, the node's
// kubelet kills the old pod and unmounts its volume. A writer still blocked in the
// kernel is abandoned and its filesystem unmounted lazily after one try.
func (w *world) endStale() {
	for _, s := range w.stale {
		w.step("  stale session on %s: %s", s.node, w.endSession(s, 1))
	}
	w.stale = nil
}

func (w *world) detach() {
	vs := w.volsWhere(func(v *vol) bool { return v.node != "" })
	if len(vs) == 0 {
		return
	}
	v := vs[w.pick(len(vs))]
	w.stats.count("op detach")
	from := v.node
	w.step("detach %s from %s: %s", v.name, from, w.detachVol(v))
}

// detachVol ends the session and deletes the RVA, waiting for it to go.
func (w *world) detachVol(v *vol) string {
	what := w.deactivate(v)
	name := rvaName(v, v.node)
	v.node = ""
	if err := w.c.Client.Delete(w.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
		w.fail("detach: %v", err)
	}
	deadline := time.Now().Add(attachWait)
	for time.Now().Before(deadline) {
		if apierrors.IsNotFound(w.c.Client.Get(w.ctx, client.ObjectKey{Name: name}, &v1.ReplicatedVolumeAttachment{})) {
			return what + "; detached"
		}
		time.Sleep(100 * time.Millisecond)
	}
	return what + "; RVA still being detached"
}

func (w *world) move() {
	vs := w.volsWhere(func(v *vol) bool { return v.node != "" })
	if len(vs) == 0 {
		return
	}
	v := vs[w.pick(len(vs))]
	up := slices.DeleteFunc(w.upNodes(), func(n string) bool { return n == v.node })
	if len(up) == 0 {
		return
	}
	to := up[w.pick(len(up))]
	w.stats.count("op move")
	from := v.node
	w.step("move %s from %s to %s: %s", v.name, from, to, w.detachVol(v))
	w.attachOn(v, to)
}

// updateRV applies change to the volume, retrying on conflicts.
func (w *world) updateRV(name string, change func(rv *v1.ReplicatedVolume)) error {
	for {
		rv := &v1.ReplicatedVolume{}
		if err := w.c.Client.Get(w.ctx, client.ObjectKey{Name: name}, rv); err != nil {
			return err
		}
		change(rv)
		err := w.c.Client.Update(w.ctx, rv)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

func (w *world) expand() {
	vs := w.volsWhere(func(v *vol) bool { return v.size < maxSize })
	if len(vs) == 0 {
		return
	}
	v := vs[w.pick(len(vs))]
	v.size += 16 << 20
	if err := w.updateRV(v.name, func(rv *v1.ReplicatedVolume) { rv.Spec.Size = *resource.NewQuantity(v.size, resource.BinarySI) }); err != nil {
		w.fail("expand %s: %v", v.name, err)
	}
	w.stats.count("op expand")
	w.step("expand %s to %d MiB", v.name, v.size>>20)
}

func (w *world) protect() {
	if len(w.vols) == 0 {
		return
	}
	v := w.vols[w.pick(len(w.vols))]
	l := layouts[w.pick(len(layouts))]
	if l == v.layout {
		return
	}
	w.setLayout(v, l)
}

// setLayout changes v's protection to l.
func (w *world) setLayout(v *vol, l layout) {
	err := w.updateRV(v.name, func(rv *v1.ReplicatedVolume) {
		rv.Spec.ManualConfiguration.FailuresToTolerate = l.ftt
		rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = l.gmdr
	})
	if err != nil {
		w.fail("protection of %s: %v", v.name, err)
	}
	w.stats.count("op protection")
	w.step("protection of %s: %s → %s", v.name, v.layout.name, l.name)
	v.layout = l
}

func (w *world) deleteOne() {
	if len(w.vols) == 0 {
		return
	}
	i := w.pick(len(w.vols))
	v := w.vols[i]
	what := "not attached"
	if v.node != "" {
		what = w.detachVol(v)
	}
	if err := w.c.Client.Delete(w.ctx, &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: v.name}}); err != nil && !apierrors.IsNotFound(err) {
		w.fail("delete %s: %v", v.name, err)
	}
	w.vols = slices.Delete(w.vols, i, i+1)
	w.deleted = append(w.deleted, v.name)
	w.stats.count("op delete")
	w.step("delete %s (%s)", v.name, what)
}

// settle mounts the attachments that completed after their step gave up waiting, and
// restarts the sessions whose writer stopped (its node crashed, its disk failed).
func (w *world) settle() {
	w.c.StartController() // one that exited (its Lease lost under load) comes back
	for _, v := range w.vols {
		if v.sess != nil && v.sess.w.exited() {
			node := v.sess.node
			w.step("session of %s on %s ended: %s", v.name, node, w.deactivate(v))
		}
		if v.node != "" && v.sess == nil && !w.crashed[v.node] {
			w.step("settle %s on %s: %s", v.name, v.node, w.activate(v, 3*time.Second))
		}
	}
}

// ---- faults ----

func (w *world) crash() {
	up := slices.DeleteFunc(w.nodeNames(), func(n string) bool { return w.crashed[n] })
	if len(up) < nodeCount-1 || len(up) == 0 {
		return // one node down at a time
	}
	n := up[w.pick(len(up))]
	for _, v := range w.vols {
		if v.sess != nil && v.sess.node == n {
			// The machine is gone: its writer and mount go with it. The writer
			// sees EIO from here on; what it had acknowledged must survive.
			defer func(v *vol) { w.step("  session of %s on %s: %s", v.name, n, w.deactivate(v)) }(v)
		}
	}
	if err := w.c.CrashNode(n); err != nil {
		w.step("crash %s: %v", n, err)
	}
	w.crashed[n] = true
	delete(w.agentStopped, n)
	w.stats.count("fault crash")
	w.step("crash %s", n)
}

func (w *world) restart() {
	var down []string
	for _, n := range w.nodeNames() {
		if w.crashed[n] {
			down = append(down, n)
		}
	}
	if len(down) == 0 {
		return
	}
	n := down[w.pick(len(down))]
	behind := w.pick(3) == 0
	if behind {
		// The lost node comes back behind a partition: it runs what its kernel ran
		// and its agent reaches the control plane, but none of its peers.
		w.c.Partition(n)
		w.partitioned = append(w.partitioned, n)
	}
	if err := w.c.RestartNode(n); err != nil {
		w.step("restart %s: %v", n, err)
	}
	delete(w.crashed, n)
	if behind {
		w.stats.count("fault restart-behind-partition")
		w.step("restart %s behind a partition", n)
		return
	}
	w.stats.count("fault restart")
	w.step("restart %s", n)
}

func (w *world) partition() {
	names := w.nodeNames()
	w.rnd.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	side := names[:1+w.pick(2)]
	w.c.Partition(side...)
	w.partitioned = append(w.partitioned, side...)
	w.stats.count("fault partition")
	w.step("partition %v from the rest", side)
}

func (w *world) healNet() {
	if len(w.partitioned) == 0 && !w.slowLinks {
		return
	}
	w.c.Heal()
	w.partitioned, w.slowLinks = nil, false
	w.stats.count("fault heal")
	w.step("heal the network")
	w.endIsolations()
}

// endIsolations brings the isolated nodes back once the network heals: the node's
// control-plane link returns with it (its agent runs again) and the stale sessions
// end.
func (w *world) endIsolations() {
	for _, s := range w.stale {
		if !w.crashed[s.node] && w.agentStopped[s.node] {
			if err := w.c.RestartAgent(s.node); err != nil {
				w.step("restart agent %s: %v", s.node, err)
			}
			delete(w.agentStopped, s.node)
		}
	}
	w.endStale()
}

// isolateWriter cuts the node of a running workload off from every DRBD peer and
// from the control plane at once, while the node, its mounted filesystem and its
// writer run on (a whole node behind a network partition, not a crash). The volume is
// then moved to a node on the majority side, where a new workload writes while the
// partition lasts; the old one stays behind the cut. It must acknowledge nothing once
// the majority side has written (checkStale): its IO is suspended or fails without
// quorum, and when the network heals its DRBD must not rejoin as a writer
// (docs/drbd-quorum.md, the stale Primary). Healing the network brings the node's
// agent back and ends the old workload, as its kubelet would.
func (w *world) isolateWriter() {
	vs := w.volsWhere(func(v *vol) bool { return v.sess != nil && !w.agentStopped[v.sess.node] })
	if len(vs) == 0 || len(w.stale) > 0 {
		return // one isolation at a time
	}
	v := vs[w.pick(len(vs))]
	to := slices.DeleteFunc(w.upNodes(), func(n string) bool { return n == v.sess.node || slices.Contains(w.partitioned, n) })
	if len(to) == 0 {
		return
	}
	w.isolateAndMove(v, to[w.pick(len(to))])
}

// isolateAndMove isolates the node of v's running session (isolateWriter) and moves
// v to dest.
func (w *world) isolateAndMove(v *vol, dest string) {
	s := v.sess
	w.c.Partition(s.node)
	w.partitioned = append(w.partitioned, s.node)
	if err := w.c.StopAgent(s.node); err != nil {
		w.step("control-plane cut of %s: %v", s.node, err)
	}
	w.agentStopped[s.node] = true
	w.leaveBehindCut(v)
	w.stats.count("fault isolate-writer")
	w.step("isolate %s (peers and control plane; the writer of %s runs on behind the cut)", s.node, v.name)
	w.stats.count("op move")
	w.step("move %s from isolated %s to %s: %s", v.name, s.node, dest, w.detachVol(v))
	w.attachOn(v, dest)
	// The node's other workloads are behind the same cut. Kubernetes force-deletes
	// every pod of a node declared lost (the out-of-service taint), so their
	// attachments go as well, and the kubelet ends those pods once the node is back
	// (endStale). Left attached, a workload would hold its force-removed replica's
	// device for good (docs/contract.md, "Node that is gone": never forced).
	for _, u := range w.vols {
		if u == v || u.sess == nil || u.sess.node != s.node {
			continue
		}
		w.leaveBehindCut(u)
		w.step("  %s on isolated %s, its pod force-deleted: %s", u.name, s.node, w.detachVol(u))
	}
}

// leaveBehindCut leaves v's workload running behind a cut as a stale session: the
// volume has no session any more, and the session's writes from now on are checked
// as an isolated workload's (endStale ends it once the node is back).
func (w *world) leaveBehindCut(v *vol) {
	s := v.sess
	w.mu.Lock()
	s.isolated = time.Now()
	v.isolatedOnce, v.newerAck = true, time.Time{}
	w.mu.Unlock()
	v.sess = nil
	w.stale = append(w.stale, s)
}

// stopAgent cuts a node from the control plane while its DRBD keeps its peers: the
// agent stops (no Lease renewal, no reports), the kernel runs on.
func (w *world) stopAgent() {
	up := w.upNodes()
	if len(up) < nodeCount-1 {
		return
	}
	n := up[w.pick(len(up))]
	if err := w.c.StopAgent(n); err != nil {
		w.step("control-plane cut of %s: %v", n, err)
	}
	w.agentStopped[n] = true
	w.stats.count("fault control-plane-cut")
	w.step("control-plane cut of %s (agent stopped, DRBD runs)", n)
}

func (w *world) restartAgent() {
	var cands []string
	for _, n := range w.nodeNames() {
		if !w.crashed[n] {
			cands = append(cands, n)
		}
	}
	if len(cands) == 0 {
		return
	}
	n := cands[w.pick(len(cands))]
	if err := w.c.RestartAgent(n); err != nil {
		w.step("restart agent %s: %v", n, err)
	}
	was := w.agentStopped[n]
	delete(w.agentStopped, n)
	w.stats.count("fault agent-restart")
	w.step("restart agent of %s (was cut: %v)", n, was)
}

func (w *world) restartController() {
	if err := w.c.StopController(); err != nil {
		w.step("stop controller: %v", err)
	}
	time.Sleep(time.Duration(w.pick(1500)) * time.Millisecond)
	w.c.StartController()
	w.stats.count("fault controller-restart")
	w.step("restart the controller")
}

// killLeader crashes the controller that leads; the other one takes over once the
// leader's Lease expires, and a new standby starts in the dead one's place.
func (w *world) killLeader() {
	err := w.c.KillLeader()
	w.stats.count("fault leader-kill")
	w.step("kill the leading controller (%v)", err)
}

// slowLink slows the link between two nodes: every write replicated over it is
// acknowledged up to maxLinkDelay later. Healing the network makes it fast again.
func (w *world) slowLink() {
	names := w.nodeNames()
	w.rnd.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	d := time.Duration(50+w.pick(int(maxLinkDelay/time.Millisecond)-50)) * time.Millisecond
	w.c.Sim.SetLinkDelay(names[0], names[1], d)
	w.slowLinks = true
	w.stats.count("fault slow-link")
	w.step("slow link %s–%s: %s", names[0], names[1], d)
}

// restartAPIServer stops the kube-apiserver for up to 3 s and starts it again over the
// same etcd: every watch of the controllers and agents breaks and must resume.
func (w *world) restartAPIServer() {
	down := time.Duration(w.pick(3000)) * time.Millisecond
	err := w.c.Env.RestartAPIServer(down)
	w.stats.count("fault apiserver-restart")
	w.step("restart the apiserver (down %s): %v", down, err)
	if err != nil {
		w.fail("the apiserver did not come back: %v", err)
	}
}

func (w *world) failDisk() {
	if len(w.vols) == 0 || len(w.failedDisks) > 0 {
		return // one failed disk per seed at a time
	}
	v := w.vols[w.pick(len(w.vols))]
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := w.c.Client.List(w.ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: v.name}); err != nil {
		w.fail("%v", err)
	}
	var on []string
	for _, r := range rvrs.Items {
		if r.Spec.Type == v1.ReplicaTypeDiskful && !w.crashed[r.Spec.NodeName] {
			on = append(on, r.Spec.NodeName)
		}
	}
	if len(on) == 0 {
		return
	}
	slices.Sort(on)
	n := on[w.pick(len(on))]
	err := w.c.FailDisk(n, v.name)
	w.failedDisks[v.name+"/"+n] = true
	w.stats.count("fault disk-failure")
	w.step("fail the disk of %s on %s (%v)", v.name, n, err)
}

func (w *world) role(volume, node string) string {
	st, err := w.c.Node(node).Sim.Status(w.ctx, volume)
	if err != nil || len(st) != 1 {
		return "not running"
	}
	return st[0].Role
}

// runFor runs a command with a deadline and returns its combined output. A command
// still running at the deadline is killed and left behind: one blocked in the kernel
// on a device whose IO is suspended (D state) cannot die until the IO completes, and
// waiting for it would hold the whole seed up.
func runFor(d time.Duration, name string, args ...string) (string, error) {
	var out strings.Builder
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return strings.TrimSpace(out.String()), err
	case <-t.C:
		_ = cmd.Process.Kill()
		return "", fmt.Errorf("%s did not finish within %s (killed, left behind if blocked in the kernel)", name, d)
	}
}
