package drbdsim

import (
	"context"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// kv is one "key:value" field of an events2 line.
type kv struct{ k, v string }

// object is the events2 view of one DRBD object, its fields in the order
// drbdsetup prints them, split by how change lines report them:
//
//	state: each printed when it changed (resource, connection);
//	group: all printed when any changed (device: backing_dev disk client
//	       quorum; peer-device: replication peer-disk peer-client);
//	tail:  printed whenever the line is (resource: may_promote
//	       promotion_score);
//	stats: --statistics counters, printed on every device/peer-device line;
//	extra: only in exists/create lines and with --full (connection:
//	       ap-in-flight rs-in-flight; device: al-suspended blocked).
type object struct {
	kind                           string
	ids, state, group, tail, stats []kv
	extra                          []kv
}

// peerID is the peer-node-id of a connection, peer-device or path (-1
// for the resource and the device).
func (o *object) peerID() int {
	for _, f := range o.ids {
		if f.k == "peer-node-id" {
			id, _ := strconv.Atoi(f.v)
			return id
		}
	}
	return -1
}

func (o *object) key() string {
	var b strings.Builder
	b.WriteString(o.kind)
	fields(&b, o.ids)
	return b.String()
}

func fields(b *strings.Builder, fs []kv) {
	for _, f := range fs {
		b.WriteString(" ")
		b.WriteString(f.k)
		b.WriteString(":")
		b.WriteString(f.v)
	}
}

func diff(a, b []kv) []kv {
	var out []kv
	for i := range b {
		if i >= len(a) || a[i] != b[i] {
			out = append(out, b[i])
		}
	}
	return out
}

func same(a, b []kv) bool { return len(diff(a, b)) == 0 && len(a) == len(b) }

// change is the body of a change line from prev to o as drbdsetup prints
// it without --full, or "" when nothing it reports changed.
func (o *object) change(prev *object) string {
	st := diff(prev.state, o.state)
	groupChanged := !same(prev.group, o.group)
	tailChanged := !same(prev.tail, o.tail)
	statsChanged := !same(prev.stats, o.stats)
	var b strings.Builder
	b.WriteString(o.kind)
	fields(&b, o.ids)
	switch o.kind {
	case "resource":
		if len(st) == 0 && !tailChanged {
			return ""
		}
		fields(&b, st)
		fields(&b, o.tail)
	case "connection":
		if len(st) == 0 {
			return ""
		}
		fields(&b, st)
	case "device":
		// DRBD 9.2 reports a device on a change of its state, not of its
		// statistics: `drbdadm resize` grew a device by 8 MiB in the VM tier
		// with no events2 line at all (test/vm/FINDINGS.md); the new size
		// shows on the next line the device prints.
		if !groupChanged && len(st) == 0 {
			return ""
		}
		if groupChanged {
			fields(&b, o.group)
		}
		fields(&b, st)
		fields(&b, o.stats)
	case "peer-device":
		if !groupChanged && len(st) == 0 && !statsChanged {
			return ""
		}
		if groupChanged {
			fields(&b, o.group)
		}
		fields(&b, st)
		fields(&b, o.stats)
	case "path":
		if len(st) == 0 {
			return ""
		}
		fields(&b, o.state)
	}
	return b.String()
}

func yn(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// objects returns r's events2 objects in the order of an `exists` dump:
// resource, connections (by descending peer node-id, as in the captures),
// device, then per connection its peer-device and path.
func (r *resource) objects() []*object {
	c := r.n.c
	conns := r.sortedConns()
	sort.Slice(conns, func(i, j int) bool { return conns[i].peer.NodeID > conns[j].peer.NodeID })
	name := kv{"name", r.name}
	out := []*object{{
		kind: "resource", ids: []kv{name},
		state: []kv{{"role", r.role}, {"suspended", r.suspendedString()}, {"force-io-failures", yn(r.forceIOFailures)},
			{"write-ordering", r.writeOrdering()}},
		tail: []kv{{"may_promote", yn(r.mayPromote())}, {"promotion_score", strconv.Itoa(r.promotionScore())}},
	}}
	for _, k := range conns {
		out = append(out, &object{kind: "connection",
			ids:   []kv{name, {"peer-node-id", strconv.Itoa(k.peer.NodeID)}, {"conn-name", k.peer.Name}},
			state: []kv{{"connection", k.cstate}, {"role", k.peerRole}, {"congested", "no"}},
			extra: []kv{{"ap-in-flight", "0"}, {"rs-in-flight", "0"}},
		})
	}
	backing := "none"
	if r.attached() {
		backing = r.md.backing
	}
	out = append(out, &object{kind: "device",
		ids:   []kv{name, {"volume", "0"}, {"minor", strconv.Itoa(r.cfg.Minor)}},
		group: []kv{{"backing_dev", backing}, {"disk", string(r.disk)}, {"client", yn(r.cfg.Disk == nil)}, {"quorum", yn(r.quorate)}},
		stats: []kv{{"size", strconv.FormatInt(c.sizeKiB(r), 10)}, {"read", i64(r.read)}, {"written", i64(r.written)},
			{"al-writes", i64(r.alWrites)}, {"bm-writes", i64(r.bmWrites)}, {"upper-pending", "0"}, {"lower-pending", "0"}},
		extra: []kv{{"al-suspended", "no"}, {"blocked", "no"}},
	})
	for _, k := range conns {
		ids := []kv{name, {"peer-node-id", strconv.Itoa(k.peer.NodeID)}, {"conn-name", k.peer.Name}}
		out = append(out, &object{kind: "peer-device",
			ids:   append(append([]kv{}, ids...), kv{"volume", "0"}),
			group: []kv{{"replication", k.repl}, {"peer-disk", string(k.peerDisk)}, {"peer-client", yn(k.peer.Diskless)}},
			state: []kv{{"resync-suspended", "no"}},
			stats: []kv{{"received", i64(k.received)}, {"sent", i64(k.sent)}, {"out-of-sync", i64(r.outOfSyncKiB(k))},
				{"pending", "0"}, {"unacked", "0"}},
		})
		out = append(out, &object{kind: "path", ids: ids,
			state: []kv{{"local", r.cfg.Self.Address.EventsString()}, {"peer", k.peer.Address.EventsString()},
				{"established", yn(k.connected() || k.pathUp)}},
		})
	}
	return out
}

// fullLine is the complete line body (exists, create, change with --full).
// A peer-device's one state field, resync-suspended, stands after its
// group, where drbdsetup prints it; every other object prints its state
// first.
func (o *object) fullLine() string {
	parts := [][]kv{o.ids, o.state, o.group, o.tail, o.stats, o.extra}
	if o.kind == "peer-device" {
		parts[1], parts[2] = o.group, o.state
	}
	var b strings.Builder
	b.WriteString(o.kind)
	for _, p := range parts {
		fields(&b, p)
	}
	return b.String()
}

func i64(v int64) string { return strconv.FormatInt(v, 10) }

// suspendedString is events2's suspended field: "no", or the reasons in
// DRBD's order (user, no-data, fencing, quorum) joined by commas.
func (r *resource) suspendedString() string {
	var why []string
	if r.suspendedUser {
		why = append(why, "user")
	}
	if r.suspendedQuorum {
		why = append(why, "quorum")
	}
	if len(why) == 0 {
		return "no"
	}
	return strings.Join(why, ",")
}

func (r *resource) writeOrdering() string {
	if r.cfg.Disk == nil {
		return "none"
	}
	return "flush"
}

func (r *resource) dataAccessible() bool {
	if r.attached() && r.disk == DiskUpToDate {
		return true
	}
	for _, k := range r.conns {
		if k.connected() && k.peerDisk == DiskUpToDate {
			return true
		}
	}
	return false
}

func (r *resource) mayPromote() bool {
	if r.role == rolePrimary || r.leaving || !r.quorate || !r.dataAccessible() {
		return false
	}
	for _, k := range r.conns {
		if k.connected() && k.peerRole == rolePrimary && !r.cfg.Options.Net.AllowTwoPrimaries {
			return false
		}
	}
	return true
}

// promotionScore approximates DRBD's: 0 without quorum or data; 10100 for
// an UpToDate local disk; plus one per connected peer that is not
// Inconsistent (it matches every capture).
func (r *resource) promotionScore() int {
	if !r.quorate || !r.dataAccessible() {
		return 0
	}
	s := 0
	if r.attached() && r.disk == DiskUpToDate {
		s = 10100
	}
	for _, k := range r.conns {
		if k.connected() && k.peerDisk != DiskInconsistent {
			s++
		}
	}
	return s
}

func (c *Cluster) sizeKiB(r *resource) int64 {
	if r.attached() {
		return r.md.sizeBytes / 1024
	}
	for _, k := range r.sortedConns() {
		if pr := c.peerResource(r, k); pr != nil && k.connected() && pr.attached() {
			return pr.md.sizeBytes / 1024
		}
	}
	return 0
}

func (r *resource) outOfSyncKiB(k *conn) int64 {
	if r.md == nil || k.peer.Diskless {
		return 0
	}
	if pm := r.md.peers[k.peer.NodeID]; pm != nil {
		return pm.bits.count() * blockSize / 1024
	}
	if r.md.current == uuidJustCreated {
		return r.md.sizeBytes / 1024
	}
	return 0
}

// publish emits change lines for everything about r that changed since the
// last publish. Called with c.mu held after every discrete transition, so
// transient states (NetworkFailure → Unconnected → Connecting) each get
// their line, in order.
func (r *resource) publish() { r.publishOnly(nil) }

// publishOnly publishes the objects of the given kinds (nil: all, or
// "!path": all but paths), so that lines come out in DRBD's order.
func (r *resource) publishOnly(kinds map[string]bool) {
	r.publishWhere(func(o *object) bool { return kinds == nil || kinds[o.kind] })
}

// publishPath publishes the path to one peer.
func (r *resource) publishPath(peerID int) {
	r.publishWhere(func(o *object) bool { return o.kind == "path" && o.peerID() == peerID })
}

func (r *resource) publishWhere(pred func(o *object) bool) {
	for _, o := range r.objects() {
		if !pred(o) {
			continue
		}
		key := o.key()
		prev := r.published[key]
		r.published[key] = o
		if prev == nil {
			continue // created objects are announced by publishCreate
		}
		body := o.change(prev)
		if body == "" {
			continue
		}
		r.n.emit("change "+body, "change "+o.fullLine())
	}
}

// publishCreate announces every object not published yet: all of them for
// a new resource, a connection's own for a new connection.
func (r *resource) publishCreate() { r.publishCreateWhere(nil) }

// publishCreateWhere announces the unpublished objects pred selects (nil:
// all), so that `up` can announce them in DRBD's order.
func (r *resource) publishCreateWhere(pred func(o *object) bool) {
	for _, o := range r.objects() {
		if _, ok := r.published[o.key()]; ok || (pred != nil && !pred(o)) {
			continue
		}
		r.published[o.key()] = o
		r.n.emit("create "+o.fullLine(), "create "+o.fullLine())
	}
}

// publishDestroyConn announces a connection's removal (del-peer): its
// path, then the connection. DRBD prints no destroy line for the peer
// device (contract-real.node3.seq, 50-51).
func (r *resource) publishDestroyConn(k *conn) {
	ids := "name:" + r.name + " peer-node-id:" + strconv.Itoa(k.peer.NodeID) + " conn-name:" + k.peer.Name
	for _, kind := range []string{"path " + ids, "connection " + ids} {
		r.n.emit("destroy "+kind, "destroy "+kind)
		delete(r.published, kind)
	}
	delete(r.published, "peer-device "+ids+" volume:0")
}

func (r *resource) publishDestroy() {
	for _, k := range r.sortedConns() {
		r.publishDestroyConn(k)
	}
	dev := "device name:" + r.name + " volume:0 minor:" + strconv.Itoa(r.cfg.Minor)
	r.n.emit("destroy "+dev, "destroy "+dev)
	r.n.emit("destroy resource name:"+r.name, "destroy resource name:"+r.name)
	clear(r.published)
}

var (
	onlyPaths  = map[string]bool{"path": true}
	allButPath = map[string]bool{"resource": true, "connection": true, "device": true, "peer-device": true}
)

// helper emits the call/response lines of a device helper (quorum-lost).
func (r *resource) helper(name string, _ bool) {
	ids := "helper name:" + r.name + " volume:0 minor:" + strconv.Itoa(r.cfg.Minor) + " helper:" + name
	r.n.emit("call "+ids, "call "+ids)
	r.n.emit("response "+ids+" status:0", "response "+ids+" status:0")
}

// peerHelper emits the call/response lines of a connection helper
// (disconnected, split-brain).
func (r *resource) peerHelper(k *conn, name string) {
	ids := "helper name:" + r.name + " peer-node-id:" + strconv.Itoa(k.peer.NodeID) + " conn-name:" + k.peer.Name + " helper:" + name
	r.n.emit("call "+ids, "call "+ids)
	r.n.emit("response "+ids+" status:0", "response "+ids+" status:0")
}

// peerHelperVol emits the call/response lines of a peer-device helper
// (before-resync-source/target, after-resync-target: "drbd r0/0 drbd0
// node2: helper command: /sbin/drbdadm before-resync-source").
func (r *resource) peerHelperVol(k *conn, name string) {
	ids := "helper name:" + r.name + " peer-node-id:" + strconv.Itoa(k.peer.NodeID) + " conn-name:" + k.peer.Name +
		" volume:0 helper:" + name
	r.n.emit("call "+ids, "call "+ids)
	r.n.emit("response "+ids+" status:0", "response "+ids+" status:0")
}

// timestampLayout is events2 --timestamps: 2026-11-22T00:56:08.191294+00:00
const timestampLayout = "2006-01-02T15:04:05.000000-07:00"

func (n *Node) emit(line, fullLine string) {
	if len(n.subs) == 0 {
		return
	}
	ts := n.c.now.Format(timestampLayout) + " "
	for _, s := range n.subs {
		if s.full {
			s.push(ts + fullLine + "\n")
		} else {
			s.push(ts + line + "\n")
		}
	}
}

// subscriber is one running `drbdsetup events2`.
type subscriber struct {
	full   bool
	mu     sync.Mutex
	lines  []string
	notify chan struct{}
	done   bool
}

func (s *subscriber) push(line string) {
	s.mu.Lock()
	s.lines = append(s.lines, line)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *subscriber) close() {
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *subscriber) take() ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lines
	s.lines = nil
	return l, s.done
}

// Events is `drbdsetup events2 --timestamps --statistics --full all`: an
// exists dump of every resource, "exists -", then one line per change,
// with every field (--full).
func (n *Node) Events(ctx context.Context) (io.ReadCloser, error) {
	return n.EventsWith(ctx, true)
}

// EventsWith is Events with or without --full. Without it change lines
// carry only what changed, as in the captures.
func (n *Node) EventsWith(ctx context.Context, full bool) (io.ReadCloser, error) {
	if err := n.begin(ctx, "events"); err != nil {
		return nil, err
	}
	s := &subscriber{full: full, notify: make(chan struct{}, 1)}
	ts := n.c.now.Format(timestampLayout) + " "
	for _, name := range sortedKeys(n.res) {
		for _, o := range n.res[name].objects() {
			s.lines = append(s.lines, ts+"exists "+o.fullLine()+"\n")
		}
	}
	s.lines = append(s.lines, ts+"exists -\n")
	n.subs = append(n.subs, s)
	n.c.mu.Unlock()

	pr, pw := io.Pipe()
	rc := &eventsReader{PipeReader: pr, s: s}
	go func() {
		defer n.unsubscribe(s)
		for {
			lines, done := s.take()
			for _, l := range lines {
				if _, err := io.WriteString(pw, l); err != nil {
					return
				}
			}
			if done {
				_ = pw.Close()
				return
			}
			select {
			case <-ctx.Done():
				_ = pw.CloseWithError(ctx.Err())
				return
			case <-s.notify:
			case <-time.After(time.Second):
			}
		}
	}()
	return rc, nil
}

// eventsReader ends the stream's goroutine when the reader closes it.
type eventsReader struct {
	*io.PipeReader
	s *subscriber
}

func (e *eventsReader) Close() error {
	e.s.close()
	return e.PipeReader.Close()
}

func (n *Node) unsubscribe(s *subscriber) {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	for i, x := range n.subs {
		if x == s {
			n.subs = append(n.subs[:i], n.subs[i+1:]...)
			return
		}
	}
}

// EventsNow is `drbdsetup events2 --now --statistics all`: the exists dump
// without timestamps, ending with "exists -".
func (n *Node) EventsNow(ctx context.Context) (string, error) {
	if err := n.begin(ctx, "events"); err != nil {
		return "", err
	}
	defer n.c.mu.Unlock()
	var b strings.Builder
	for _, name := range sortedKeys(n.res) {
		for _, o := range n.res[name].objects() {
			b.WriteString("exists " + o.fullLine() + "\n")
		}
	}
	b.WriteString("exists -\n")
	return b.String(), nil
}
