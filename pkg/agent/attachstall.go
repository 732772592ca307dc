package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// The attach-stall watchdog. DRBD 9.2.18 now and then loses a peer's
// handshake when a disk is attached to a running resource that is connected
// to diskful peers (a LiminalDiskful member becoming Diskful, a returning
// node's fresh replica): the attaching node commits the cluster-wide change
// to its peers before it moves its own disk from Attaching to Negotiating,
// and a peer's answer that arrives in between is lost. No handshake with that
// peer ever runs, the disk stays Negotiating, every peer's receiver waits in
// WFBitMapS toward it, and `drbdsetup attach` waits with it, until the
// connection to that peer drops (test/vm/FINDINGS.md, "The product on real
// DRBD", 16: about one attach in eight there; no DRBD release fixes it).
// Dropping it ends the stall at once: the disk goes Inconsistent and resyncs
// from the other peers, and the peer connects again and hands shake as usual.
// Under a writer the peer's send buffer fills with the out-of-sync notes it
// cannot deliver, and DRBD's own ko-count drops the connection after about
// 65 s — on 9.2.18 with an oops in the peer's sender and a connection that
// never comes back; the watchdog drops it first, long before the buffer is
// full. The attaching node cannot tell which peer stalled (it shows every
// peer Established; every peer shows WFBitMapS toward it), so the watchdog
// cycles one connection at a time until the disk leaves Negotiating.
//
// It runs beside the reconciler, not in it: the reconcile that attached the
// disk is itself held in `drbdadm adjust` until the stall ends (or its
// command timeout kills it, 30 s by default).

const (
	// defaultAttachStallTimeout is how long a disk may be Negotiating before a
	// connection is cycled (Config.AttachStallTimeout). A negotiation takes
	// 8-49 ms on DRBD 9.2.18 (FINDINGS 16, the attaches that did not stall;
	// load up to 4.5), so 10 s is two hundred times the longest seen, and,
	// with a cycle every 10 s, the second of two peers (3D) is cycled at 20 s,
	// well before the ~65 s a writer needs to fill a stalled peer's send
	// buffer.
	// Cycling a connection that was not stalled costs one reconnect and
	// handshake with that peer: nothing is lost.
	defaultAttachStallTimeout = 10 * time.Second
	// attachStallMaxRound caps the growing wait between rounds of cycles
	// (every connected diskful peer once) while the disk stays Negotiating.
	attachStallMaxRound = 5 * time.Minute
)

// attachStall is one resource's episode of a Negotiating disk.
type attachStall struct {
	since time.Time // first seen Negotiating
	next  time.Time // the next cycle is due
	// round: the wait before the next round once every peer was cycled in
	// this one; it doubles each round.
	round  time.Duration
	cycled map[int]bool // peers cycled in this round, by node-id
	// log: the peers cycled in the whole episode, as "name(node-id)", in order.
	log []string
	// lastAt: when the last of them was cycled.
	lastAt time.Time
}

// noteNegotiating is the Observer's hook: a resource whose disk is
// Negotiating starts an episode, and the watchdog is woken to look at it (and
// at one that has left Negotiating, to end its episode).
func (a *Agent) noteNegotiating(c drbd.Change) {
	neg := c.State != nil && negotiating(c.State)
	a.mu.Lock()
	_, watched := a.attachStalls[c.Resource]
	if neg && !watched {
		a.attachStalls[c.Resource] = &attachStall{since: time.Now()}
	}
	a.mu.Unlock()
	if neg != watched {
		select {
		case a.attachWake <- struct{}{}:
		default:
		}
	}
}

// runAttachWatch is the watchdog's loop: it looks at the resources with a
// Negotiating disk when the Observer reports one and when a cycle is due.
// Cycles run one at a time for the whole node; a stall is rare, and a cycle is
// two drbdsetup calls.
func (a *Agent) runAttachWatch(ctx context.Context) error {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next := time.Duration(0)
		a.mu.Lock()
		names := slices.Sorted(maps.Keys(a.attachStalls))
		a.mu.Unlock()
		for _, name := range names {
			if ctx.Err() != nil {
				return nil
			}
			if w := a.checkAttachStall(ctx, name); w > 0 && (next == 0 || w < next) {
				next = w
			}
		}
		if next == 0 {
			next = time.Hour
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-a.attachWake:
		case <-t.C:
		}
	}
}

// checkAttachStall looks at one resource's episode: it ends it when the disk
// has left Negotiating, cycles the next connection when one is due, and
// returns when to look again (0: the episode is over).
func (a *Agent) checkAttachStall(ctx context.Context, name string) time.Duration {
	snap, running := a.obs.Snapshot(name)
	now := time.Now()
	bound := a.cfg.AttachStallTimeout
	a.mu.Lock()
	ep := a.attachStalls[name]
	if ep == nil {
		a.mu.Unlock()
		return 0
	}
	if !running || !negotiating(snap) {
		delete(a.attachStalls, name)
		a.mu.Unlock()
		if len(ep.log) > 0 {
			// Seen here within moments of the last cycle when that was the
			// stalled peer's connection (the disk leaves Negotiating in the
			// disconnect's own state change); later, it was something else: a
			// later cycle's reconnect, a peer's ko-count, a detach.
			disk := "gone (the resource is down)"
			if running {
				disk = deviceDisks(snap)
			}
			a.log.Info("attach stall over: the disk left Negotiating", "resource", name, "disk", disk,
				"after", now.Sub(ep.since).Round(time.Millisecond).String(), "cycled", ep.log,
				"lastCycled", ep.log[len(ep.log)-1], "sinceLastCycle", now.Sub(ep.lastAt).Round(time.Millisecond).String())
		}
		return 0
	}
	if ep.next.IsZero() {
		ep.next, ep.round, ep.cycled = ep.since.Add(bound), 2*bound, map[int]bool{}
	}
	if now.Before(ep.next) {
		a.mu.Unlock()
		return ep.next.Sub(now)
	}
	peer := nextToCycle(snap, ep.cycled)
	if peer == nil {
		// Every connected diskful peer has been cycled once since the disk went
		// Negotiating and it still is: something other than a lost handshake,
		// or a peer that answered late again. Try again, less often.
		wait := ep.round
		ep.cycled, ep.next, ep.round = map[int]bool{}, now.Add(wait), min(2*ep.round, attachStallMaxRound)
		a.mu.Unlock()
		a.log.Info("attach stall: still Negotiating after a cycle of every connected diskful peer; another round later",
			"resource", name, "for", now.Sub(ep.since).Round(time.Millisecond).String(), "cycled", ep.log, "next round in", wait.String())
		return wait
	}
	a.mu.Unlock()
	if !a.wantsDisk(ctx, name) {
		// The datamesh no longer renders a disk here: the reconcile detaches it,
		// and a detach ends the wait as well (FINDINGS 16).
		a.mu.Lock()
		ep.next = now.Add(bound)
		a.mu.Unlock()
		return bound
	}
	a.mu.Lock()
	ep.cycled[peer.PeerNodeID] = true
	who := peer.Name + "(" + strconv.Itoa(peer.PeerNodeID) + ")"
	ep.log = append(ep.log, who)
	ep.next, ep.lastAt = now.Add(bound), now
	since, n := ep.since, len(ep.log)
	a.mu.Unlock()
	attachStallCycles.Inc()
	a.log.Info("attach stall: the disk has been Negotiating too long (a DRBD 9.2 attach that lost a peer's handshake); cycling one connection",
		"resource", name, "for", now.Sub(since).Round(time.Millisecond).String(), "peer", who, "peerRole", peer.PeerRole, "cycle", n)
	if err := a.cycle(ctx, name, peer, who); err != nil {
		a.log.Info("attach stall: cycling the connection failed; the next peer in turn", "resource", name, "peer", who,
			"err", drbd.RedactSecrets(err.Error()))
	}
	return bound
}

// cycle disconnects peer and connects it again. A Primary refuses the
// unforced disconnect when it would lose its quorum by it: a Secondary that
// disconnects from a Primary proposes to outdate itself (drbd_state.c
// outdate_on_disconnect), so the Primary counts this member out and, under an
// explicit q, may fall short — on DRBD 9.2.18 a 2D+1TB Primary refused it with
// its TieBreaker connected, "No quorum (-25)" (test/vm/drbd TestReconnect),
// and a 1D volume growing to 2D is the same. Then the disconnect is forced: a
// hard one, which the Primary takes as a lost connection. It may lose quorum
// for the moment this node takes to connect again; under on-no-quorum
// suspend-io, meshvol's default (pkg/drbd DefaultOptions), it holds its writes
// meanwhile and completes them after, which is what test/vm/drbd TestReconnect
// checks on DRBD 9.2.18. Under io-error (a class's choice) it would fail them:
// then the disconnect is not forced, and the stall is left to DRBD (the
// peer's ko-count; DRBD 9.2.19 or later recovers from it). The option is read
// from this node's running resource: the class and the volume set it alike on
// every replica.
func (a *Agent) cycle(ctx context.Context, name string, peer *drbd.ConnectionState, who string) error {
	err := a.drv.Reconnect(ctx, name, peer.PeerNodeID, drbd.NoForce)
	refused := errors.Is(err, drbd.ErrStateChangeRefused) || errors.Is(err, drbd.ErrNoQuorum)
	if err == nil || peer.PeerRole != "Primary" || !refused {
		return err
	}
	onq, serr := a.onNoQuorum(ctx, name)
	if serr != nil {
		return fmt.Errorf("%w; not forced: on-no-quorum unknown: %v", err, serr)
	}
	if onq != drbd.OnNoQuorumSuspendIO {
		return fmt.Errorf("%w; not forced: under on-no-quorum %s the Primary would fail its writes while it lacks this member's vote", err, onq)
	}
	a.log.Info("attach stall: the Primary refused the disconnect (it would lose quorum without this member); forcing it: under on-no-quorum suspend-io it holds its writes until this node connects again",
		"resource", name, "peer", who, "refused", drbd.RedactSecrets(err.Error()))
	return a.drv.Reconnect(ctx, name, peer.PeerNodeID,
		"attach stall: the disk stays Negotiating, the Primary's handshake lost, and the Primary refused a graceful disconnect (test/vm/FINDINGS.md 16)")
}

// onNoQuorum is the on-no-quorum policy the kernel runs the resource with
// (drbdsetup show omits the default, suspend-io: applied.go).
func (a *Agent) onNoQuorum(ctx context.Context, name string) (drbd.OnNoQuorum, error) {
	show, err := a.drv.Show(ctx, name)
	if err != nil {
		return "", err
	}
	if len(show) != 1 {
		return "", fmt.Errorf("drbdsetup show %s: %d resources", name, len(show))
	}
	if v, ok := show[0].Options["on-no-quorum"]; ok {
		return drbd.OnNoQuorum(v), nil
	}
	return drbd.OnNoQuorumSuspendIO, nil
}

// nextToCycle is the next connection to cycle: a Connected peer with a disk
// not cycled yet in this round, Secondaries first (by node-id), the Primary's
// last. A Primary counts this member among its voters (docs/datamesh.md,
// "Liminal members run diskless; their diskful peers count them"), so dropping
// its connection can cost it quorum where the others do not: DRBD refuses the
// unforced disconnect then, and forcing it (cycle) holds the Primary's writes
// for a moment.
func nextToCycle(s *drbd.ResourceState, cycled map[int]bool) *drbd.ConnectionState {
	var cands []*drbd.ConnectionState
	for _, c := range s.Connections {
		if c.State == "Connected" && !cycled[c.PeerNodeID] && peerHasDisk(c) {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	slices.SortFunc(cands, func(x, y *drbd.ConnectionState) int {
		if px, py := x.PeerRole == "Primary", y.PeerRole == "Primary"; px != py {
			if px {
				return 1
			}
			return -1
		}
		return x.PeerNodeID - y.PeerNodeID
	})
	return cands[0]
}

// peerHasDisk: the peer reports a disk (a diskless peer runs no handshake of
// UUIDs with an attaching disk, so it cannot be the one lost).
func peerHasDisk(c *drbd.ConnectionState) bool {
	for _, p := range c.PeerDevices {
		switch p.PeerDisk {
		case "", "Diskless", "DUnknown", "Attaching", "Detaching", "Failed":
		default:
			return true
		}
	}
	return false
}

// negotiating: a device of the resource is Negotiating, which only an attach
// leads to (DRBD's D_NEGOTIATING follows D_ATTACHING).
func negotiating(s *drbd.ResourceState) bool {
	for _, d := range s.Devices {
		if d.DiskState == "Negotiating" {
			return true
		}
	}
	return false
}

func deviceDisks(s *drbd.ResourceState) string {
	var out []string
	for _, v := range slices.Sorted(maps.Keys(s.Devices)) {
		out = append(out, s.Devices[v].DiskState)
	}
	return strings.Join(out, ",")
}

// wantsDisk: this node's replica of the volume is a member whose type the
// agent renders with its disk (render: Type.HasDisk), read from the cache.
func (a *Agent) wantsDisk(ctx context.Context, volume string) bool {
	rv := &v1.ReplicatedVolume{}
	if err := a.cache.Get(ctx, types.NamespacedName{Name: volume}, rv); err != nil {
		return false
	}
	for _, req := range a.replicasOf(ctx, volume) {
		rvr := &v1.ReplicatedVolumeReplica{}
		if err := a.cache.Get(ctx, req.NamespacedName, rvr); err != nil || rvr.Spec.NodeName != a.cfg.NodeName {
			continue
		}
		if m := memberOf(rv, rvr.Name); m != nil && m.Type.HasDisk() {
			return true
		}
	}
	return false
}
