package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// takeDown demotes (never forced) and takes a resource down with
// drbd.SafeDown — which refuses while anything holds the device (never
// while mounted) and repairs a half-done down — then removes its
// configuration.
//
// Every resource taken down is one this node's datamesh member no longer
// runs: no replica of the node owns it (the collector), its replica left the
// datamesh (leave), or an earlier replica of the same name left it
// (evictEarlierIncarnation). One still Primary without quorum is a stale
// Primary: its member was force-removed while the node was cut off, and its
// users' writes are held suspended (on-no-quorum suspend-io) for a quorum
// that can never return, since no peer is configured to connect to it any
// more. Its writes are failed first (failHeldWrites), so that its users see
// EIO, end, and let go of the device (docs/controller.md,
// "--delete-lost-pods").
//
// A take-down refused because the device is held open waits before it is
// tried again (takeDownGate): the reconciler is woken by every change of the
// volume, many a second while the survivors resync.
func (a *Agent) takeDown(ctx context.Context, name string) error {
	if err := a.downs.wait(name); err != nil {
		return err
	}
	return a.downs.done(name, a.takeDownNow(ctx, name))
}

func (a *Agent) takeDownNow(ctx context.Context, name string) error {
	if st, err := a.drv.Status(ctx, name); err == nil && len(st) == 1 && st[0].Role == "Primary" {
		if withoutQuorum(st[0]) {
			if err := a.failHeldWrites(ctx, name); err != nil {
				return err
			}
		}
		if err := a.drv.Secondary(ctx, name); err != nil {
			return err
		}
	}
	if err := drbd.SafeDown(ctx, a.drv, name, nil); err != nil {
		return err
	}
	return a.drv.RemoveConfig(ctx, name)
}

// withoutQuorum: a device of the resource has no quorum.
func withoutQuorum(st drbd.StatusResource) bool {
	for _, d := range st.Devices {
		if !d.Quorum {
			return true
		}
	}
	return false
}

// failHeldWrites switches a stale Primary's running resource to on-no-quorum
// io-error, unless it runs that already. Safe because nothing it fails was
// ever acknowledged: a write held for lack of quorum has not completed, and
// under io-error a write without quorum fails where suspend-io would have
// held it; with quorum both policies write alike. What it gives up is only
// the hope that quorum returns, which for a removed member it cannot.
func (a *Agent) failHeldWrites(ctx context.Context, name string) error {
	show, err := a.drv.Show(ctx, name)
	if err != nil {
		return err
	}
	if len(show) == 1 && show[0].Options["on-no-quorum"] == string(drbd.OnNoQuorumIOError) {
		return nil
	}
	a.log.Info("taking down a Primary without quorum that is no datamesh member's: failing its held writes (on-no-quorum io-error)", "resource", name)
	return a.drv.FailIOWithoutQuorum(ctx, name)
}

// takeDownGate spaces out the attempts to take down a resource whose device is
// held open: after each refusal the next attempt waits twice as long as the
// one before, from first up to max; any other outcome forgets the resource.
type takeDownGate struct {
	first, max time.Duration
	now        func() time.Time

	mu      sync.Mutex
	refused map[string]refusal
}

type refusal struct {
	err  error // the last refusal, given back until next
	next time.Time
	wait time.Duration
}

// refusedError is a refusal given back while the gate waits: the refusal's own
// message (so that a status that reports it does not change), and when to
// come back.
type refusedError struct {
	err   error
	retry time.Duration
}

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

func newTakeDownGate(first, max time.Duration) *takeDownGate {
	return &takeDownGate{first: first, max: max, now: time.Now, refused: map[string]refusal{}}
}

// wait returns a *refusedError while the resource's last refusal is recent,
// nil when it may be tried now.
func (g *takeDownGate) wait(name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, ok := g.refused[name]
	if !ok {
		return nil
	}
	if left := r.next.Sub(g.now()); left > 0 {
		return &refusedError{err: r.err, retry: left}
	}
	return nil
}

// done records the outcome of an attempt and returns it: err, or a
// *refusedError naming when to try again when the device is held open.
func (g *takeDownGate) done(name string, err error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !errors.Is(err, drbd.ErrDeviceInUse) {
		delete(g.refused, name)
		return err
	}
	r := g.refused[name]
	r.wait = min(max(2*r.wait, g.first), g.max)
	r.err, r.next = err, g.now().Add(r.wait)
	g.refused[name] = r
	return &refusedError{err: err, retry: r.wait}
}

// retryAfter is when a take-down refused by err may be tried again: the gate's
// wait, or fallback.
func retryAfter(err error, fallback time.Duration) time.Duration {
	var re *refusedError
	if errors.As(err, &re) {
		return re.retry
	}
	return fallback
}
