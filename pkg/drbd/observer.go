package drbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// EventSource starts an events2 stream; Driver.Events is one.
type EventSource func(ctx context.Context) (io.ReadCloser, error)

// Clock is the little of time the Observer needs, so tests drive restarts
// without sleeping.
type Clock interface {
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Backoff says how long to wait before restart number attempt (1, 2, …)
// of a stream that ended.
type Backoff func(attempt int) time.Duration

// ExponentialBackoff doubles from first up to limit.
func ExponentialBackoff(first, limit time.Duration) Backoff {
	return func(attempt int) time.Duration {
		d := first
		for i := 1; i < attempt && d < limit; i++ {
			d *= 2
		}
		return min(d, limit)
	}
}

// Change is one thing the Observer reports.
type Change struct {
	// Resource is the resource concerned.
	Resource string
	// State is a private copy of the resource's snapshot after the change;
	// nil when the resource is gone (Removed).
	State   *ResourceState
	Removed bool
	// Helper is set for a user-mode helper call or response (quorum-lost,
	// disconnected, …), which is news but not state.
	Helper *Event
}

// ObserverOptions tune an Observer; zero values get defaults.
type ObserverOptions struct {
	Clock   Clock        // default: real time
	Backoff Backoff      // default: 100ms doubling to 10s
	Buffer  int          // Changes channel capacity; default 256
	Log     *slog.Logger // default: discard
	OnError func(error)  // stream and parse errors (also logged); optional
}

// Observer keeps a per-resource snapshot from a long-running events2
// stream, restarts the stream when it ends, and reports every change.
//
// Each stream begins with an "exists" dump of everything the kernel has;
// the Observer builds a fresh picture from it and, at the "exists -"
// marker, reports the differences from what it knew (including resources
// that vanished while no stream was running). So a restart, of the stream
// or of the agent, never leaves a stale snapshot behind.
//
// Changes are delivered in order on a buffered channel; when the consumer
// falls behind, reading the stream waits (drbdsetup then blocks on its
// pipe; the kernel keeps its state, and the next events carry it).
type Observer struct {
	src  EventSource
	opts ObserverOptions
	ch   chan Change

	mu     sync.Mutex
	state  map[string]*ResourceState
	synced bool // an initial dump has completed on the current stream

	stats ObserverStats
}

// ObserverStats count what the Observer has done, for metrics.
type ObserverStats struct {
	Streams  int // streams started
	Lines    int // lines read
	Restarts int // streams that ended and were restarted
}

// Stats returns the counters.
func (o *Observer) Stats() ObserverStats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stats
}

func NewObserver(src EventSource, opts ObserverOptions) *Observer {
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.Backoff == nil {
		opts.Backoff = ExponentialBackoff(100*time.Millisecond, 10*time.Second)
	}
	if opts.Buffer == 0 {
		opts.Buffer = 256
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Observer{src: src, opts: opts, ch: make(chan Change, opts.Buffer), state: map[string]*ResourceState{}}
}

// Changes is the stream of changes; it is closed when Run returns.
func (o *Observer) Changes() <-chan Change { return o.ch }

// Snapshot returns a copy of the current state of a resource.
func (o *Observer) Snapshot(name string) (*ResourceState, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.state[name]
	if !ok {
		return nil, false
	}
	return s.Clone(), true
}

// Resources returns the names of the resources the observer knows, sorted:
// what the kernel runs, as of the last line read (the agent's garbage
// collector lists them instead of asking the kernel for its whole status).
func (o *Observer) Resources() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Sorted(maps.Keys(o.state))
}

// Synced reports whether the current stream's initial dump is complete,
// i.e. whether snapshots reflect the kernel rather than a previous stream.
func (o *Observer) Synced() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.synced
}

// Run reads streams until ctx ends, restarting each one that ends with a
// backoff. The backoff resets after a stream that completed its initial
// dump (the stream worked; it just ended).
func (o *Observer) Run(ctx context.Context) error {
	defer close(o.ch)
	attempt := 0
	for {
		healthy, err := o.runStream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		o.mu.Lock()
		o.synced = false
		o.stats.Restarts++
		o.mu.Unlock()
		if healthy {
			attempt = 0
		}
		attempt++
		wait := o.opts.Backoff(attempt)
		o.report(fmt.Errorf("events2 stream ended (restart %d in %s): %w", attempt, wait, err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-o.opts.Clock.After(wait):
		}
	}
}

func (o *Observer) report(err error) {
	o.opts.Log.Warn("drbd observer", "err", err)
	if o.opts.OnError != nil {
		o.opts.OnError(err)
	}
}

var errStreamEOF = errors.New("stream closed by drbdsetup")

// runStream consumes one stream. healthy is true once it delivered a full
// initial dump.
//
// DRBD prints all objects touched by one state change as consecutive lines
// with the same timestamp, and those lines describe one atomic transition:
// in 05-quorum-loss node1 sees "connection:Connected" one line before
// "quorum:yes". Applying and reporting line by line would invent a state
// that never existed (connected but without quorum), so the Observer
// applies a whole batch (same timestamp) and reports once. A batch ends at
// a new timestamp, or when no further input is already buffered (the next
// read could block, and a finished batch must not wait for the next event).
func (o *Observer) runStream(ctx context.Context) (healthy bool, err error) {
	rc, err := o.src(ctx)
	if err != nil {
		return false, err
	}
	defer rc.Close()
	o.mu.Lock()
	o.stats.Streams++
	o.mu.Unlock()

	// The dump is collected apart and swapped in at "exists -".
	dump := map[string]*ResourceState{}
	inDump := true
	b := batch{o: o}
	r := bufio.NewReaderSize(rc, 64*1024)
	for {
		if r.Buffered() == 0 && !inDump {
			if err := b.flush(ctx); err != nil {
				return healthy, err
			}
		}
		line, rerr := r.ReadString('\n')
		if len(line) > maxEventLine {
			o.report(&ParseError{Line: line[:200] + "…", Reason: fmt.Sprintf("line longer than %d bytes", maxEventLine)})
			line = ""
		}
		line = strings.TrimRight(line, "\r\n")
		if line != "" {
			o.mu.Lock()
			o.stats.Lines++
			o.mu.Unlock()
			ev, perr := ParseEvent(line)
			switch {
			case perr != nil:
				// One bad line must not blind the agent: report it, go on.
				o.report(perr)
			case ev.EndOfDump && !inDump:
				o.report(&ParseError{Line: line, Reason: "second end-of-dump marker"})
			case ev.EndOfDump:
				inDump = false
				healthy = true
				if err := o.finishDump(ctx, dump); err != nil {
					return healthy, err
				}
			case inDump:
				if ev.Kind != EventExists {
					// drbdsetup sends the whole dump first.
					o.report(&ParseError{Line: line, Reason: "event before the end of the initial dump"})
				}
				if err := applyTo(dump, &ev); err != nil {
					o.report(err)
				}
			default:
				if err := b.add(ctx, &ev); err != nil {
					if ctx.Err() != nil {
						return healthy, ctx.Err()
					}
					o.report(err)
				}
			}
		}
		if rerr != nil {
			if err := b.flush(ctx); err != nil {
				return healthy, err
			}
			if rerr == io.EOF {
				return healthy, errStreamEOF
			}
			return healthy, rerr
		}
	}
}

// maxEventLine bounds one events2 line; real ones are a few hundred bytes.
const maxEventLine = 1 << 20

// batch accumulates the live events of one state change.
type batch struct {
	o      *Observer
	time   time.Time
	before map[string]*ResourceState // state at batch start; nil value: did not exist
	order  []string
}

func (b *batch) add(ctx context.Context, ev *Event) error {
	if len(b.before) > 0 && !ev.Time.Equal(b.time) {
		if err := b.flush(ctx); err != nil {
			return err
		}
	}
	if ev.Object == ObjHelper {
		// A helper call is news in its own right, reported after the state
		// it follows.
		if err := b.flush(ctx); err != nil {
			return err
		}
		e := *ev
		return b.o.send(ctx, Change{Resource: ev.Name(), Helper: &e})
	}
	b.time = ev.Time
	name := ev.Name()
	o := b.o
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.before == nil {
		b.before = map[string]*ResourceState{}
	}
	if _, seen := b.before[name]; !seen {
		var prev *ResourceState
		if s, ok := o.state[name]; ok {
			prev = s.Clone()
		}
		b.before[name] = prev
		b.order = append(b.order, name)
	}
	return applyTo(o.state, ev)
}

// flush reports every resource the batch changed. Lines that only moved IO
// counters leave the snapshot equal and are not reported.
func (b *batch) flush(ctx context.Context) error {
	if len(b.before) == 0 {
		return nil
	}
	o := b.o
	var changes []Change
	o.mu.Lock()
	for _, name := range b.order {
		prev := b.before[name]
		cur, exists := o.state[name]
		switch {
		case !exists && prev != nil:
			changes = append(changes, Change{Resource: name, Removed: true})
		case exists && (prev == nil || !prev.Equal(cur)):
			changes = append(changes, Change{Resource: name, State: cur.Clone()})
		}
	}
	o.mu.Unlock()
	b.before, b.order = nil, nil
	for _, c := range changes {
		if err := o.send(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

// applyTo applies one event to the resource it names in m, creating the
// resource on its first event and deleting it on "destroy resource".
// Helper events carry no state.
func applyTo(m map[string]*ResourceState, ev *Event) error {
	if ev.Object == ObjHelper {
		return nil
	}
	name := ev.Name()
	if ev.Object == ObjResource && ev.Kind == EventDestroy {
		delete(m, name)
		return nil
	}
	s := m[name]
	if s == nil {
		s = newResourceState(name)
		m[name] = s
	}
	if err := s.apply(ev); err != nil {
		return fmt.Errorf("resource %s: %w", name, err)
	}
	return nil
}

func (o *Observer) finishDump(ctx context.Context, dump map[string]*ResourceState) error {
	o.mu.Lock()
	old := o.state
	o.state = dump
	o.synced = true
	var changes []Change
	for name, s := range dump {
		if prev, ok := old[name]; !ok || !prev.Equal(s) {
			changes = append(changes, Change{Resource: name, State: s.Clone()})
		}
	}
	for name := range old {
		if _, ok := dump[name]; !ok {
			changes = append(changes, Change{Resource: name, Removed: true})
		}
	}
	o.mu.Unlock()
	sortChanges(changes)
	for _, c := range changes {
		if err := o.send(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

func (o *Observer) send(ctx context.Context, c Change) error {
	select {
	case o.ch <- c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sortChanges gives consumers and tests a deterministic order.
func sortChanges(cs []Change) {
	slices.SortFunc(cs, func(a, b Change) int { return strings.Compare(a.Resource, b.Resource) })
}
