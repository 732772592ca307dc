// Package contract is one behavioural test suite for drbd.Driver, written
// against the interface only, so that it runs on drbdsim now and on real
// DRBD 9 (three machines, the ExecDriver) later.
//
// It replays the scenarios of the real DRBD captures (package
// pkg/drbd/internal/captures, recorded on three machines: see its
// testdata/README.md): 01 up with Inconsistent disks, 02 forced primary and
// initial sync, 03 Primary with data, 04 failover to the diskless node, 05
// quorum loss and return. At each stage it compares what the driver
// reports (status, parsed by pkg/drbd) with what real DRBD reported in the
// capture for the same stage — roles, disk states, connection and
// replication states, quorum — and compares the sequence of state changes
// in the driver's events2 stream with the captured stream. Beyond the
// captures it checks that a returning replica resyncs only what changed.
// Where real DRBD's timing decides an order (a link used only at its next
// connect attempt, events still in flight), the suite waits for the states
// it needs, with a deadline, so that it runs unchanged on drbdsim and on
// real DRBD.
package contract

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// Resource is the resource name every scenario uses (as in the captures).
const Resource = "r0"

// Nodes: node1 and node2 diskful, node3 diskless, as in the captures.
var Nodes = []string{"node1", "node2", "node3"}

// Harness gives the suite three nodes and the means to disturb them.
type Harness interface {
	// Driver is the drbd.Driver of a node.
	Driver(node string) drbd.Driver
	// Resource is r0 as seen from node: CapturedResource with the node's
	// backing device, which must be BackingSize so that sizes match the
	// captures.
	Resource(node string) *drbd.Resource
	// Write and Read do IO through the DRBD device of node (O_DIRECT on
	// real DRBD). A write refused for lack of quorum must wrap syscall.EIO.
	Write(ctx context.Context, node string, off int64, data []byte) error
	Read(ctx context.Context, node string, off int64, n int) ([]byte, error)
	// Cut and Connect break and restore the network between two nodes.
	Cut(a, b string)
	Connect(a, b string)
	// Advance lets d pass: a simulator moves its clock, real DRBD sleeps.
	Advance(d time.Duration)
}

// AckChecker is optional: a harness that knows every acknowledged write
// (drbdsim) reports UpToDate replicas that lack one.
type AckChecker interface {
	LostAckedWrites(res string) []string
}

// Recorder is optional: a harness that implements it receives, once the
// suite has passed, every state change each node's events2 stream showed
// during the whole run, normalized as the suite compares them ("connection
// node2 connection:Connected", "call helper:disconnected"). drbdsim's
// test compares them with a recording made on real DRBD; a real-DRBD
// harness can save them as a new recording.
type Recorder interface {
	Record(node string, changes []string)
}

// Run runs the whole suite. Stages build on each other and stop at the
// first failing one.
func Run(t *testing.T, h Harness) {
	s := &suite{h: h, ctx: context.Background()}
	stages := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"01-up-inconsistent", s.stage01},
		{"02-initial-sync", s.stage02},
		{"03-primary-with-data", s.stage03},
		{"04-failover-to-diskless", s.stage04},
		{"05-quorum-loss", s.stage05},
		{"06-resync-only-what-changed", s.stage06},
	}
	for _, st := range stages {
		if !t.Run(st.name, st.fn) {
			t.Fatalf("stage %s failed; later stages depend on it", st.name)
		}
	}
	if rec, ok := h.(Recorder); ok {
		for i, w := range s.watchers {
			rec.Record(Nodes[i], w.since(0))
		}
	}
	for _, w := range s.watchers {
		w.stop()
	}
}

type suite struct {
	h        Harness
	ctx      context.Context
	watchers []*watcher
}

func (s *suite) must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// eventually lets time pass in 100 ms steps (up to 60 s) until cond holds.
func (s *suite) eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for range 600 {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		s.h.Advance(100 * time.Millisecond)
	}
	t.Fatalf("%s: not reached after 60s: %s", what, last)
}

func (s *suite) status(t *testing.T, node string) drbd.StatusResource {
	t.Helper()
	st, err := s.h.Driver(node).Status(s.ctx, Resource)
	s.must(t, err)
	if len(st) != 1 {
		t.Fatalf("%s: status returned %d resources, want 1", node, len(st))
	}
	return st[0]
}

// summary is what the suite compares between a driver and a capture: the
// state a person reads in `drbdadm status`, no counters.
func summary(r drbd.StatusResource) []string {
	out := []string{fmt.Sprintf("resource role:%s suspended:%t", r.Role, r.Suspended)}
	for _, d := range r.Devices {
		out = append(out, fmt.Sprintf("device disk:%s client:%t quorum:%t", d.DiskState, d.Client, d.Quorum))
	}
	conns := slices.Clone(r.Connections)
	sort.Slice(conns, func(i, j int) bool { return conns[i].PeerNodeID < conns[j].PeerNodeID })
	for _, c := range conns {
		out = append(out, fmt.Sprintf("connection %s connection:%s peer-role:%s", c.Name, c.ConnectionState, c.PeerRole))
		for _, p := range c.PeerDevices {
			out = append(out, fmt.Sprintf("peer-device %s replication:%s peer-disk:%s peer-client:%t",
				c.Name, p.ReplicationState, p.PeerDiskState, p.PeerClient))
		}
	}
	return out
}

func captureStatus(t *testing.T, path string) drbd.StatusResource {
	t.Helper()
	st, err := drbd.ParseStatusJSON(captures.Read(t, path))
	if err != nil || len(st) != 1 {
		t.Fatalf("capture %s: %v (%d resources)", path, err, len(st))
	}
	return st[0]
}

// captureEventsNow turns an `events2 --now` capture into the same summary
// as a status (for stages captured only that way).
func captureEventsNow(t *testing.T, path string) []string {
	t.Helper()
	var r drbd.StatusResource
	peerDevs := map[string]*drbd.StatusPeerDevice{}
	conns := map[string]*drbd.StatusConnection{}
	for _, line := range captures.Lines(t, path) {
		ev, err := drbd.ParseEvent(line)
		if err != nil {
			t.Fatalf("capture %s: %v", path, err)
		}
		get := func(k string) string { v, _ := ev.Get(k); return v }
		switch ev.Object {
		case drbd.ObjResource:
			r.Role = get("role")
			r.Suspended = get("suspended") != "no"
		case drbd.ObjDevice:
			r.Devices = append(r.Devices, drbd.StatusDevice{DiskState: get("disk"), Client: get("client") == "yes", Quorum: get("quorum") == "yes"})
		case drbd.ObjConnection:
			var id int
			fmt.Sscan(get("peer-node-id"), &id)
			conns[get("conn-name")] = &drbd.StatusConnection{PeerNodeID: id, Name: get("conn-name"), ConnectionState: get("connection"), PeerRole: get("role")}
		case drbd.ObjPeerDevice:
			peerDevs[get("conn-name")] = &drbd.StatusPeerDevice{ReplicationState: get("replication"), PeerDiskState: get("peer-disk"), PeerClient: get("peer-client") == "yes"}
		}
	}
	for name, c := range conns {
		if p := peerDevs[name]; p != nil {
			c.PeerDevices = []drbd.StatusPeerDevice{*p}
		}
		r.Connections = append(r.Connections, *c)
	}
	return summary(r)
}

// compare checks node's status against want, or against one of the
// alternatives (states real DRBD may equally be in at that point).
func (s *suite) compare(t *testing.T, node string, want []string, alternatives ...[]string) {
	t.Helper()
	got := summary(s.status(t, node))
	if slices.Equal(got, want) {
		return
	}
	for _, alt := range alternatives {
		if slices.Equal(got, alt) {
			return
		}
	}
	t.Errorf("%s differs from real DRBD:\n got: %s\nwant: %s", node, strings.Join(got, "\n      "), strings.Join(want, "\n      "))
}

func (s *suite) matches(node string, want []string) (bool, string) {
	st, err := s.h.Driver(node).Status(s.ctx, Resource)
	if err != nil || len(st) != 1 {
		return false, fmt.Sprintf("status: %v", err)
	}
	got := summary(st[0])
	if slices.Equal(got, want) {
		return true, ""
	}
	return false, strings.Join(got, "; ")
}

func (s *suite) checkAcked(t *testing.T) {
	t.Helper()
	if ac, ok := s.h.(AckChecker); ok {
		if lost := ac.LostAckedWrites(Resource); len(lost) > 0 {
			t.Errorf("acknowledged writes missing on UpToDate replicas: %v", lost)
		}
	}
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// Stage 01: create-md and up on all three: connected, diskful nodes
// Inconsistent, everyone quorate.
func (s *suite) stage01(t *testing.T) {
	for _, n := range Nodes {
		d := s.h.Driver(n)
		s.must(t, d.WriteConfig(s.ctx, s.h.Resource(n)))
		if s.h.Resource(n).Disk != nil {
			has, err := d.HasMetadata(s.ctx, Resource)
			s.must(t, err)
			if !has {
				s.must(t, d.CreateMetadata(s.ctx, Resource, 2))
			}
		}
	}
	for _, n := range Nodes {
		s.watchers = append(s.watchers, s.watch(t, n))
		s.must(t, s.h.Driver(n).Up(s.ctx, Resource))
	}
	for _, n := range Nodes {
		want := summary(captureStatus(t, "01-up-inconsistent/"+n+".status-json-verbose-statistics.json"))
		s.eventually(t, n+" connected and Inconsistent", func() (bool, string) { return s.matches(n, want) })
		s.compare(t, n, want)
	}
	// Promotion without UpToDate data anywhere is refused.
	err := s.h.Driver("node1").Primary(s.ctx, Resource, drbd.NoForce)
	if !errors.Is(err, drbd.ErrNoUpToDateData) {
		t.Errorf("primary without UpToDate data: got %v, want ErrNoUpToDateData", err)
	}
}

// Stage 02: primary --force on node1: UpToDate, node2 WFBitMapS then
// SyncSource, then UpToDate.
func (s *suite) stage02(t *testing.T) {
	w := s.watchers[0]
	mark := w.mark()
	s.must(t, s.h.Driver("node1").Primary(s.ctx, Resource, "initial sync of a new test resource"))
	// Right after the promotion node1 looks as in capture 02: Primary,
	// UpToDate, node2 still Inconsistent and WFBitMapS. On real DRBD the
	// status can equally come before the resync handshake has begun
	// (node2 still Established) or after the bitmap exchange (SyncSource):
	// the VM tier saw all three, with up to 600 ms from the promotion to
	// WFBitMapS. The order WFBitMapS, SyncSource, Established is checked on
	// node1's events2 below.
	captured := captureEventsNow(t, "02-initial-sync-node1.events2-now-statistics.txt")
	var alternatives [][]string
	for _, repl := range []string{"Established", "SyncSource"} {
		alt := slices.Clone(captured)
		for i, l := range alt {
			alt[i] = strings.Replace(l, "node2 replication:WFBitMapS", "node2 replication:"+repl, 1)
		}
		alternatives = append(alternatives, alt)
	}
	s.compare(t, "node1", captured, alternatives...)
	s.eventually(t, "node2 UpToDate after initial sync", func() (bool, string) {
		st := s.status(t, "node2")
		return st.Devices[0].DiskState == "UpToDate", summary(st)[1]
	})
	// node2 reporting UpToDate does not mean node1's stream has delivered
	// its side yet (on real DRBD its last events were still in flight 15
	// ms later): wait for the states, with a deadline.
	for _, want := range [][]string{
		{"resource role:Primary", "device disk:UpToDate", "peer-device node2 replication:WFBitMapS",
			"peer-device node2 replication:SyncSource", "peer-device node2 replication:Established"},
		{"peer-device node2 replication:SyncSource", "peer-device node2 peer-disk:UpToDate"},
	} {
		s.waitEvents(t, "node1", w, mark, want)
	}
	// node2's side, as in capture 02's node2 status: SyncTarget from a
	// Primary while it ran.
	s.waitEvents(t, "node2", s.watchers[1], 0, []string{"connection node1 role:Primary", "peer-device node1 replication:SyncTarget", "device disk:UpToDate"})
}

// waitEvents lets time pass (as eventually) until w's state changes since
// mark hold want in order; it fails the test at the deadline.
func (s *suite) waitEvents(t *testing.T, node string, w *watcher, mark int, want []string) {
	t.Helper()
	s.eventually(t, node+"'s events2 reach "+want[len(want)-1], func() (bool, string) {
		seq := w.since(mark)
		return subsequence(seq, want), fmt.Sprintf("want in order %q, got %q", want, seq)
	})
}

// Stage 03: node1 Primary writes 20 MiB; node2 UpToDate with the data, its
// device refusing to open.
func (s *suite) stage03(t *testing.T) {
	data := pattern(3, 20<<20)
	s.must(t, s.h.Write(s.ctx, "node1", 0, data))
	for _, n := range Nodes {
		want := summary(captureStatus(t, "03-primary-with-data/"+n+".status-json-verbose-statistics.json"))
		s.eventually(t, n+" as in capture 03", func() (bool, string) { return s.matches(n, want) })
	}
	got, err := s.h.Read(s.ctx, "node1", 5<<20, 4096)
	s.must(t, err)
	if string(got) != string(data[5<<20:5<<20+4096]) {
		t.Errorf("read back differs from what was written")
	}
	// With auto-promote no a Secondary's device does not open, read-only
	// either (drbd_open): the data is read on the Primary or not at all.
	if _, err := s.h.Read(s.ctx, "node2", 5<<20, 4096); !errors.Is(err, syscall.EMEDIUMTYPE) {
		t.Errorf("read through node2's device while Secondary: %v, want EMEDIUMTYPE (auto-promote no refuses the open)", err)
	}
	s.checkAcked(t)
}

// Stage 04: node1 demotes, the diskless node3 promotes, writes and reads
// through its peers, demotes.
func (s *suite) stage04(t *testing.T) {
	marks := s.marks()
	s.must(t, s.h.Driver("node1").Secondary(s.ctx, Resource))
	s.must(t, s.h.Driver("node3").Primary(s.ctx, Resource, drbd.NoForce))
	data := pattern(4, 1<<20)
	s.must(t, s.h.Write(s.ctx, "node3", 8<<20, data))
	got, err := s.h.Read(s.ctx, "node3", 8<<20, len(data))
	s.must(t, err)
	if string(got) != string(data) {
		t.Errorf("node3 read back differs from what it wrote")
	}
	s.checkAcked(t)
	s.must(t, s.h.Driver("node3").Secondary(s.ctx, Resource))
	s.h.Advance(100 * time.Millisecond)
	for i, n := range Nodes {
		want := captureStream(t, "04-failover-event-stream/"+n+".events2-timestamps-statistics-stream.txt")
		got := s.watchers[i].since(marks[i])
		t.Logf("%s: %d state changes, as captured: %q", n, len(got), got)
		if !sameStream(got, want) {
			t.Errorf("%s events2 state changes differ from real DRBD\n got: %q\nwant: %q", n, got, want)
		}
	}
}

// Stage 05: node1 Primary; node3 down; then node2's link cut: node1 loses
// quorum and a write fails with EIO; on reconnect quorum returns.
func (s *suite) stage05(t *testing.T) {
	mark := s.watchers[0].mark()
	s.must(t, s.h.Driver("node1").Primary(s.ctx, Resource, drbd.NoForce))
	s.must(t, s.h.Driver("node3").Down(s.ctx, Resource))
	s.eventually(t, "node1 sees node3 gone", func() (bool, string) {
		st := s.status(t, "node1")
		return st.Connections[1].ConnectionState == "Connecting" && st.Devices[0].Quorum, summary(st)[2]
	})
	s.must(t, s.h.Write(s.ctx, "node1", 0, pattern(5, 4096))) // write-ok-with-2-of-3
	s.h.Cut("node1", "node2")
	for _, n := range []string{"node1", "node2"} {
		want := summary(captureStatus(t, "05-quorum-loss/"+n+".status-json-verbose-statistics.json"))
		s.eventually(t, n+" isolated as in capture 05", func() (bool, string) { return s.matches(n, want) })
	}
	err := s.h.Write(s.ctx, "node1", 0, pattern(6, 4096))
	if !errors.Is(err, syscall.EIO) {
		t.Errorf("write without quorum: got %v, want EIO", err)
	}
	if err := s.h.Driver("node2").Primary(s.ctx, Resource, drbd.NoForce); !errors.Is(err, drbd.ErrNoQuorum) {
		t.Errorf("promotion of isolated node2: got %v, want ErrNoQuorum", err)
	}
	// DRBD uses a returning link only at its next connect attempt
	// (connect-int, 10 s by default): wait for node1 and node2 to be
	// connected again before node3 comes up, so that the order of events
	// is the captured one however the attempts fall.
	s.h.Connect("node1", "node2")
	s.eventually(t, "node1 and node2 connected again", func() (bool, string) {
		st := s.status(t, "node1")
		return st.Connections[0].ConnectionState == "Connected" && st.Devices[0].Quorum, strings.Join(summary(st), "; ")
	})
	s.must(t, s.h.Driver("node3").Up(s.ctx, Resource))
	s.eventually(t, "quorum back on node1", func() (bool, string) {
		st := s.status(t, "node1")
		ok := st.Devices[0].Quorum && st.Connections[0].ConnectionState == "Connected" && st.Connections[1].ConnectionState == "Connected"
		return ok, strings.Join(summary(st), "; ")
	})
	st := s.status(t, "node1")
	if oos := st.Connections[0].PeerDevices[0].OutOfSync; oos != 0 {
		t.Errorf("nothing was written while apart, yet %d KiB out of sync", oos)
	}
	want := captureStream(t, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt")
	got := s.watchers[0].since(mark)
	t.Logf("node1: %d state changes, as captured: %q", len(got), got)
	if !sameStream(got, want) {
		t.Errorf("node1 events2 state changes differ from real DRBD\n got: %q\nwant: %q", got, want)
	}
	s.must(t, s.h.Write(s.ctx, "node1", 0, pattern(7, 4096)))
	s.checkAcked(t)
}

// Stage 06 (beyond the captures): node2 is cut off while node1 keeps
// quorum through the tiebreaker; node1 writes 1 MiB; on reconnect node2
// resyncs about that 1 MiB, not the whole device.
func (s *suite) stage06(t *testing.T) {
	s.h.Cut("node1", "node2")
	s.h.Cut("node2", "node3")
	s.eventually(t, "node2 isolated", func() (bool, string) {
		st := s.status(t, "node1")
		return st.Connections[0].ConnectionState == "Connecting", summary(st)[2]
	})
	if st := s.status(t, "node1"); !st.Devices[0].Quorum {
		t.Fatalf("node1 should keep quorum through the tiebreaker: %v", summary(st))
	}
	s.must(t, s.h.Write(s.ctx, "node1", 32<<20, pattern(8, 1<<20)))
	mark := s.watchers[1].mark()
	s.h.Connect("node2", "node3")
	s.h.Connect("node1", "node2")
	s.eventually(t, "node2 resynced", func() (bool, string) {
		st := s.status(t, "node2")
		return st.Devices[0].DiskState == "UpToDate" && st.Connections[0].PeerDevices[0].ReplicationState == "Established", strings.Join(summary(st), "; ")
	})
	// As in stage 02: node2's status can say UpToDate before its stream has
	// delivered the change (the VM tier saw the stream end at
	// after-resync-target), so wait for the events too.
	s.waitEvents(t, "node2", s.watchers[1], mark, []string{"peer-device node1 replication:SyncTarget", "device disk:UpToDate"})
	if max := s.watchers[1].maxOutOfSync("node1", mark); max == 0 || max > 2<<10 {
		t.Errorf("node2 resynced %d KiB for 1024 KiB written while away", max)
	}
	s.checkAcked(t)
}

func (s *suite) marks() []int {
	out := make([]int, len(s.watchers))
	for i, w := range s.watchers {
		out[i] = w.mark()
	}
	return out
}

// sameStream compares two normalized event streams. DRBD emits helper
// calls and path changes from work it queues after the state change that
// causes them, so within a run of consecutive such entries their order
// varies on real DRBD (the VM tier saw stage 05's "path node2
// established:no" both before and after "call helper:quorum-lost"); such
// runs are compared as multisets, everything else in order.
func sameStream(got, want []string) bool {
	return slices.Equal(canonicalAsync(got), canonicalAsync(want))
}

func canonicalAsync(seq []string) []string {
	async := func(e string) bool {
		return strings.HasPrefix(e, "call helper:") || strings.HasPrefix(e, "path ")
	}
	out := slices.Clone(seq)
	for i := 0; i < len(out); {
		j := i
		for j < len(out) && async(out[j]) {
			j++
		}
		if j > i {
			slices.Sort(out[i:j])
			i = j
		} else {
			i++
		}
	}
	return out
}

// subsequence reports whether want appears in got in order (not
// necessarily adjacent).
func subsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}
