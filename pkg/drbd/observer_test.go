package drbd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// fakeClock fires every After at once and records the requested waits:
// the restart logic runs with no sleeping, and the test reads the backoff.
type fakeClock struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch
}

// scriptedSource returns the given streams in turn, then cancels the run.
// An entry is a stream's text, an error (that start fails) or an
// EventSource (that start is the source's, such as a real process).
func scriptedSource(cancel context.CancelFunc, streams ...any) EventSource {
	var mu sync.Mutex
	i := 0
	return func(ctx context.Context) (io.ReadCloser, error) {
		mu.Lock()
		defer mu.Unlock()
		if i >= len(streams) {
			cancel()
			return nil, ctx.Err()
		}
		s := streams[i]
		i++
		switch s := s.(type) {
		case error:
			return nil, s
		case string:
			return io.NopCloser(strings.NewReader(s)), nil
		case EventSource:
			return s(ctx)
		}
		panic(fmt.Sprintf("bad script entry %T", s))
	}
}

// runObserver runs an observer over the script to completion and returns
// every change it emitted and the errors it reported.
func runObserver(t *testing.T, clock *fakeClock, streams ...any) (*Observer, []Change, []error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var errs []error
	o := NewObserver(scriptedSource(cancel, streams...), ObserverOptions{
		Clock: clock, Backoff: ExponentialBackoff(100*time.Millisecond, time.Second),
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
	})
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	var changes []Change
	for c := range o.Changes() {
		changes = append(changes, c)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	return o, changes, errs
}

func parseErrors(errs []error) []error {
	var out []error
	for _, e := range errs {
		var pe *ParseError
		if errors.As(e, &pe) {
			out = append(out, e)
		}
	}
	return out
}

// 05-quorum-loss, node1: Primary loses node3 (down), then node2 (link cut):
// quorum goes, quorum-lost runs; the link heals and everything returns.
func TestObserverQuorumLossStream(t *testing.T) {
	_, changes, errs := runObserver(t, &fakeClock{}, string(captures.Read(t, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt")))
	if pe := parseErrors(errs); len(pe) != 0 {
		t.Fatalf("unparsed lines: %v", pe)
	}
	var sawPrimary, sawNoQuorum, sawQuorumLostCall, sawQuorumLostResp bool
	var last *ResourceState
	for _, c := range changes {
		if c.Helper != nil {
			h, _ := c.Helper.Get("helper")
			if h == "quorum-lost" && c.Helper.Kind == EventCall {
				sawQuorumLostCall = true
				if !sawNoQuorum {
					t.Error("quorum-lost helper reported before the quorum:no state")
				}
			}
			if h == "quorum-lost" && c.Helper.Kind == EventResponse {
				sawQuorumLostResp = true
			}
			continue
		}
		s := c.State
		if s.Role == "Primary" {
			sawPrimary = true
		}
		if !s.Devices[0].Quorum && !sawNoQuorum {
			sawNoQuorum = true
			// Quorum goes in the same state change as the link to node2.
			if s.Role != "Primary" || s.Connections[1].State != "NetworkFailure" || s.Connections[2].State != "Connecting" {
				t.Errorf("at quorum loss: role %s, node2 %s, node3 %s", s.Role, s.Connections[1].State, s.Connections[2].State)
			}
		}
		// Line by line, the heal would pass through "node2 Connected,
		// quorum:no", a state DRBD never had: batches prevent it.
		if !s.Devices[0].Quorum && s.Connections[1].State == "Connected" {
			t.Errorf("reported an intermediate state: connected to node2 without quorum")
		}
		last = s
	}
	if !sawPrimary || !sawNoQuorum || !sawQuorumLostCall || !sawQuorumLostResp {
		t.Fatalf("primary %v, no-quorum %v, quorum-lost call %v response %v", sawPrimary, sawNoQuorum, sawQuorumLostCall, sawQuorumLostResp)
	}
	// Final state: healed.
	if last.Role != "Primary" || !last.Devices[0].Quorum || last.Connections[1].State != "Connected" ||
		last.Connections[2].State != "Connected" || last.Connections[1].PeerDevices[0].PeerDisk != "UpToDate" ||
		last.Connections[2].PeerDevices[0].PeerDisk != "Diskless" || !established(last.Connections[1], "ipv4:10.99.0.1:7000", "ipv4:10.99.0.2:7000") {
		t.Fatalf("final state: %+v", last)
	}
	if want := time.Date(2026, 11, 22, 0, 58, 26, 489806000, time.UTC); !last.Updated.Equal(want) {
		t.Errorf("Updated %v, want %v", last.Updated, want)
	}
}

// 04-failover: node1 demotes, the diskless node3 is promoted, writes,
// demotes. Every node's stream parses and tells that story.
func TestObserverFailoverStreams(t *testing.T) {
	for node, check := range map[string]func(t *testing.T, changes []Change){
		"node1": func(t *testing.T, changes []Change) {
			first, last := changes[0].State, changes[len(changes)-1].State
			if first.Role != "Primary" || last.Role != "Secondary" || last.Connections[2].PeerRole != "Secondary" {
				t.Errorf("node1: first %s last %s", first.Role, last.Role)
			}
			if !anyState(changes, func(s *ResourceState) bool { return s.Connections[2].PeerRole == "Primary" }) {
				t.Error("node1 never saw node3 as Primary")
			}
		},
		"node2": func(t *testing.T, changes []Change) {
			if !anyState(changes, func(s *ResourceState) bool { return s.Connections[2].PeerRole == "Primary" }) {
				t.Error("node2 never saw node3 as Primary")
			}
		},
		"node3": func(t *testing.T, changes []Change) {
			last := changes[len(changes)-1].State
			if !anyState(changes, func(s *ResourceState) bool { return s.Role == "Primary" && s.Devices[0].DiskState == "Diskless" }) {
				t.Error("node3 never became a diskless Primary")
			}
			if last.Role != "Secondary" {
				t.Errorf("node3 ends %s", last.Role)
			}
		},
	} {
		t.Run(node, func(t *testing.T) {
			_, changes, errs := runObserver(t, &fakeClock{}, string(captures.Read(t, "04-failover-event-stream/"+node+".events2-timestamps-statistics-stream.txt")))
			if pe := parseErrors(errs); len(pe) != 0 {
				t.Fatalf("unparsed lines: %v", pe)
			}
			if len(changes) < 2 {
				t.Fatalf("%d changes", len(changes))
			}
			check(t, changes)
		})
	}
}

func anyState(cs []Change, f func(*ResourceState) bool) bool {
	for _, c := range cs {
		if c.State != nil && f(c.State) {
			return true
		}
	}
	return false
}

// Restarts: a stream that ends is restarted with backoff; a failing start
// backs off further; a stream that completed its dump resets the backoff;
// the new dump replaces the old picture (a resource gone meanwhile is
// reported removed, an unchanged one is not re-reported).
func TestObserverRestart(t *testing.T) {
	r0 := string(captures.Read(t, "node1.events2-now-nostats.txt"))
	r1 := strings.ReplaceAll(r0, "name:r0", "name:r1")
	r1 = strings.Replace(r1, "exists -\n", "", 1) // r1's dump lines, no end marker
	both := strings.Replace(r0, "exists -\n", r1+"exists -\n", 1)
	clock := &fakeClock{}
	o, changes, errs := runObserver(t, clock,
		both,                          // stream 1: r0 and r1
		errors.New("modprobe failed"), // start fails
		errors.New("still failing"),
		r0,                              // stream 3: r1 is gone, r0 unchanged
		"exists resource name:r0 role:", // stream 4: cut mid-dump (truncated line is still parseable)
	)
	var got []string
	for _, c := range changes {
		switch {
		case c.Removed:
			got = append(got, "removed "+c.Resource)
		case c.State != nil:
			got = append(got, "state "+c.Resource)
		}
	}
	if want := "state r0,state r1,removed r1"; strings.Join(got, ",") != want {
		t.Fatalf("changes %v, want %s", got, want)
	}
	// Backoff: after stream 1 (healthy) 100ms; two failed starts: 200ms,
	// 400ms; stream 3 healthy → reset to 100ms; stream 4 never finished its
	// dump → 200ms.
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
	if fmt.Sprint(clock.waits) != fmt.Sprint(want) {
		t.Fatalf("backoff waits %v, want %v", clock.waits, want)
	}
	if len(errs) != 5 {
		t.Fatalf("reported errors %v", errs)
	}
	if _, ok := o.Snapshot("r1"); ok {
		t.Fatal("r1 still in the snapshot")
	}
	if got := o.Resources(); !slices.Equal(got, []string{"r0"}) {
		t.Fatalf("Resources() = %v, want [r0]", got)
	}
	if s, ok := o.Snapshot("r0"); !ok || s.Role != "Primary" {
		t.Fatalf("r0 snapshot %+v", s)
	}
	if o.Synced() {
		t.Fatal("observer claims to be synced after the stream ended")
	}
	if st := o.Stats(); st.Streams != 3 || st.Restarts != 5 {
		t.Fatalf("stats %+v, want 3 streams started, 5 restarts", st)
	}
}

// Bad lines are reported and skipped; the stream goes on.
func TestObserverSkipsBadLines(t *testing.T) {
	stream := "exists resource name:r0 role:Secondary suspended:no\nexists bogus name:r0\nexists -\nchange resource name:r0 role:Primary\nchange device name:r0 volume:zero\n"
	o, changes, errs := runObserver(t, &fakeClock{}, stream)
	if pe := parseErrors(errs); len(pe) != 2 {
		t.Fatalf("parse errors %v", errs)
	}
	if len(changes) != 2 || changes[1].State.Role != "Primary" {
		t.Fatalf("changes %+v", changes)
	}
	if s, _ := o.Snapshot("r0"); s.Role != "Primary" {
		t.Fatal("snapshot lost the change after a bad line")
	}
}

// Changes that only move IO counters are not reported; out-of-sync moves
// are (they are resync progress).
func TestObserverReportsProgressNotCounters(t *testing.T) {
	stream := strings.Join([]string{
		"2026-11-22T01:00:00.000001+00:00 exists resource name:r0 role:Secondary suspended:no",
		"2026-11-22T01:00:00.000001+00:00 exists device name:r0 volume:0 minor:0 backing_dev:/dev/vda disk:Inconsistent client:no quorum:yes size:131028 read:0 written:0",
		"2026-11-22T01:00:00.000001+00:00 exists connection name:r0 peer-node-id:0 conn-name:node1 connection:Connected role:Primary",
		"2026-11-22T01:00:00.000001+00:00 exists peer-device name:r0 peer-node-id:0 conn-name:node1 volume:0 replication:SyncTarget peer-disk:UpToDate peer-client:no resync-suspended:no received:0 sent:0 out-of-sync:131028 pending:0 unacked:0",
		"2026-11-22T01:00:00.000002+00:00 exists -",
		"2026-11-22T01:00:01.000000+00:00 change device name:r0 volume:0 minor:0 size:131028 read:0 written:115712",
		"2026-11-22T01:00:02.000000+00:00 change peer-device name:r0 peer-node-id:0 conn-name:node1 volume:0 received:116736 sent:0 out-of-sync:15316 pending:7 unacked:1",
		"2026-11-22T01:00:03.000000+00:00 change peer-device name:r0 peer-node-id:0 conn-name:node1 volume:0 replication:Established peer-disk:UpToDate out-of-sync:0",
		"2026-11-22T01:00:04.000000+00:00 change device name:r0 volume:0 minor:0 disk:UpToDate",
	}, "\n")
	_, changes, _ := runObserver(t, &fakeClock{}, stream)
	var pct []string
	for _, c := range changes {
		pd := c.State.Connections[0].PeerDevices[0]
		pct = append(pct, fmt.Sprintf("%s/%s/%.2f/%v", c.State.Devices[0].DiskState, pd.Replication, pd.PercentInSync, pd.Resyncing()))
	}
	want := "Inconsistent/SyncTarget/0.00/true Inconsistent/SyncTarget/88.31/true Inconsistent/Established/100.00/false UpToDate/Established/100.00/false"
	if strings.Join(pct, " ") != want {
		t.Fatalf("progress %v\nwant %s", pct, want)
	}
}

// A finished batch is reported as soon as no more input is waiting: the
// Observer never holds a state change back until the next event arrives.
func TestObserverFlushesWhenIdle(t *testing.T) {
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := false
	o := NewObserver(func(ctx context.Context) (io.ReadCloser, error) {
		if started {
			cancel()
			return nil, ctx.Err()
		}
		started = true
		return pr, nil
	}, ObserverOptions{Clock: &fakeClock{}})
	go o.Run(ctx)
	write := func(s string) {
		if _, err := io.WriteString(pw, s); err != nil {
			t.Error(err)
		}
	}
	go write("exists resource name:r0 role:Secondary suspended:no\nexists -\n")
	if c := <-o.Changes(); c.State == nil || c.State.Role != "Secondary" {
		t.Fatalf("dump change %+v", c)
	}
	// Two lines of one untimestamped write: one change, delivered while the
	// writer still holds the stream open.
	go write("change resource name:r0 role:Primary\nchange resource name:r0 suspended:quorum\n")
	c := <-o.Changes()
	if c.State.Role != "Primary" {
		t.Fatalf("change %+v", c.State)
	}
	if len(c.State.Suspended) == 0 {
		// The two lines may arrive in two reads; then the second change follows.
		c = <-o.Changes()
	}
	if strings.Join(c.State.Suspended, ",") != "quorum" {
		t.Fatalf("suspended %v", c.State.Suspended)
	}
	pw.Close()
	for range o.Changes() {
	}
}

// End to end through a real process: ExecDriver.Events runs a stand-in
// drbdsetup (a script checking its arguments and printing a recorded
// stream), the Observer reads it through a pipe, and when the program fails
// the reported error carries its stderr.
func TestObserverOverRealProcess(t *testing.T) {
	dir := t.TempDir()
	stream := captures.Path(t, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt")
	script := filepath.Join(dir, "drbdsetup")
	body := "#!/bin/sh\n" +
		`[ "$*" = "events2 --timestamps --statistics --full all" ] || { echo "bad args: $*" >&2; exit 2; }` + "\n" +
		"cat " + stream + "\necho 'Failed to modprobe drbd (No such file or directory)' >&2\nexit 20\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	d := NewExecDriver(ExecConfig{Drbdsetup: script, ConfDir: dir})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var errs []error
	o := NewObserver(scriptedSource(cancel, EventSource(d.Events)), ObserverOptions{Clock: &fakeClock{}, OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }})
	go o.Run(ctx)
	var last *ResourceState
	for c := range o.Changes() {
		if c.State != nil {
			last = c.State
		}
	}
	if last == nil || last.Role != "Primary" || !last.Devices[0].Quorum || last.Connections[2].State != "Connected" {
		t.Fatalf("final state %+v", last)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(errs) == 0 || !strings.Contains(errs[0].Error(), "Failed to modprobe drbd") || !errors.Is(errs[0], ErrCommandFailed) {
		t.Fatalf("stream end not explained: %v", errs)
	}
}

// established says whether the connection's path from local to peer is up.
func established(c *ConnectionState, local, peer string) bool {
	p, ok := c.Path(local, peer)
	return ok && p.Established
}
