package agent

import (
	"context"
	"time"

	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	"github.com/meshvol/meshvol/pkg/drbd"
)

const (
	// staleQuorumGrace is how long a diskless member may show quorum:no while
	// connected to an UpToDate peer before the agent asks DRBD to recompute:
	// long enough for the peer's own state report, which normally settles it.
	staleQuorumGrace = 3 * time.Second
	// staleQuorumFirstRetry and staleQuorumMaxRetry space the recomputes of a
	// member that stays without quorum: its peers may really have none (a
	// 2D+1TB whose Diskful survivors lost it with a Primary until the force
	// removal lowers q), and a recompute then changes nothing.
	staleQuorumFirstRetry = 10 * time.Second
	staleQuorumMaxRetry   = 2 * time.Minute
	// staleQuorumAttachedRetry spaces them, without growing, while the datamesh
	// attaches the member: a pod waits on its device (a write blocks while it has
	// no quorum), and the peers regain quorum a few confirmation rounds after a
	// loss (the force removal's q↓), a change this member does not see. Waiting
	// out the growing interval there kept a failover's pod from starting for 20 s
	// after its node was Primary (docs/controller.md, "Failover, measured"). A
	// recompute is one drbdsetup call.
	staleQuorumAttachedRetry = time.Second
)

// staleQuorum is one resource's episode of quorum:no while connected to an
// UpToDate peer (recomputeStaleQuorum).
type staleQuorum struct {
	since time.Time     // first seen
	next  time.Time     // the next recompute is due
	every time.Duration // the wait after the next one
	tries int
}

// recomputeStaleQuorum makes DRBD compute afresh the quorum of a diskless
// member (q = layout.NonVoterQuorum, quorate only through a connected UpToDate
// peer that reported quorum) that shows quorum:no while connected to an
// UpToDate peer for longer than staleQuorumGrace; it returns when to look
// again (0: nothing to watch). DRBD 9.2 computes quorum only in a state change
// that changes something: a peer's report that it has quorum again (after the
// member connected to it while it had none) changes only a flag, and the member
// shows quorum:no until its next state change, for good when none comes
// (docs/drbd-quorum.md, "A peer's quorum reaches a diskless node late"). A
// change of the quorum option and back is such a state change; at q=32 the
// intermediate 31 decides the same, as no volume has 31 voters. The agent
// cannot see the peers' quorum flags, so a member whose peers really have no
// quorum is recomputed too, to no effect, at growing intervals.
//
// attached: the datamesh attaches the member; its recomputes are then
// staleQuorumAttachedRetry apart, the first one at once.
func (a *Agent) recomputeStaleQuorum(ctx context.Context, want *drbd.Resource, attached bool) time.Duration {
	q := drbd.QuorumCount(layout.NonVoterQuorum)
	snap, running := a.obs.Snapshot(want.Name)
	stale := running && want.Disk == nil && want.Options.Resource.Quorum == q && withoutQuorumBesideUpToDate(snap)
	now := time.Now()
	a.mu.Lock()
	ep, seen := a.staleQuorum[want.Name]
	if !stale {
		delete(a.staleQuorum, want.Name)
		a.mu.Unlock()
		if seen && ep.tries > 0 && running && quorate(snap) {
			a.log.Info("quorum:yes after recomputing it", "resource", want.Name, "recomputes", ep.tries,
				"after", now.Sub(ep.since).Round(time.Millisecond).String())
		}
		return 0
	}
	if !seen {
		ep = &staleQuorum{since: now, next: now.Add(staleQuorumGrace), every: staleQuorumFirstRetry}
		a.staleQuorum[want.Name] = ep
	}
	if attached && ep.tries > 0 && ep.next.Sub(now) > staleQuorumAttachedRetry {
		ep.next = now // attached since the last recompute: no growing wait
	}
	if now.Before(ep.next) {
		wait := ep.next.Sub(now)
		a.mu.Unlock()
		return wait
	}
	ep.tries++
	if attached {
		ep.every = staleQuorumAttachedRetry
	}
	ep.next = now.Add(ep.every)
	wait := ep.every
	if !attached {
		ep.every = min(2*ep.every, staleQuorumMaxRetry)
	}
	tries, since := ep.tries, ep.since
	a.mu.Unlock()
	a.log.Info("quorum:no while connected to an UpToDate peer; asking DRBD to recompute it (resource-options quorum)",
		"resource", want.Name, "for", now.Sub(since).Round(time.Millisecond).String(), "try", tries)
	if err := a.drv.RecomputeQuorum(ctx, want.Name, q); err != nil {
		a.log.Info("recomputing quorum failed; will retry", "resource", want.Name, "err", drbd.RedactSecrets(err.Error()))
	}
	return wait
}

// quorate: every device of the resource shows quorum:yes.
func quorate(s *drbd.ResourceState) bool {
	for _, d := range s.Devices {
		if !d.Quorum {
			return false
		}
	}
	return len(s.Devices) > 0
}

// withoutQuorumBesideUpToDate: a device shows quorum:no while a connection is
// up to a peer whose disk is UpToDate.
func withoutQuorumBesideUpToDate(s *drbd.ResourceState) bool {
	if quorate(s) || len(s.Devices) == 0 {
		return false
	}
	for _, c := range s.Connections {
		if c.State != "Connected" {
			continue
		}
		for _, p := range c.PeerDevices {
			if p.PeerDisk == "UpToDate" && p.Replication != "Off" {
				return true
			}
		}
	}
	return false
}
