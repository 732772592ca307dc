package modelcheck

import (
	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd/quorum"
)

// This file is the only place the checker asks DRBD's quorum rule anything.
// It turns what each replica has applied into one node's view
// (quorum.Input) and calls quorum.Compute, the rule implemented once in
// pkg/drbd/quorum. docs/modelcheck.md states the modelling choices; the
// comments below say why each one is there.

// DataPlane is the replica-level state the quorum analysis reads: what runs
// in the kernel of each node, independent of the controller's status.
type DataPlane struct {
	N        int
	Replicas [MaxReplicas]Replica
	// Shadow: DRBD has the non-upstream `non-voting` option (feature
	// ShadowDiskful). Only then are sD and sD∅ non-voters; without it an
	// attached sD would be an ordinary voter to its peers.
	Shadow bool
	// Seen[i] has bit j when i and j were ever connected: both alive, neither
	// behind a partition, and each one's applied config connecting to the
	// other (noteConnections). DRBD keeps a peer it has seen in its metadata
	// and counts it, connected or not, for as long as its config names it;
	// only a peer never seen "does not exist for it" (docs/drbd-quorum.md). Slots
	// are never reused, so the bits stay true for good.
	Seen [MaxReplicas]uint32
}

// noteConnections records, after node i applied a new config, the peers it is
// now connected to in the whole network (no cut): from now on each has seen
// the other.
func (dp *DataPlane) noteConnections(i int) {
	if !dp.configured(i) || dp.Replicas[i].Returned {
		return
	}
	for j := 0; j < dp.N; j++ {
		if j != i && dp.configured(j) && !dp.Replicas[j].Returned && dp.mutual(i, j) {
			dp.Seen[i] |= 1 << j
			dp.Seen[j] |= 1 << i
		}
	}
}

// selfView is how node i's own DRBD counts itself and what it may do.
type selfView struct {
	disk     quorum.Disk
	voter    bool // uses the volume's q (D, D∅) rather than the star/shadow q=32
	hasData  bool // a local UpToDate disk
	physDisk quorum.Disk
}

// physical is what node j's DRBD really runs, read from j's own applied
// snapshot: its peers learn it over the connection. Liminal members
// (docs/layouts.md §8.4) run intentionally diskless, so they give themselves
// no vote; their peers with a disk still count them as voters
// (configuredDiskless).
//
//	D            disk attached: UpToDate or present (Inconsistent/Outdated)
//	sD           disk attached; with the non-voting option (feature
//	             ShadowDiskful) a non-voter, without it an ordinary voter
//	D∅           `disk none`: runs diskless
//	sD∅          `disk none`, with the non-voting option under ShadowDiskful
//	A, TB        `disk none`
func (dp *DataPlane) physical(t v1alpha1.MemberType, upToDate bool) (disk quorum.Disk, nonVoting bool) {
	switch t {
	case v1alpha1.MemberTypeDiskful:
		if upToDate {
			return quorum.DiskUpToDate, false
		}
		return quorum.DiskPresent, false
	case v1alpha1.MemberTypeShadowDiskful:
		d := quorum.DiskPresent
		if upToDate {
			d = quorum.DiskUpToDate
		}
		return d, dp.Shadow
	case v1alpha1.MemberTypeLiminalShadowDiskful:
		// The agent renders the non-voting option for sD∅ as for sD
		// (datameshOptions), and drbdsim's peers exclude it either way.
		return quorum.DiskNone, dp.Shadow
	}
	return quorum.DiskNone, false
}

// physicalOf is what replica j's kernel runs when it applies type t: physical, and
// no disk at all once its disk failed (Replica.DiskFailed), whatever t says — the
// voter a D whose disk failed stays is, to DRBD, a D∅ (the peers still configure its
// disk, so they count it while connected).
func (dp *DataPlane) physicalOf(j int, t v1alpha1.MemberType) (disk quorum.Disk, nonVoting bool) {
	r := &dp.Replicas[j]
	disk, nonVoting = dp.physical(t, r.UpToDate)
	if r.DiskFailed && t.HasDisk() {
		disk = quorum.DiskNone
	}
	return disk, nonVoting
}

// configuredDiskless: a node whose config says its peer is of type t renders that
// peer `disk none`, so DRBD's peer device to it has `bitmap no`: the agent does
// so for star members (A, TB) only; a liminal peer (D∅, sD∅) keeps its bitmap
// slot for the disk it will attach (pkg/agent render.go), so DRBD counts it as
// a voter although it runs diskless: present while connected, unknown while not
// (docs/drbd-quorum.md, "The rule").
func configuredDiskless(t v1alpha1.MemberType) bool {
	return !t.ConnectsToAllPeers()
}

// wantsLink: a node whose config says it is of type self configures a DRBD
// connection to a peer its config says is of type peer. Full-mesh members
// connect to everyone, star members (A, TB) only to full-mesh members.
func wantsLink(self, peer v1alpha1.MemberType) bool {
	return self.ConnectsToAllPeers() || peer.ConnectsToAllPeers()
}

// configured: slot i runs DRBD for the volume (alive, has applied a snapshot
// that contains itself).
func (dp *DataPlane) configured(i int) bool {
	r := &dp.Replicas[i]
	return r.Alive && r.Applied.Member(i) != nil
}

// Live returns the mask of configured, alive replicas.
func (dp *DataPlane) Live() uint32 {
	var m uint32
	for i := 0; i < dp.N; i++ {
		if dp.configured(i) {
			m |= 1 << i
		}
	}
	return m
}

// Connected: a DRBD connection between i and j is established when both are
// configured, both are on the same side of the cut, and each one's applied
// config has a connection to the other.
func (dp *DataPlane) Connected(i, j int, side uint32) bool {
	if side&(1<<i) == 0 || side&(1<<j) == 0 || !dp.configured(i) || !dp.configured(j) {
		return false
	}
	si, sj := dp.Replicas[i].Applied, dp.Replicas[j].Applied
	iViewJ, jViewI := si.Member(j), sj.Member(i)
	if iViewJ == nil || jViewI == nil {
		return false
	}
	return wantsLink(si.Member(i).Type, iViewJ.Type) && wantsLink(sj.Member(j).Type, jViewI.Type)
}

// mutual: i's and j's applied configs each have a connection to the other,
// whatever the network and whether they live: the two were connected
// before the cut (or before j died), so i knows what j's disk was.
func (dp *DataPlane) mutual(i, j int) bool {
	si, sj := dp.Replicas[i].Applied, dp.Replicas[j].Applied
	iViewJ, jViewI := si.Member(j), sj.Member(i)
	if iViewJ == nil || jViewI == nil || si.Member(i) == nil || sj.Member(j) == nil {
		return false
	}
	return wantsLink(si.Member(i).Type, iViewJ.Type) && wantsLink(sj.Member(j).Type, jViewI.Type)
}

func (dp *DataPlane) self(i int) selfView {
	r := &dp.Replicas[i]
	t := r.Applied.Member(i).Type
	disk, nonVoting := dp.physicalOf(i, t)
	v := selfView{disk: disk, physDisk: disk, voter: t.IsVoter(), hasData: disk == quorum.DiskUpToDate}
	if nonVoting {
		// A non-voting node gives itself no vote; with q=32 it can only be
		// quorate through a quorate UpToDate peer, like a diskless one.
		// (What flant-drbd's non-voting really does is not documented in
		// docs/drbd-quorum.md; this is the reading docs/datamesh-spec.md relies on.)
		v.disk = quorum.DiskNone
	}
	return v
}

// settings are the quorum options node i's agent rendered: voters use the
// published q, star and shadow members q=32 (docs/datamesh-spec.md §ChangeQuorum); all
// use the published qmr. 0 means the option is off.
func settings(s *Snapshot, voter bool) (q, qmr quorum.Setting) {
	q = quorum.Count(32)
	if voter {
		q = quorum.Count(int(s.Q))
	}
	return q, quorum.Count(int(s.QMR))
}

// SideResult is what one side of a cut can do.
type SideResult struct {
	Quorate uint32 // nodes quorate by the rule
	Writers uint32 // nodes that could promote and write: quorate with UpToDate data in reach
}

// Analyzer computes side results without allocating; one per goroutine.
type Analyzer struct {
	peers [MaxReplicas]quorum.Peer
	in    quorum.Input
}

// Side computes, for every node on side, whether it is quorate and whether
// it could be promoted, assuming the nodes off side are cut away.
//
// History the checker does not track is over-approximated in the direction
// that makes quorum easier, so a reported "cannot" is sound:
//   - QuorateNow is true: every node was quorate before the cut, so the
//     tiebreaker may keep quorum for it.
//   - A peer that is dead (lost before the cut) is tried both as unknown
//     and as having left the node's members set; a peer that is not
//     connected under the current configs both as the node's config says
//     and, unless the two were ever connected (DataPlane.Seen), as never
//     seen (not counted); quorate if any variant is.
//   - A peer on the other side is unknown: the members set only shrinks by
//     an agreement taken while quorate after the cut, which cannot make a
//     side quorate that was not quorate at the cut.
func (a *Analyzer) Side(dp *DataPlane, side uint32) SideResult {
	var res SideResult
	// Two passes: a node with a local disk decides from counts alone; a node
	// without one also counts connected UpToDate peers that are quorate,
	// which are all disk nodes decided in the first pass.
	for pass := 0; pass < 2; pass++ {
		for i := 0; i < dp.N; i++ {
			if side&(1<<i) == 0 || !dp.configured(i) {
				continue
			}
			sv := dp.self(i)
			withDisk := sv.disk == quorum.DiskUpToDate || sv.disk == quorum.DiskPresent
			if withDisk != (pass == 0) {
				continue
			}
			for v := variantPlain; v < numVariants; v++ {
				if a.quorate(dp, i, side, sv, res.Quorate, v) {
					res.Quorate |= 1 << i
					break
				}
			}
		}
	}
	for i := 0; i < dp.N; i++ {
		if res.Quorate&(1<<i) == 0 {
			continue
		}
		if dp.self(i).hasData || a.dataInReach(dp, i, side) {
			res.Writers |= 1 << i
		}
	}
	return res
}

// dataInReach: a connected peer has an UpToDate disk (a diskless Primary
// reads and writes through it).
func (a *Analyzer) dataInReach(dp *DataPlane, i int, side uint32) bool {
	for j := 0; j < dp.N; j++ {
		if j == i || !dp.Connected(i, j, side) {
			continue
		}
		t := dp.Replicas[j].Applied.Member(j).Type
		if d, _ := dp.physicalOf(j, t); d == quorum.DiskUpToDate {
			return true
		}
	}
	return false
}

// variant is one guess at history the checker does not track; a node
// counts as quorate if it is quorate under any of them.
type variant uint8

const (
	// Dead peers are unknown; peers never connected under the current
	// configs are classified by what the viewing node's config says.
	variantPlain variant = iota
	// Dead peers left the members set (an agreement was taken without
	// them while this node was quorate).
	variantDeadLeft
	// Peers not connected under the current configs and never connected
	// before (DataPlane.Seen) were never seen: DRBD does not count them.
	variantUnseen
	numVariants
)

func (a *Analyzer) quorate(dp *DataPlane, i int, side uint32, sv selfView, quorate uint32, v variant) bool {
	snap := dp.Replicas[i].Applied
	n := 0
	for _, m := range snap.Members {
		j := int(m.Slot)
		if j == i {
			continue
		}
		p := quorum.Peer{}
		rj := &dp.Replicas[j]
		switch {
		case dp.Connected(i, j, side):
			// j reports the disk it runs; whether i counts a j that
			// reports Diskless as a diskless vote depends on i's own
			// configuration of j as well (quorum.Peer.Diskless: the
			// kernel's peer device has `bitmap no` only for a peer its
			// configuration names `disk none`).
			disk, nonVoting := dp.physicalOf(j, rj.Applied.Member(j).Type)
			p.Connected = true
			p.Excluded = nonVoting
			p.Disk = disk
			p.Diskless = configuredDiskless(m.Type)
			p.Quorate = quorate&(1<<j) != 0
		case dp.mutual(i, j):
			// Connected before the cut (or before j died): i remembers
			// whether j was non-voting; whether j counts as a missing
			// diskless vote or an absent voter is i's configuration's
			// to say (the kernel reads `bitmap no` of its peer device).
			_, nonVoting := dp.physical(rj.Applied.Member(j).Type, rj.UpToDate)
			p.Excluded = nonVoting
			p.Diskless = configuredDiskless(m.Type)
			p.LeftMembers = v == variantDeadLeft && !rj.Alive
		default:
			// Not connected under the current configs: one of the two
			// has dropped the other, or they never met.
			if v == variantUnseen && dp.Seen[i]&(1<<j) == 0 {
				continue
			}
			_, nonVoting := dp.physical(m.Type, false)
			p.Excluded = nonVoting
			p.Diskless = configuredDiskless(m.Type)
		}
		a.peers[n] = p
		n++
	}
	q, qmr := settings(snap, sv.voter)
	a.in = quorum.Input{Quorum: q, MinRedundancy: qmr, Self: sv.disk, Peers: a.peers[:n], QuorateNow: true}
	return quorum.Compute(&a.in).Quorate
}

// Split is a cut of the live replicas into two sides that can both do
// something only one side may do.
type Split struct {
	SideA, SideB     uint32
	ResultA, ResultB SideResult
}

// FindSplits checks every cut of the live replicas into two non-empty sides
// and returns the first one where both sides have a quorate node
// (quorumSplit) and the first where both sides have a writer (writeSplit).
// Cuts into more than two parts need no separate check: what a side can do
// depends only on the nodes in it.
func (a *Analyzer) FindSplits(dp *DataPlane) (quorumSplit, writeSplit *Split) {
	live := dp.Live()
	if live == 0 {
		return nil, nil
	}
	low := live & -live
	// Enumerate sides containing the lowest live node; the other side is
	// the rest. Sub-mask enumeration of rest = live &^ low.
	rest := live &^ low
	for sub := rest; ; sub = (sub - 1) & rest {
		sa := low | sub
		sb := live &^ sa
		if sb != 0 {
			ra := a.Side(dp, sa)
			if ra.Quorate != 0 {
				rb := a.Side(dp, sb)
				if quorumSplit == nil && rb.Quorate != 0 {
					quorumSplit = &Split{sa, sb, ra, rb}
				}
				if writeSplit == nil && ra.Writers != 0 && rb.Writers != 0 {
					writeSplit = &Split{sa, sb, ra, rb}
				}
				if quorumSplit != nil && writeSplit != nil {
					return
				}
			}
		}
		if sub == 0 {
			break
		}
	}
	return
}
