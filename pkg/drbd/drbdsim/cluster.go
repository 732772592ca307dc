package drbdsim

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"
)

// Options configure a Cluster.
type Options struct {
	// Dir holds the block devices' FUSE mount and DevicePath links.
	// Required when LoopDevices is set.
	Dir string
	// ResyncRate is how many bytes a resync moves per virtual second.
	// Default 100 MiB/s (about what the captures show).
	ResyncRate int64
	// BitmapExchange is how long the replication state stays WFBitMapS/T
	// before the resync starts. Default 1 ms of virtual time, so a status
	// taken right after the handshake shows WFBitMapS as in capture 02.
	BitmapExchange time.Duration
	// ConnectInt is DRBD's connect-int: while Connecting, each side tries
	// to connect once at once and then every ConnectInt, so a link that
	// comes back is used only at the next attempt. Default 10 s, DRBD's
	// default; tests may shorten it (SetConnectInt).
	ConnectInt time.Duration
	// Start is the virtual clock's start. Default 2026-11-22T00:00:00Z.
	Start time.Time
	// Seed makes generation UUIDs reproducible.
	Seed uint64
	// LoopDevices gives every Primary a real, replicated block device at
	// DevicePath (doc.go, "Block device"): a loop device over a file that
	// the cluster serves through FUSE. Needs root, /dev/loop-control and
	// /dev/fuse; call Close when done.
	LoopDevices bool
	// DeviceDir is the directory of a node's DevicePath links; nil means
	// <Dir>/dev/<node>. A sandbox whose nodes have a /dev of their own
	// points it there, with DeviceNodes.
	DeviceDir func(node string) string
	// DeviceNodes makes DevicePath a block device node of the loop device
	// (mknod, same device number) instead of a symlink to it: what a
	// process in a mount namespace with its own /dev, where the loop
	// device's name does not resolve, opens and mounts, as it would open
	// /dev/drbd<minor>.
	DeviceNodes bool
	// NodeMountInfo, when set, is the mountinfo file of a node's mount
	// namespace (/proc/<pid>/mountinfo of a process in it): a filesystem
	// mounted on a Primary's device there holds the device open, as the
	// kernel counts it, though this process does not see the mount.
	NodeMountInfo func(node string) string
	// DeviceWatchdog is how long a block device request may wait for the
	// cluster lock before the FUSE connection is aborted (every device then
	// fails IO with EIO; DeviceAborted says why). Default
	// DefaultDeviceWatchdog; negative disables it.
	DeviceWatchdog time.Duration
}

// Cluster is a set of simulated DRBD nodes, the network between them, and
// a virtual clock. It is safe for concurrent use.
type Cluster struct {
	mu   sync.Mutex
	cond *sync.Cond // broadcast after every settle: wakes suspended writers
	opts Options
	now  time.Time
	rng  *rand.Rand

	nodes map[string]*Node
	cut   map[link]bool
	// delay is the one-way latency of a slow link (SetLinkDelay).
	delay map[link]time.Duration
	// acked remembers, per resource, the content hash of every block whose
	// write was acknowledged to a writer: the promise DRBD makes.
	acked map[string]map[int64]uint64
	// afterLackingBatch, when set (by tests), runs between two batches of
	// the acknowledged-write check (lackingOn), with mu released.
	afterLackingBatch func()
	// setupHook, when set (by tests), runs in every promotion's device setup
	// just before losetup, without the lock: a kernel that makes losetup wait.
	setupHook func()
	// pending cluster-wide agreements (connects, role changes), applied
	// once the cluster has settled.
	pending []*resource
	// lostPeer: resources that lost a connection without a goodbye and
	// owe the cluster-wide state change that follows (lostPeerAgreement).
	lostPeer []*resource
	// devs serves the Primaries' block devices (LoopDevices), from the
	// first promotion on.
	devs *devices
	// twoWriters records, per resource, the moments two unconnected nodes
	// could both write it (writers.go).
	twoWriters map[string][]string
	// scope limits a settle to the resources of these names (nil: all).
	scope map[string]bool
	// wakes holds, per resource name, when the clock next changes
	// something of it (recordWakes); names at rest have no entry.
	wakes map[string]time.Time
	// detach lists the loop devices of devices torn down under the lock,
	// which unlock detaches once it has released it (device.go).
	detach []string
}

type link struct{ a, b string }

func mkLink(a, b string) link {
	if a > b {
		a, b = b, a
	}
	return link{a, b}
}

// NewCluster returns an empty cluster.
func NewCluster(opts Options) *Cluster {
	if opts.ResyncRate <= 0 {
		opts.ResyncRate = 100 << 20
	}
	if opts.BitmapExchange <= 0 {
		opts.BitmapExchange = time.Millisecond
	}
	if opts.ConnectInt <= 0 {
		opts.ConnectInt = 10 * time.Second
	}
	if opts.Start.IsZero() {
		opts.Start = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	}
	c := &Cluster{
		opts:  opts,
		now:   opts.Start,
		rng:   rand.New(rand.NewPCG(opts.Seed, 0x6d657368766f6c)),
		nodes: map[string]*Node{},
		cut:   map[link]bool{},
		delay: map[link]time.Duration{},
		acked: map[string]map[int64]uint64{},
		wakes: map[string]time.Time{},
	}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// Node returns the node with the given name, creating it on first use. The
// name is the DRBD host name ("on <name>"), which peers' configurations use.
func (c *Cluster) Node(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[name]
	if n == nil {
		n = &Node{c: c, name: name, configs: map[string]*resConfig{}, mds: map[string]*metadata{},
			res: map[string]*resource{}, faults: map[string]Fault{}, attachFaults: map[string]string{}}
		c.nodes[name] = n
	}
	return n
}

// Now is the virtual time.
func (c *Cluster) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the virtual clock by d, running time-based processes
// (bitmap exchange, resync progress) in steps of at most 100 ms so that a
// resync's progress is observable at the granularity tests care about.
// It takes the cluster lock for one step at a time: a step's resync copies
// blocks between backing files, and a long d (RunClock catching up after
// its goroutine waited for a CPU on a loaded machine) held the lock through
// every step's copying, so long that a device request waiting for it
// tripped the watchdog (docs/conformance-results.md).
func (c *Cluster) Advance(d time.Duration) {
	for d > 0 {
		step := min(d, 100*time.Millisecond)
		d -= step
		c.advanceStep(step)
	}
}

// advanceStep is one step of Advance, under the cluster lock.
func (c *Cluster) advanceStep(step time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(step)
	due := c.dueScope()
	if due == nil {
		return // nothing depends on the clock now: at rest
	}
	c.scope = due
	c.progressResyncs(step)
	c.settleScope(due)
}

// RunClock advances the virtual clock with the wall clock every tick until
// ctx is done: for the sandbox, where agents run in real time.
func (c *Cluster) RunClock(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.Advance(now.Sub(last))
			last = now
		}
	}
}

// SetResyncRate changes the resync speed (bytes per virtual second) of
// every running and future resync: "slow the resync".
func (c *Cluster) SetResyncRate(bytesPerSecond int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if bytesPerSecond > 0 {
		c.opts.ResyncRate = bytesPerSecond
	}
}

// SetConnectInt changes connect-int for every later connect attempt (the
// simulated network's reconnect delay; DRBD's default is 10 s).
func (c *Cluster) SetConnectInt(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.opts.ConnectInt = d
	}
}

// Partition cuts every link between a node of side and a node not in side
// (the rest of the cluster). Links inside side, and outside, are kept.
func (c *Cluster) Partition(side ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := map[string]bool{}
	for _, s := range side {
		in[s] = true
	}
	for a := range c.nodes {
		for b := range c.nodes {
			if a < b && in[a] != in[b] {
				c.cut[mkLink(a, b)] = true
			}
		}
	}
	c.settle()
}

// Cut cuts the link between a and b (both directions).
func (c *Cluster) Cut(a, b string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut[mkLink(a, b)] = true
	c.settle()
}

// Connect restores the link between a and b.
func (c *Cluster) Connect(a, b string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cut, mkLink(a, b))
	c.settle()
}

// Heal restores every link, and the full speed of every slow one.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.cut)
	clear(c.delay)
	c.settle()
}

// SetLinkDelay makes the link between a and b slow: every write-path request (a
// write, a zero-out, a flush) that a Primary replicates over it is acknowledged d
// later, as protocol C acknowledges a write only once every connected peer has it
// (docs/soak.md, "slow link"). d of 0 makes the link fast again. A delay shorter than
// DRBD's ping timeout leaves the connection up; a cut is Cut's business.
func (c *Cluster) SetLinkDelay(a, b string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d <= 0 {
		delete(c.delay, mkLink(a, b))
		return
	}
	c.delay[mkLink(a, b)] = d
}

// replicationDelay is how much later than its local completion r's write is
// acknowledged: the slowest link to a peer the write reached.
func (c *Cluster) replicationDelay(r *resource) time.Duration {
	var d time.Duration
	if len(c.delay) == 0 {
		return 0
	}
	for _, h := range c.holders(r) {
		if h != r {
			d = max(d, c.delay[mkLink(r.n.name, h.n.name)])
		}
	}
	return d
}

func (c *Cluster) linked(a, b string) bool { return !c.cut[mkLink(a, b)] }

// nodeNames in a stable order.
func (c *Cluster) nodeNames() []string {
	names := make([]string, 0, len(c.nodes))
	for n := range c.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// newUUID returns a fresh generation UUID. Bit 0 is DRBD's "primary" flag
// in real UUIDs; the simulator keeps it clear and never returns the
// reserved values 0 and 4 (UUID_JUST_CREATED).
func (c *Cluster) newUUID() uint64 {
	for {
		u := c.rng.Uint64() &^ 1
		if u != 0 && u != uuidJustCreated {
			return u
		}
	}
}

// LostAckedWrites reports every replica of res that could serve data —
// UpToDate and quorate — yet lacks an acknowledged write (a block whose
// content differs from the last acknowledged content). An empty result is
// the promise DRBD keeps with quorum.
//
// An isolated replica keeps calling itself UpToDate (DRBD cannot know
// better); it is excluded here while it has no quorum, because quorum is
// what stops it from serving. StaleUpToDate lists those.
func (c *Cluster) LostAckedWrites(res string) []string {
	return c.lacking(res, true)
}

// StaleUpToDate reports every replica that shows UpToDate but lacks an
// acknowledged write, quorate or not.
func (c *Cluster) StaleUpToDate(res string) []string {
	return c.lacking(res, false)
}

// lacking names, per replica in node-name order, the lowest acknowledged
// block it lacks. The blocks are checked in offset order, not map order,
// so that the same state always gives the same message (a test failure
// quotes it, and a rerun must show the same block).
//
// The blocks are read in batches of lackingBatch, each under the cluster
// lock and against the state of that moment (the replica's disk, quorum
// and the block's last acknowledged content are looked up again for each
// batch), and the lock is released between them: a device request waits
// for that lock, and reading every acknowledged block of every replica in
// one hold took over 30 s on a loaded machine, past the device watchdog,
// which then failed every device (docs/soak.md, Findings). What a batch
// reports lacking is lacking at that moment, so nothing is reported that
// was not so; a block acknowledged after the check began is left to the
// next check.
func (c *Cluster) lacking(res string, quorateOnly bool) []string {
	c.mu.Lock()
	blocks := slices.Sorted(maps.Keys(c.acked[res]))
	names := c.nodeNames()
	c.mu.Unlock()
	var out []string
	for _, name := range names {
		if msg := c.lackingOn(res, name, blocks, quorateOnly); msg != "" {
			out = append(out, msg)
		}
	}
	return out
}

// lackingBatch is how many blocks lacking reads in one hold of the lock.
const lackingBatch = 256

// lackingOn is lacking for one node's replica: the message for the lowest
// of blocks it lacks, or "".
func (c *Cluster) lackingOn(res, name string, blocks []int64, quorateOnly bool) string {
	for start := 0; start < len(blocks); start += lackingBatch {
		if start > 0 && c.afterLackingBatch != nil {
			c.afterLackingBatch()
		}
		msg, done := c.lackingBatchOn(res, name, blocks[start:min(start+lackingBatch, len(blocks))], quorateOnly)
		if done {
			return msg
		}
	}
	return ""
}

// lackingBatchOn checks one batch under the lock; done says that the check
// of this replica ended (a block lacks, or the replica does not count now).
func (c *Cluster) lackingBatchOn(res, name string, blocks []int64, quorateOnly bool) (msg string, done bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[name]
	if n == nil {
		return "", true
	}
	r := n.res[res]
	if r == nil || !r.attached() || r.disk != DiskUpToDate || (quorateOnly && !r.quorate) {
		return "", true
	}
	acked := c.acked[res]
	// The backing device is opened once for the batch (claim.go).
	f, err := r.claim.openData()
	if err != nil {
		return fmt.Sprintf("%s: its backing device cannot be opened to check the acknowledged writes: %v", name, err), true
	}
	defer f.Close()
	for _, blk := range blocks {
		want, ok := acked[blk]
		if !ok {
			continue
		}
		got, err := hashBlock(f, blk)
		if err != nil {
			return fmt.Sprintf("%s: block %d (offset %d) cannot be read to check an acknowledged write: %v", name, blk, blk*blockSize, err), true
		}
		if got != want {
			return fmt.Sprintf("%s: block %d (offset %d) lacks an acknowledged write", name, blk, blk*blockSize), true
		}
	}
	return "", false
}

// Diverged reports whether a connection of res is StandAlone because of a
// split brain, and the message DRBD logged.
func (c *Cluster) Diverged(res string) (bool, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var msgs []string
	for _, name := range c.nodeNames() {
		r := c.nodes[name].res[res]
		if r == nil {
			continue
		}
		for _, k := range r.sortedConns() {
			if k.splitBrain {
				msgs = append(msgs, fmt.Sprintf("%s: %s: %s", name, k.peer.Name, k.standAloneMsg))
			}
		}
	}
	return len(msgs) > 0, msgs
}
