package contract

import (
	"bufio"
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// tracked are the state fields whose changes the suite compares; counters
// and scores are left out (they differ between any two runs).
var tracked = map[drbd.ObjectType][]string{
	drbd.ObjResource:   {"role", "suspended", "may_promote"},
	drbd.ObjConnection: {"connection", "role"},
	drbd.ObjDevice:     {"disk", "quorum"},
	drbd.ObjPeerDevice: {"replication", "peer-disk"},
	drbd.ObjPath:       {"established"},
}

// normalizer turns an events2 stream (with or without --full, with or
// without --timestamps) into one entry per changed state field, such as
// "connection node2 connection:NetworkFailure" or "call helper:quorum-lost".
// Splitting per field makes the comparison independent of how DRBD groups
// fields into lines.
type normalizer struct {
	last map[string]map[string]string
}

func newNormalizer() *normalizer { return &normalizer{last: map[string]map[string]string{}} }

func objectName(ev *drbd.Event) string {
	name := string(ev.Object)
	if c, ok := ev.Get("conn-name"); ok {
		name += " " + c
	}
	return name
}

// feed returns the entries of one line, and the out-of-sync figure of a
// peer-device line (-1 when none).
func (n *normalizer) feed(ev *drbd.Event) (entries []string, conn string, oos int64) {
	oos = -1
	if ev.EndOfDump {
		return nil, "", -1
	}
	obj := objectName(ev)
	switch ev.Kind {
	case drbd.EventCall:
		h, _ := ev.Get("helper")
		return []string{"call helper:" + h}, "", -1
	case drbd.EventResponse:
		return nil, "", -1
	case drbd.EventDestroy:
		delete(n.last, obj)
		return []string{"destroy " + obj}, "", -1
	}
	st := n.last[obj]
	if st == nil {
		st = map[string]string{}
		n.last[obj] = st
	}
	for _, k := range tracked[ev.Object] {
		v, ok := ev.Get(k)
		if !ok || st[k] == v {
			continue
		}
		st[k] = v
		if ev.Kind != drbd.EventExists {
			entries = append(entries, obj+" "+k+":"+v)
		}
	}
	if v, ok := ev.Get("out-of-sync"); ok && ev.Object == drbd.ObjPeerDevice {
		conn, _ = ev.Get("conn-name")
		oos, _ = strconv.ParseInt(v, 10, 64)
	}
	return entries, conn, oos
}

// captureStream normalizes a captured events2 stream, skipping its initial
// dump.
func captureStream(t *testing.T, path string) []string {
	t.Helper()
	n := newNormalizer()
	var out []string
	for _, line := range captures.Lines(t, path) {
		ev, err := drbd.ParseEvent(line)
		if err != nil {
			t.Fatalf("capture %s: %v", path, err)
		}
		e, _, _ := n.feed(&ev)
		out = append(out, e...)
	}
	return out
}

// watcher follows one node's Events stream for the whole suite.
type watcher struct {
	mu      sync.Mutex
	entries []string
	oos     []oosSample
	lines   int
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
}

type oosSample struct {
	at   int // index into entries
	conn string
	kib  int64
}

func (s *suite) watch(t *testing.T, node string) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(s.ctx)
	rc, err := s.h.Driver(node).Events(ctx)
	if err != nil {
		cancel()
		t.Fatalf("%s: events: %v", node, err)
	}
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer rc.Close()
		n := newNormalizer()
		sc := bufio.NewScanner(rc)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			ev, err := drbd.ParseEvent(sc.Text())
			w.mu.Lock()
			w.lines++
			if err != nil {
				w.err = err
				w.mu.Unlock()
				continue
			}
			e, conn, oos := n.feed(&ev)
			w.entries = append(w.entries, e...)
			if oos >= 0 {
				w.oos = append(w.oos, oosSample{at: len(w.entries), conn: conn, kib: oos})
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// quiesce waits (in real time, briefly) until the stream has delivered
// everything: the driver writes events asynchronously to the reader.
func (w *watcher) quiesce() {
	last, stable := -1, 0
	for i := 0; i < 200 && stable < 3; i++ {
		w.mu.Lock()
		n := w.lines
		w.mu.Unlock()
		if n == last {
			stable++
		} else {
			stable, last = 0, n
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *watcher) mark() int {
	w.quiesce()
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}

func (w *watcher) since(mark int) []string {
	w.quiesce()
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.entries[mark:]...)
}

// maxOutOfSync is the largest out-of-sync figure (KiB) reported towards
// conn since mark.
func (w *watcher) maxOutOfSync(conn string, mark int) int64 {
	w.quiesce()
	w.mu.Lock()
	defer w.mu.Unlock()
	var max int64
	for _, s := range w.oos {
		if s.at >= mark && s.conn == conn && s.kib > max {
			max = s.kib
		}
	}
	return max
}

func (w *watcher) stop() {
	w.cancel()
	<-w.done
}
