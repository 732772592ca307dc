package drbdsim

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/quorum"
)

// settle drives the cluster to a fixpoint after any change: connections,
// handshakes, bitmap exchanges, peers' reported states and quorum. It then
// applies pending cluster-wide agreements and publishes events. Called with
// c.mu held. It looks at every resource of every node: for a change that
// concerns the whole cluster (a crash, a partition); a command on one
// resource settles that resource alone (settleResource).
func (c *Cluster) settle() { c.settleScope(nil) }

// settleResource settles the resources called name, on every node. DRBD's
// resources are independent of each other: connections, handshakes, resyncs
// and quorum are between the nodes of one resource, so a command on one
// resource changes no other, and its settle costs what that resource has,
// not what the cluster holds.
func (c *Cluster) settleResource(name string) { c.settleScope(map[string]bool{name: true}) }

// settleScope settles the resources whose names are in scope, or every
// resource when scope is nil, then records when each of them next depends on
// the clock (wakes).
func (c *Cluster) settleScope(scope map[string]bool) {
	c.scope = scope
	defer func() { c.scope = nil }()
	for range 8 {
		c.settleOnce()
		if len(c.pending) == 0 && len(c.lostPeer) == 0 {
			break
		}
		pending, lostPeer := c.pending, c.lostPeer
		c.pending, c.lostPeer = nil, nil
		for _, r := range pending {
			if r.n.res[r.name] == r && !r.n.crashed {
				c.agreement(r)
			}
		}
		for _, r := range lostPeer {
			if r.n.res[r.name] == r && !r.n.crashed {
				c.lostPeerAgreement(r)
			}
		}
	}
	for _, r := range c.runningResources() {
		susp := r.role == rolePrimary && !r.quorate && r.cfg.Options.Resource.OnNoQuorum == drbd.OnNoQuorumSuspendIO
		if !susp {
			r.suspendedQuorum = false
		}
		r.publish()
	}
	c.recordWriters()
	c.recordWakes()
	c.cond.Broadcast()
}

// recordWakes notes, for each resource name settled, the earliest virtual
// time at which the clock alone changes something: a resync or verify step
// (now), the end of a bitmap exchange, a connect attempt. Advance settles
// only the names whose time has come, so a cluster at rest costs nothing
// per tick however many resources it runs.
func (c *Cluster) recordWakes() {
	if c.scope == nil {
		clear(c.wakes)
	} else {
		for name := range c.scope {
			delete(c.wakes, name)
		}
	}
	for _, r := range c.runningResources() {
		for _, k := range r.conns {
			at, ok := c.wakeOf(k)
			if !ok {
				continue
			}
			if cur, seen := c.wakes[r.name]; !seen || at.Before(cur) {
				c.wakes[r.name] = at
			}
		}
	}
}

// wakeOf is when the clock next matters to connection k, if it does.
func (c *Cluster) wakeOf(k *conn) (time.Time, bool) {
	switch {
	case k.repl == replVerifyS:
		return c.now, true
	case k.repl == replSyncSource || k.repl == replWFBitMapS:
		if k.wfUntil.After(c.now) {
			return k.wfUntil, true
		}
		return c.now, k.repl == replSyncSource
	case k.cstate == connConnecting && !k.pathUp && k.nextTry.After(c.now):
		return k.nextTry, true
	}
	return time.Time{}, false
}

// dueScope is the set of resource names whose wake time has come, nil when
// none has.
func (c *Cluster) dueScope() map[string]bool {
	var due map[string]bool
	for name, at := range c.wakes {
		if at.After(c.now) {
			continue
		}
		if due == nil {
			due = map[string]bool{}
		}
		due[name] = true
	}
	return due
}

func (c *Cluster) settleOnce() {
	for range 64 {
		changed := false
		type attempt struct {
			r, pr  *resource
			k, pk  *conn
			authOK bool
		}
		var through []attempt
		for _, r := range c.runningResources() {
			for _, k := range r.sortedConns() {
				pr := c.peerResource(r, k)
				var pk *conn
				if pr != nil {
					pk = pr.conns[r.nodeID()]
				}
				reach := c.reachable(r, k, pr, pk)
				switch {
				case reach && k.cstate == connConnecting && pk.cstate == connConnecting && !k.pathUp && (c.due(k) || c.due(pk)):
					// A connect attempt of either side gets through.
					through = append(through, attempt{r, pr, k, pk, authenticated(r, pr)})
					k.pathUp, pk.pathUp = true, true
				case !reach && k.connected():
					c.lose(r, k, connNetworkFailure)
					changed = true
				case !reach && k.cstate == connConnecting && c.due(k):
					// A failed attempt: the next one is connect-int later.
					k.nextTry = c.now.Add(c.opts.ConnectInt)
				}
			}
		}
		// Connections made at the same moment come up together: every
		// path first, then each connection's state change.
		for _, a := range through {
			if a.authOK {
				a.r.publishPath(a.pr.nodeID())
				a.pr.publishPath(a.r.nodeID())
			}
		}
		for _, a := range through {
			r, k, pr, pk := a.r, a.k, a.pr, a.pk
			changed = true
			switch {
			case a.authOK:
				c.establish(r, k, pr, pk)
			default:
				k.pathUp, pk.pathUp = false, false
				{
					// DRBD: "Authentication of peer failed": both sides
					// drop to StandAlone and do not retry; `adjust`
					// (with matching secrets) connects again.
					c.standAlone(r, k, pr, pk, false, "Authentication of peer failed")
				}
			}
		}
		// Peers' reports first, so that a state change a peer made (a
		// promotion, an UpToDate disk) is published before the handshake
		// it causes (contract-real.node2.seq: role:Primary, then WFBitMapT).
		for _, r := range c.runningResources() {
			viewChanged := false
			for _, k := range r.sortedConns() {
				if pr := c.peerResource(r, k); pr != nil && k.connected() && c.refreshPeerView(r, k, pr) {
					viewChanged = true
				}
			}
			if viewChanged {
				r.publish()
				changed = true
			}
		}
		for _, r := range c.runningResources() {
			for _, k := range r.sortedConns() {
				pr := c.peerResource(r, k)
				if pr == nil || !k.connected() {
					continue
				}
				pk := pr.conns[r.nodeID()]
				if pk == nil || !pk.connected() {
					continue
				}
				if !k.handshaken && r.negotiated() && pr.negotiated() {
					c.handshake(r, k, pr, pk)
					r.publish()
					pr.publish()
					changed = true
				}
				if k.repl == replWFBitMapS && !c.now.Before(k.wfUntil) {
					c.beginResync(r, k, pr, pk)
					changed = true
				}
			}
		}
		for _, r := range c.runningResources() {
			view := c.quorumView(r)
			if view == r.quorumView {
				continue
			}
			flagsOnly := c.quorumBasis(r) == r.quorumBasis
			c.noteQuorumView(r)
			q := c.computeQuorum(r)
			if flagsOnly && q.Quorate && !r.quorate {
				// Only a peer's report of its own quorum changed: DRBD sets
				// the peer's quorate flag (drbd_receiver.c receive_state,
				// PEER_QUORATE) in a state change that changes nothing else,
				// which try_state_change ends as SS_NOTHING_TO_DO before
				// sanitize_state computes quorum (drbd_state.c). A node
				// without a disk that gains quorum only through that report
				// keeps showing quorum:no until its next real state change
				// or a forced recompute (RecomputeQuorum): test/vm/FINDINGS.md,
				// "The product on real DRBD", 13. The loss the same code
				// leaves stale (quorum:yes after the peer reported no) was
				// not observed on DRBD and is not modelled.
				continue
			}
			if r.showQuorum(q.Quorate) {
				changed = true
			}
		}
		if !changed {
			return
		}
	}
}

// due: k's next connect attempt is now (DRBD tries once when a connection
// starts Connecting, then every connect-int).
func (c *Cluster) due(k *conn) bool { return !c.now.Before(k.nextTry) }

// runningResources lists every running resource in a stable order, or,
// while a settle is scoped (settleResource), those of the scope's names.
func (c *Cluster) runningResources() []*resource {
	var out []*resource
	var names []string
	if c.scope != nil {
		names = sortedKeys(c.scope)
	}
	for _, name := range c.nodeNames() {
		n := c.nodes[name]
		if n.crashed {
			continue
		}
		if c.scope == nil {
			names = sortedKeys(n.res)
		}
		for _, rn := range names {
			if r := n.res[rn]; r != nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// reachable: both ends run the resource, are configured for each other
// and the network lets them through; a connection attempt reaches the peer.
func (c *Cluster) reachable(r *resource, k *conn, pr *resource, pk *conn) bool {
	if pr == nil || pk == nil {
		return false
	}
	if !c.linked(r.n.name, pr.n.name) {
		return false
	}
	return k.peer.NodeID == pr.nodeID() && k.peer.Address == pr.cfg.Self.Address && pk.peer.Address == r.cfg.Self.Address
}

// authenticated: the two ends agree on the shared secret and the HMAC,
// and on the verify-alg (DRBD drops a peer whose verify-alg differs).
func authenticated(r, pr *resource) bool {
	a, b := r.cfg.Options.Net, pr.cfg.Options.Net
	return a.SharedSecret == b.SharedSecret && a.CramHMACAlg == b.CramHMACAlg && a.VerifyAlg == b.VerifyAlg
}

// establish brings a connection up on both ends (a cluster-wide agreement).
// DRBD compares the generation UUIDs before it reports the connection, so
// the replication state goes from Off straight to the handshake's result:
// Established, or WFBitMapS/T when a resync follows (contract-real seqs).
func (c *Cluster) establish(r *resource, k *conn, pr *resource, pk *conn) {
	var p syncPlan
	if r.negotiated() && pr.negotiated() {
		p = plan(r, pr)
	}
	if why := c.connectRefusal(r, pr, p); why != "" {
		c.refuseConnect(r, k, pr, pk, p, why)
		return
	}
	for _, e := range []struct {
		self, peer *resource
		k          *conn
	}{{r, pr, k}, {pr, r, pk}} {
		e.k.cstate = connConnected
		e.k.repl = replEstablished
		e.k.handshaken = false
		e.k.standAloneMsg, e.k.splitBrain = "", false
		e.k.peerRole = e.peer.role
		e.k.peerDisk = e.peer.disk
		e.k.peerQuorate = e.peer.quorate
		e.k.peerNonVoting = e.peer.cfg.Options.Disk.NonVoting
		delete(e.self.outdated(), e.peer.nodeID())
		if e.self.md != nil {
			e.self.md.peer(e.peer.nodeID()).outdated = false
		}
	}
	if r.negotiated() && pr.negotiated() {
		c.handshake(r, k, pr, pk)
		if k.cstate != connConnected {
			k.pathUp, pk.pathUp = false, false
			return // split brain or unrelated data: StandAlone
		}
		k.peerDisk, pk.peerDisk = pr.disk, r.disk
	}
	c.resyncOnDisklessPrimary(r, pr)
	c.resyncOnDisklessPrimary(pr, r)
	k.pathUp, pk.pathUp = false, false // Connected now says it
	// DRBD's order: the path comes up, then the state change that carries
	// the connection, the new quorum and the peer's disk.
	for _, x := range []*resource{r, pr} {
		x.publishOnly(onlyPaths)
		x.quorate = c.computeQuorum(x).Quorate
		c.noteQuorumView(x)
		x.publish()
	}
	c.pending = append(c.pending, r)
}

// resyncOnDisklessPrimary: x, a disk below UpToDate, has just connected to
// peer, a diskless Primary. DRBD 9.2.18 then gets x resynced from the best
// UpToDate peer it is connected to, over a connection that may have been up
// for long (drbd_state.c, "Got connected to a diskless primary" sets
// TRY_TO_GET_RESYNC; drbd_receiver.c, drbd_try_to_get_resynced: the
// handshake's strategy with each UpToDate peer, a resync from the best, or
// UpToDate at once when nothing differs). Here: the handshake with the first
// such peer runs again at the next settle.
func (c *Cluster) resyncOnDisklessPrimary(x, peer *resource) {
	if !x.attached() || peer.attached() || peer.role != rolePrimary || (x.disk != DiskOutdated && x.disk != DiskConsistent) {
		return
	}
	for _, k := range x.sortedConns() {
		z := c.peerResource(x, k)
		if z == nil || !k.connected() || k.repl != replEstablished || !z.attached() || z.disk != DiskUpToDate {
			continue
		}
		if zk := z.conns[x.nodeID()]; zk != nil && zk.connected() {
			k.handshaken, zk.handshaken = false, false
			return
		}
	}
}

// connectRefusal is why DRBD refuses the cluster-wide state change that
// would connect r and pr, or "". The handshake (plan) runs first: a Primary
// that would become SyncTarget is refused ("I shall become SyncTarget, but
// I am primary!"). Then the connect, a two-phase commit over both sides'
// connected nodes, fails with SS_TWO_PRIMARIES when it would put two
// Primaries in one connected cluster without allow-two-primaries
// (drbd_state.c, check_primaries_distances): a Primary cut off by a
// partition does not rejoin, directly or through a diskless node, a side
// that promoted meanwhile. Split brain and unrelated data are the
// handshake's own refusals (handshake).
func (c *Cluster) connectRefusal(r, pr *resource, p syncPlan) string {
	if p.primaryTarget() {
		return "I shall become SyncTarget, but I am primary!"
	}
	if p.kind == planSplitBrain || p.kind == planUnrelated {
		return ""
	}
	if initiator(r, pr).cfg.Options.Net.AllowTwoPrimaries {
		return ""
	}
	primaries := map[*resource]bool{}
	for _, x := range append(c.component(r), c.component(pr)...) {
		if x.role == rolePrimary {
			primaries[x] = true
		}
	}
	if len(primaries) > 1 {
		return "Multiple primaries not allowed by config"
	}
	return ""
}

// initiator is the end of a connection that runs the connect's two-phase
// commit: the lower node-id (drbd_receiver.c, conn_connect).
func initiator(r, pr *resource) *resource {
	if pr.nodeID() < r.nodeID() {
		return pr
	}
	return r
}

// refuseConnect is a failed connect with rr-conflict's default
// (disconnect): the initiator sends a disconnect and both ends go
// StandAlone. Before that the initiator applies what the handshake taught
// it (drbd_receiver.c, apply_local_state_change): if the peer has newer data
// (the plan makes it the SyncTarget), its disk goes Outdated — as a
// Secondary, and as a Primary whose IO is suspended while
// on-no-data-accessible is io-error, which then fails that IO (the
// Primary has no UpToDate data left). A Primary that still serves IO keeps
// its disk state: DRBD never outdates it from under its users.
func (c *Cluster) refuseConnect(r *resource, k *conn, pr *resource, pk *conn, p syncPlan, why string) {
	k.pathUp, pk.pathUp = false, false
	if in := initiator(r, pr); p.kind == planSync && p.dst == in && (in.disk == DiskUpToDate || in.disk == DiskConsistent) &&
		(in.role != rolePrimary || (in.suspended() && in.failsWithoutData())) {
		in.setDisk(DiskOutdated)
	}
	c.standAlone(r, k, pr, pk, false, why)
}

// suspended: DRBD holds the resource's IO, by suspend-io or for lack of
// quorum under on-no-quorum suspend-io (DRBD suspends as soon as quorum is
// gone, before any IO arrives).
func (r *resource) suspended() bool {
	return r.suspendedUser || (r.role == rolePrimary && !r.quorate && r.cfg.Options.Resource.Quorum != drbd.QuorumOff &&
		r.cfg.Options.Resource.OnNoQuorum == drbd.OnNoQuorumSuspendIO)
}

// failsWithoutQuorum: on-no-quorum io-error on a device without quorum:
// DRBD fails every request of the device with EIO, reads included, and
// completes those it held suspended with EIO (drbd_state.c: cached_err_io;
// drbd_req.c: drbd_submit_bio, and a request's completion without quorum).
func (r *resource) failsWithoutQuorum() bool {
	return r.cfg.Options.Resource.Quorum != drbd.QuorumOff && !r.quorate &&
		r.cfg.Options.Resource.OnNoQuorum != drbd.OnNoQuorumSuspendIO
}

// failsWithoutData: on-no-data-accessible io-error (DRBD's default): a
// Primary without UpToDate data in reach fails every request with EIO,
// suspended or not (drbd_state.c, cached_err_io).
func (r *resource) failsWithoutData() bool {
	return r.cfg.Options.Resource.OnNoDataAccessible != drbd.OnNoDataAccessibleSuspendIO
}

// lose takes a connection down on r's side after a failure (how is the
// state DRBD reports first: NetworkFailure, BrokenPipe, TearDown).
func (c *Cluster) lose(r *resource, k *conn, how string) {
	k.cstate = how
	k.pathUp = false
	lostPrimary := k.peerRole == rolePrimary
	k.peerRole = roleUnknown
	k.repl = replOff
	k.peerDisk = DiskUnknown
	k.peerQuorate = false
	k.rsTotal = 0
	r.endNegotiation(k)
	// A Secondary that loses its Primary cannot know what the Primary
	// wrote last: DRBD shows its disk Consistent in the same state change,
	// and UpToDate again right after (contract-real.node2.seq, 57-63).
	consistentBlip := how != connTearDown && lostPrimary && r.role != rolePrimary && r.attached() && r.disk == DiskUpToDate
	lost := false
	if how == connTearDown {
		// A graceful departure is the peer's state change, not ours: the
		// displayed quorum is not recomputed (it may go stale).
		c.noteQuorumView(r)
	} else {
		q := c.computeQuorum(r)
		lost = r.quorate && !q.Quorate
		r.quorate = q.Quorate
		c.noteQuorumView(r)
	}
	// DRBD's order: the state change (connection, device, peer-device),
	// the quorum-lost helper, the path, the disconnected helper.
	if consistentBlip {
		r.disk = DiskConsistent // shown, not counted: quorum was computed above
	}
	r.publishOnly(allButPath)
	if lost && r.role == rolePrimary {
		r.helper("quorum-lost", true)
	}
	if consistentBlip {
		r.disk = DiskUpToDate
		r.publishOnly(allButPath)
	}
	r.publishOnly(onlyPaths)
	r.peerHelper(k, "disconnected")
	k.cstate = connUnconnected
	r.publish()
	k.cstate = connConnecting
	// The first attempt is at once; while the link is down it fails and the
	// next is connect-int later, so a link that comes back is used only at
	// that next attempt.
	k.nextTry = c.now
	r.publish()
	// A connection lost without a goodbye (not TearDown) starts an empty
	// cluster-wide state change over the nodes still reachable, which
	// become the quorate participants' members set (drbd_state.c,
	// update_members and drbd_need_twopc_after_lost_peer): from then on the
	// lost peer is quorumless there and leaves the electorate, which an
	// explicit `quorum N` above the nodes left cannot follow
	// (docs/drbd-quorum.md, "A lost peer leaves the members set").
	if how != connTearDown && r.members[k.peer.NodeID] {
		c.lostPeer = append(c.lostPeer, r)
	}
}

// refreshPeerView copies what the peer reports over a live connection.
func (c *Cluster) refreshPeerView(r *resource, k *conn, pr *resource) bool {
	nv := pr.cfg.Options.Disk.NonVoting
	changed := k.peerRole != pr.role || k.peerDisk != pr.disk || k.peerQuorate != pr.quorate || k.peerNonVoting != nv
	k.peerRole, k.peerDisk, k.peerQuorate, k.peerNonVoting = pr.role, pr.disk, pr.quorate, nv
	return changed
}

// syncPlan is what comparing two replicas' generation UUIDs decides
// (DRBD's drbd_uuid_compare), before anything changes: the connect that
// carries it may still be refused (connectRefusal).
type syncPlan struct {
	kind     planKind
	src, dst *resource // planSync: who sends, who receives
	full     bool      // planSync: every block, not only the bitmap's
}

type planKind int

const (
	planNothing    planKind = iota // both just created: "no-sync by rule=just-created-both"
	planNoSync                     // same data
	planSync                       // a resync from src to dst
	planSplitBrain                 // both changed since they parted
	planUnrelated                  // no common ancestor
)

// plan decides like DRBD's uuid_compare between no sync, a bitmap-based
// or full resync, split brain and unrelated data. It changes nothing.
func plan(a, b *resource) syncPlan {
	am, bm := a.md, b.md
	apm, bpm := am.peer(b.nodeID()), bm.peer(a.nodeID())
	sync := func(src, dst *resource, full bool) syncPlan {
		return syncPlan{kind: planSync, src: src, dst: dst, full: full}
	}
	switch {
	case am.current == uuidJustCreated && bm.current == uuidJustCreated:
		return syncPlan{kind: planNothing}
	case am.current == bm.current:
		if outOfSync(a, b) == 0 {
			return syncPlan{kind: planNoSync}
		}
		if better(b, a) {
			return sync(b, a, false)
		}
		return sync(a, b, false)
	case bm.current == uuidJustCreated:
		return sync(a, b, true) // "source-set-bitmap by rule=just-created-peer"
	case am.current == uuidJustCreated:
		return sync(b, a, true)
	case apm.bitmapUUID != 0 && apm.bitmapUUID == bm.current:
		return sync(a, b, false) // b came back: sync what changed
	case bpm.bitmapUUID != 0 && bpm.bitmapUUID == am.current:
		return sync(b, a, false)
	case am.inHistory(bm.current):
		return sync(a, b, true) // b is behind and the bitmap is gone
	case bm.inHistory(am.current):
		return sync(b, a, true)
	case related(am, bm):
		return syncPlan{kind: planSplitBrain}
	}
	return syncPlan{kind: planUnrelated}
}

// primaryTarget: the plan would make a Primary with good data the
// SyncTarget of blocks it would have to receive. DRBD refuses that under
// its users: with rr-conflict's default (disconnect) it logs "I shall become
// SyncTarget, but I am primary!" and the connection is dropped
// (drbd_receiver.c, drbd_sync_handshake).
func (p syncPlan) primaryTarget() bool {
	dst := p.dst
	return p.kind == planSync && dst.role == rolePrimary && (dst.disk == DiskUpToDate || dst.disk == DiskConsistent) &&
		(p.full || outOfSync(p.src, dst) > 0)
}

// handshake compares generation UUIDs (plan) and acts on the result: no
// sync, a resync, or StandAlone for split brain and unrelated data.
func (c *Cluster) handshake(a *resource, ka *conn, b *resource, kb *conn) {
	ka.handshaken, kb.handshaken = true, true
	p := plan(a, b)
	switch p.kind {
	case planNoSync:
		c.noSync(a, b)
	case planSync:
		kSrc, kDst := ka, kb
		if p.src == b {
			kSrc, kDst = kb, ka
		}
		c.resync(p, kSrc, kDst)
	case planSplitBrain:
		c.standAlone(a, ka, b, kb, true, "Split-Brain detected but unresolved, dropping connection!")
	case planUnrelated:
		c.standAlone(a, ka, b, kb, false, "Unrelated data, aborting!")
	}
}

// better: x is the better sync source than y when both hold the same
// generation (an interrupted resync, or a Primary's writes).
func better(x, y *resource) bool {
	rank := func(r *resource) int {
		switch {
		case r.role == rolePrimary:
			return 4
		case r.disk == DiskUpToDate:
			return 3
		case r.disk == DiskConsistent:
			return 2
		case r.disk == DiskOutdated:
			return 1
		}
		return 0
	}
	return rank(x) > rank(y)
}

// related: the two replicas share an ancestor generation, so each changed
// on its own since they parted.
func related(a, b *metadata) bool {
	anc := map[uint64]bool{}
	for _, u := range a.history {
		anc[u] = true
	}
	for _, p := range a.peers {
		if p.bitmapUUID != 0 {
			anc[p.bitmapUUID] = true
		}
	}
	if anc[b.current] {
		return true
	}
	for _, u := range b.history {
		if anc[u] {
			return true
		}
	}
	for _, p := range b.peers {
		if p.bitmapUUID != 0 && anc[p.bitmapUUID] {
			return true
		}
	}
	return false
}

func (c *Cluster) noSync(a, b *resource) {
	a.md.peer(b.nodeID()).bitmapUUID = 0
	b.md.peer(a.nodeID()).bitmapUUID = 0
	// Same generation and nothing out of sync: a Consistent or Outdated
	// replica is as good as its UpToDate peer.
	if a.disk == DiskUpToDate || b.disk == DiskUpToDate || (a.disk == DiskConsistent && b.disk == DiskConsistent) {
		for _, x := range []*resource{a, b} {
			if x.disk == DiskConsistent || x.disk == DiskOutdated {
				x.setDisk(DiskUpToDate)
			}
		}
	}
}

// resync starts the planned resync, unless it would make a Primary the
// SyncTarget (syncPlan.primaryTarget): on a connection that is already up
// (a disk attached under it) the connection drops to StandAlone. A
// connection coming up is refused before that (connectRefusal).
func (c *Cluster) resync(p syncPlan, ks, kd *conn) {
	if p.primaryTarget() {
		c.standAlone(p.src, ks, p.dst, kd, false, "I shall become SyncTarget, but I am primary!")
		return
	}
	c.startSync(p.src, ks, p.dst, kd, p.full)
}

// outOfSync counts the blocks either side marks out of sync for the other.
func outOfSync(a, b *resource) int64 {
	union := slices.Clone(a.md.peer(b.nodeID()).bits)
	union.or(b.md.peer(a.nodeID()).bits)
	return union.count()
}

func (c *Cluster) startSync(src *resource, ks *conn, dst *resource, kd *conn, full bool) {
	sp, dp := src.md.peer(dst.nodeID()), dst.md.peer(src.nodeID())
	if full {
		sp.bits.setAll(src.md.blocks())
	}
	sp.bits.or(dp.bits)
	dp.bits.or(sp.bits)
	if src.disk == DiskConsistent {
		src.setDisk(DiskUpToDate)
	}
	src.bmWrites++
	dst.bmWrites++
	ks.repl, kd.repl = replWFBitMapS, replWFBitMapT
	// A sync target is at most Outdated from the bitmap exchange on (DRBD 9.2's
	// sanitize_state: L_WF_BITMAP_T caps the disk at D_OUTDATED): a disk that came
	// back UpToDate from its metadata stops counting as current the moment the
	// handshake finds a newer peer.
	if dst.disk == DiskUpToDate || dst.disk == DiskConsistent {
		dst.setDisk(DiskOutdated)
	}
	ks.wfUntil, kd.wfUntil = c.now.Add(c.opts.BitmapExchange), c.now.Add(c.opts.BitmapExchange)
	ks.rsTotal, kd.rsTotal = sp.bits.count(), sp.bits.count()
}

// beginResync ends the bitmap exchange: the before-resync helpers run,
// then the target's disk goes Inconsistent with SyncTarget in one state
// change, and the source sees SyncSource, then the target's Inconsistent
// (contract-real.node1/node2.seq).
func (c *Cluster) beginResync(src *resource, ks *conn, dst *resource, kd *conn) {
	src.peerHelperVol(ks, "before-resync-source")
	dst.peerHelperVol(kd, "before-resync-target")
	dst.setDisk(DiskInconsistent)
	ks.repl, kd.repl = replSyncSource, replSyncTarget
	ks.rsStarted, kd.rsStarted = c.now, c.now
	dst.publish()
	src.publish()
	c.refreshPeerView(src, ks, dst)
	src.publish()
}

func (c *Cluster) standAlone(a *resource, ka *conn, b *resource, kb *conn, splitBrain bool, msg string) {
	for _, e := range []struct {
		r *resource
		k *conn
	}{{a, ka}, {b, kb}} {
		e.k.cstate = connStandAlone
		e.k.repl = replOff
		e.k.peerRole = roleUnknown
		e.k.peerDisk = DiskUnknown
		e.k.splitBrain = splitBrain
		e.k.standAloneMsg = msg
		if splitBrain {
			e.r.peerHelper(e.k, "split-brain")
		}
		e.r.publish()
	}
}

// progressResyncs moves every running resync forward by d of virtual time.
func (c *Cluster) progressResyncs(d time.Duration) {
	budget := c.opts.ResyncRate * int64(d) / int64(time.Second) / blockSize
	if budget < 1 {
		budget = 1
	}
	for _, r := range c.runningResources() {
		for _, k := range r.sortedConns() {
			if k.repl == replVerifyS {
				c.progressVerify(r, k, budget)
				continue
			}
			if k.repl != replSyncSource || c.now.Before(k.wfUntil) {
				continue
			}
			pr := c.peerResource(r, k)
			if pr == nil || !pr.attached() || !r.attached() {
				continue
			}
			pk := pr.conns[r.nodeID()]
			kib := resyncBlocks(r, pr, budget) * blockSize / 1024
			k.sent += kib
			pk.received += kib
			pr.written += kib
			r.read += kib
			if r.md.peer(pr.nodeID()).bits.count() == 0 {
				c.finishSync(r, k, pr, pk)
			}
		}
	}
}

// resyncBlocks copies up to budget out-of-sync blocks of a resync from the
// source r to the target pr, clears them in both bitmaps and returns how
// many. Both backing devices are opened once for the step, not per block
// (claim.go); one that does not open copies nothing, as a failed read or
// write of a block does: the resync goes on, as DRBD's does over a failing
// disk until it detaches it.
func resyncBlocks(r, pr *resource, budget int64) int64 {
	sp, dp := r.md.peer(pr.nodeID()), pr.md.peer(r.nodeID())
	if sp.bits.first() < 0 {
		return 0
	}
	in, err := r.claim.openData()
	if err == nil {
		defer in.Close()
	}
	out, err := pr.claim.openData()
	if err == nil {
		defer out.Close()
	}
	buf := make([]byte, blockSize)
	var n int64
	for ; n < budget; n++ {
		i := sp.bits.first()
		if i < 0 {
			break
		}
		if in != nil && out != nil {
			if m, err := in.ReadAt(buf, i*blockSize); err == nil || m > 0 {
				_, _ = out.WriteAt(buf[:m], i*blockSize)
			}
		}
		sp.bits.clear(i)
		dp.bits.clear(i)
	}
	return n
}

// progressVerify compares up to budget blocks of a running online verify
// and marks the differing ones out of sync on both sides.
func (c *Cluster) progressVerify(r *resource, k *conn, budget int64) {
	pr := c.peerResource(r, k)
	if pr == nil || !pr.attached() || !r.attached() {
		return
	}
	pk := pr.conns[r.nodeID()]
	end := min(r.md.blocks(), pr.md.blocks())
	// Each side's backing device is opened once for the step's blocks
	// (claim.go); a block that cannot be read hashes as 0, so it differs
	// from a readable one.
	var a, b *os.File
	if k.ovNext < end {
		if f, err := r.claim.openData(); err == nil {
			a = f
			defer a.Close()
		}
		if f, err := pr.claim.openData(); err == nil {
			b = f
			defer b.Close()
		}
	}
	for n := int64(0); n < budget && k.ovNext < end; n++ {
		h1, h2 := hashOrZero(a, k.ovNext), hashOrZero(b, k.ovNext)
		if h1 != h2 {
			r.md.peer(pr.nodeID()).bits.set(k.ovNext)
			pr.md.peer(r.nodeID()).bits.set(k.ovNext)
		}
		k.ovNext++
	}
	if k.ovNext >= end {
		k.repl, pk.repl = replEstablished, replEstablished
		r.publish()
		pr.publish()
	}
}

// hashOrZero is block b's hash in f, 0 when f is nil or the block cannot be
// read.
func hashOrZero(f *os.File, b int64) uint64 {
	if f == nil {
		return 0
	}
	h, err := hashBlock(f, b)
	if err != nil {
		return 0
	}
	return h
}

func (c *Cluster) finishSync(src *resource, ks *conn, dst *resource, kd *conn) {
	dst.peerHelperVol(kd, "after-resync-target")
	ks.repl, kd.repl = replEstablished, replEstablished
	ks.rsTotal, kd.rsTotal = 0, 0
	// The target inherits the source's history, and the source's bitmap UUIDs as
	// history, before it takes the source's generation (DRBD's
	// drbd_uuid_resync_finished, drbd_main.c): a replica that fell behind the source
	// before this target existed is then behind this target too, not split from it.
	for _, u := range src.md.history {
		dst.md.inherit(u)
	}
	for _, id := range slices.Sorted(maps.Keys(src.md.peers)) {
		dst.md.inherit(src.md.peers[id].bitmapUUID)
	}
	if dst.md.current != src.md.current {
		dst.md.rotate(src.md.current)
	}
	dst.md.peer(src.nodeID()).bitmapUUID = 0
	src.md.peer(dst.nodeID()).bitmapUUID = 0
	if src.disk == DiskUpToDate {
		dst.setDisk(DiskUpToDate)
	} else {
		dst.setDisk(DiskConsistent)
	}
	ks.peerDisk = dst.disk // "pdsk( Inconsistent -> UpToDate ) repl( SyncSource -> Established )"
	src.publish()
	dst.publish()
	// A third node learns of the end of the resync in two steps: the
	// target's Consistent, then its UpToDate (contract-real.node3.seq, 33-34).
	if dst.disk == DiskUpToDate {
		for _, x := range c.component(dst) {
			if k := x.conns[dst.nodeID()]; x != src && x != dst && k != nil && k.connected() && k.peerDisk == DiskInconsistent {
				k.peerDisk = DiskConsistent
				x.publish()
			}
		}
	}
}

// computeQuorum is r's own view, under r's own q/qmr, computed fresh.
func (c *Cluster) computeQuorum(r *resource) quorum.Result {
	in := c.quorumInput(r)
	return quorum.Compute(&in)
}

// QuorumView explains the node's quorum for resource name as DRBD would compute it
// now (its configured peers as it counts them, and the verdict), for a test's report
// of a failure; "" when the resource does not run there.
func (n *Node) QuorumView(name string) string {
	c := n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	r := n.res[name]
	if r == nil || n.crashed {
		return ""
	}
	in := c.quorumInput(r)
	res := quorum.Compute(&in)
	var b strings.Builder
	fmt.Fprintf(&b, "quorum %s qmr %s self %s, displayed %v, now %v (%s); peers:", in.Quorum, in.MinRedundancy, in.Self, r.quorate, res.Quorate, res.Reason())
	for i, p := range r.cfg.Peers {
		q := in.Peers[i]
		fmt.Fprintf(&b, " %s#%d{connected %v diskless %v disk %s outdated %v left %v excluded %v quorate %v}",
			p.Name, p.NodeID, q.Connected, q.Diskless, q.Disk, q.Outdated, q.LeftMembers, q.Excluded, q.Quorate)
	}
	return b.String()
}

// quorumView is a fingerprint of everything r's quorum depends on except
// its current quorum. DRBD recomputes quorum on a state change of its
// own; settle recomputes when this fingerprint changes, and a graceful
// peer departure absorbs its change without recomputing: that is how the
// displayed quorum goes stale (docs/drbd-quorum.md, "quorum 2" and "qmr 2"
// rows).
func (c *Cluster) quorumView(r *resource) string {
	in := c.quorumInput(r)
	return fmt.Sprint(in.Quorum, in.MinRedundancy, in.Self, in.Peers)
}

// quorumBasis is quorumView without the connected peers' reports of their own
// quorum: what a state change of r's own would show as changed.
func (c *Cluster) quorumBasis(r *resource) string {
	in := c.quorumInput(r)
	for i := range in.Peers {
		in.Peers[i].Quorate = false
	}
	return fmt.Sprint(in.Quorum, in.MinRedundancy, in.Self, in.Peers)
}

// forceQuorumRecompute is a state change that computes r's quorum whatever
// else changes (DRBD's CS_FORCE_RECALC).
func (c *Cluster) forceQuorumRecompute(r *resource) {
	c.noteQuorumView(r)
	r.showQuorum(c.computeQuorum(r).Quorate)
}

// showQuorum makes quorate the quorum r shows, with the events of the change
// and a Primary's quorum-lost helper; it reports whether anything changed.
func (r *resource) showQuorum(quorate bool) bool {
	if quorate == r.quorate {
		return false
	}
	r.quorate = quorate
	r.publish()
	if !quorate && r.role == rolePrimary {
		r.helper("quorum-lost", true)
	}
	return true
}

// noteQuorumView records the view r's displayed quorum now stands for.
func (c *Cluster) noteQuorumView(r *resource) {
	r.quorumView, r.quorumBasis = c.quorumView(r), c.quorumBasis(r)
}

func (c *Cluster) quorumInput(r *resource) quorum.Input {
	buf := make([]quorum.Peer, 0, len(r.cfg.Peers))
	in := quorum.Input{
		Quorum:        setting(r.cfg.Options.Resource.Quorum),
		MinRedundancy: setting(r.cfg.Options.Resource.QuorumMinimumRedundancy),
		QuorateNow:    r.quorate,
		Peers:         buf[:0],
	}
	switch {
	case r.cfg.Disk == nil || r.cfg.Options.Disk.NonVoting:
		// A non-voting replica (non-upstream option) counts itself like a
		// diskless one: no vote of its own.
		in.Self = quorum.DiskNone
	case r.attached() && r.disk == DiskUpToDate:
		in.Self = quorum.DiskUpToDate
	case r.attached():
		in.Self = quorum.DiskPresent
	default:
		in.Self = quorum.DiskDetached
	}
	for _, p := range r.cfg.Peers {
		k := r.conns[p.NodeID]
		// Diskless is what our configuration calls the peer; connected, the
		// peer's own report decides how it counts (quorum.Peer.Diskless).
		qp := quorum.Peer{
			Diskless: p.Diskless,
			Excluded: !p.EffectiveAllowRemoteRead(r.cfg.Options),
		}
		if k != nil && k.peerNonVoting {
			qp.Excluded = true
		}
		if k != nil && k.connected() && k.repl != replOff {
			qp.Connected = true
			switch k.peerDisk {
			case DiskUpToDate:
				qp.Disk = quorum.DiskUpToDate
			case DiskDiskless:
				qp.Disk = quorum.DiskNone
			case DiskFailed, DiskAttaching:
				qp.Disk = quorum.DiskDetached
			default:
				qp.Disk = quorum.DiskPresent
			}
			qp.Quorate = k.peerQuorate
		} else {
			qp.Outdated = r.outdated()[p.NodeID]
			qp.LeftMembers = !r.members[p.NodeID]
		}
		in.Peers = append(in.Peers, qp)
	}
	return in
}

func setting(q drbd.Quorum) quorum.Setting {
	switch q {
	case drbd.QuorumOff:
		return quorum.Off
	case drbd.QuorumMajority:
		return quorum.Majority
	case drbd.QuorumAll:
		return quorum.All
	}
	if k, ok := q.IsCount(); ok {
		return quorum.Count(k)
	}
	return quorum.Off
}

// component is every running resource reachable from r over live
// connections: where a cluster-wide state change travels.
func (c *Cluster) component(r *resource) []*resource {
	seen := map[*resource]bool{r: true}
	queue := []*resource{r}
	for i := 0; i < len(queue); i++ {
		x := queue[i]
		for _, k := range x.sortedConns() {
			if !k.connected() {
				continue
			}
			if y := c.peerResource(x, k); y != nil && !seen[y] {
				seen[y] = true
				queue = append(queue, y)
			}
		}
	}
	return queue
}

func directlyConnected(a, b *resource) bool {
	k := a.conns[b.nodeID()]
	return k != nil && k.connected()
}

// agreement is a cluster-wide state change over r's component: every
// quorate participant takes the component as its members set, and a
// diskful replica that cannot receive a Primary's writes directly is
// outdated (docs/drbd-quorum.md, row 1).
func (c *Cluster) agreement(r *resource) {
	comp := c.component(r)
	for _, x := range comp {
		if x.role != rolePrimary {
			continue
		}
		for _, y := range comp {
			if y != x && y.attached() && y.disk == DiskUpToDate && !directlyConnected(x, y) {
				y.setDisk(DiskOutdated)
				x.outdated()[y.nodeID()] = true
				y.publish()
			}
		}
	}
	for _, x := range comp {
		if !c.computeQuorum(x).Quorate {
			continue
		}
		x.members = map[int]bool{}
		for _, y := range comp {
			x.members[y.nodeID()] = true
		}
	}
}

// lostPeerAgreement is the empty cluster-wide state change a node starts
// when it loses a connection without a goodbye (drbd_state.c,
// twopc_after_lost_peer, "lost-peer"): it is an agreement over the nodes
// still reachable, which become the members set of the quorate ones, so the
// lost peer is quorumless to them from then on. It is a soft state change,
// and DRBD refuses a soft change that would take a Primary's quorum
// (is_valid_soft_transition: SS_NO_QUORUM): while a Primary in reach would
// lose its quorum by it, it does not happen, and the Primary keeps its
// quorum (docs/drbd-quorum.md, rows 4 and 11). Secondaries have no such
// guard: the survivors of a lost Primary lose their quorum by it wherever
// an explicit `quorum N` exceeds the voters left (test/vm/FINDINGS.md, "The
// product on real DRBD", 3).
func (c *Cluster) lostPeerAgreement(r *resource) {
	comp := c.component(r)
	left := map[int]bool{}
	for _, y := range comp {
		left[y.nodeID()] = true
	}
	for _, x := range comp {
		if x.role != rolePrimary || !x.quorate {
			continue
		}
		kept := x.members
		x.members = left
		keeps := c.computeQuorum(x).Quorate
		x.members = kept
		if !keeps {
			return
		}
	}
	// Only the members set: whether this agreement also outdates a
	// Secondary that no longer reaches a Primary directly, as a
	// promotion's does (agreement), has not been observed on DRBD.
	for _, x := range comp {
		if c.computeQuorum(x).Quorate {
			x.members = maps.Clone(left)
		}
	}
}

// setDisk changes the disk state and persists what DRBD persists.
func (r *resource) setDisk(d DiskState) {
	r.disk = d
	if r.md != nil {
		switch d {
		case DiskUpToDate, DiskOutdated, DiskInconsistent:
			r.md.disk = d
		}
	}
}

// outdated is the set of peers this node knows to be Outdated; kept in the
// metadata for a diskful node so that it survives restarts.
func (r *resource) outdated() map[int]bool {
	if r.n.outdatedPeers == nil {
		r.n.outdatedPeers = map[string]map[int]bool{}
	}
	m := r.n.outdatedPeers[r.name]
	if m == nil {
		m = map[int]bool{}
		r.n.outdatedPeers[r.name] = m
	}
	return m
}
