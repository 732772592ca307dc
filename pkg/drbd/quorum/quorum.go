// Package quorum is DRBD 9.2's quorum rule for one volume, as one node
// computes it from its own view of the cluster.
//
// The rule is the one written down in docs/drbd-quorum.md (read from
// the 9.2.18 kernel module and checked on real machines); this package is the
// only place in meshvol that encodes it. drbdsim uses it to decide what a
// simulated node shows as quorum:yes/no and whether it may promote; the
// datamesh engine's model checker uses it to decide which partitions can
// write. Both need the same answer, so both call Compute.
//
// Compute is a pure function of its Input: no clock, no I/O, no allocation.
// What it cannot know is *when* DRBD recomputes: the kernel only re-evaluates
// quorum on a state change of its own, so the quorum a node displays can be
// stale (docs/drbd-quorum.md, "quorum 2" row), and the tiebreaker depends on
// whether the node is quorate right now. Both are the caller's business: it
// decides when to call Compute and passes the currently displayed quorum in
// Input.QuorateNow.
package quorum

import (
	"fmt"
	"strconv"
)

// Setting is a value of DRBD's `quorum` or `quorum-minimum-redundancy`
// option: off, majority, all, or an explicit count k (1..32).
//
// The zero value is Off, which is DRBD's default for both options.
type Setting int16

const (
	// Off: `quorum off` (always quorate) or `quorum-minimum-redundancy off`
	// (no UpToDate copies required).
	Off Setting = 0
	// Majority is n/2+1 (integer division) of the voters n.
	Majority Setting = -1
	// All is every voter.
	All Setting = -2
)

// MaxCount is the largest explicit setting DRBD accepts (DRBD_PEERS_MAX).
const MaxCount = 32

// Count is an explicit `quorum k`. It means k whatever the number of voters,
// so a k larger than the cluster can never be met by counting (the q=32 of
// star and shadow members, docs/datamesh-spec.md §ChangeQuorum, relies on exactly that).
func Count(k int) Setting { return Setting(k) }

// ParseSetting reads the text DRBD uses for the option ("off", "majority",
// "all", or a number 1..32). field names the option in the error.
func ParseSetting(field, s string) (Setting, error) {
	switch s {
	case "off", "":
		return Off, nil
	case "majority":
		return Majority, nil
	case "all":
		return All, nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 || k > MaxCount {
		return Off, fmt.Errorf("%s: %q is not off, majority, all or a number 1..%d", field, s, MaxCount)
	}
	return Count(k), nil
}

// String is the DRBD spelling of the setting.
func (s Setting) String() string {
	switch {
	case s == Off:
		return "off"
	case s == Majority:
		return "majority"
	case s == All:
		return "all"
	case s > 0:
		return strconv.Itoa(int(s))
	}
	return "invalid(" + strconv.Itoa(int(s)) + ")"
}

// At is the number of votes the setting requires among n voters (DRBD's
// calc_quorum_at). Off requires none.
func (s Setting) At(n int) int {
	switch {
	case s == Majority:
		return n/2 + 1
	case s == All:
		return n
	case s > 0:
		return int(s)
	}
	return 0
}

// Disk is what a node has as its local disk, reduced to what quorum needs.
type Disk uint8

const (
	// DiskNone: as Input.Self, configured `disk none` (an Access or
	// TieBreaker member, an intentionally diskless client): never votes,
	// counts in the tiebreaker. As Peer.Disk, the peer reports Diskless
	// (see Peer.Diskless for how that counts).
	DiskNone Disk = iota
	// DiskDetached: configured with a disk but none attached now (Diskless
	// after detach or failure, or still Attaching). Counted as an absent
	// voter by itself; a connected peer in this state counts as present.
	DiskDetached
	// DiskPresent: attached in any state other than UpToDate (Inconsistent,
	// Outdated, Consistent, Negotiating). Counts toward quorum, not toward
	// minimum redundancy.
	DiskPresent
	// DiskUpToDate: attached and UpToDate.
	DiskUpToDate
)

func (d Disk) String() string {
	switch d {
	case DiskNone:
		return "none"
	case DiskDetached:
		return "detached"
	case DiskPresent:
		return "present"
	case DiskUpToDate:
		return "up-to-date"
	}
	return "invalid"
}

// Peer is one node the computing node knows about (from its metadata or its
// configuration). Nodes never seen must not be passed at all.
//
// The zero value is the most conservative peer: a diskful voter, not
// connected, state unknown. Every field that can only make quorum easier
// to reach (Outdated, LeftMembers, Excluded) has to be set on purpose.
type Peer struct {
	// Connected: the replication state is not Off (Established or any
	// resync state).
	Connected bool
	// Diskless: our configuration names the peer intentionally diskless
	// (`disk none` in its host section, so our peer device has `bitmap no`).
	// Unconnected, such a peer is a missing diskless vote: our configuration
	// is all we have. Connected, it is a diskless (tiebreaker) vote only if
	// it also reports Diskless (Disk == DiskNone); one that reports a disk
	// counts by that disk, whatever our configuration says (the kernel's
	// __calc_quorum_with_disk: `disk_state == D_DISKLESS &&
	// is_intentional_diskless`).
	Diskless bool
	// Disk is the peer's disk as last reported over the connection, only
	// read while Connected: DiskNone means it reports Diskless (an
	// intentionally diskless node, or a diskful one that detached),
	// DiskUpToDate counts up_to_date, DiskPresent and DiskDetached (a disk
	// still attaching, or failing) count present. A peer that reports
	// Diskless counts as a diskless vote for a node without a local disk
	// whatever the configuration says (__calc_quorum_no_disk), and for a
	// node with a disk only if Diskless is set too; otherwise it is present.
	Disk Disk
	// Outdated: while not connected, the peer is known Outdated (it
	// told us so when it left, or our metadata marks it outdated). Outdated
	// absent peers leave the electorate ("last man standing").
	Outdated bool
	// LeftMembers: while not connected, the peer is not in this node's
	// members set (it was not reachable at the last cluster-wide agreement
	// this node took part in while quorate). To a node that is quorate now
	// (Input.QuorateNow) such a peer is "quorumless": it leaves the
	// electorate unless too many nodes are absent. To one that is not, it
	// is unknown, like any absent voter.
	LeftMembers bool
	// Quorate: while Connected and UpToDate, the peer's last state report
	// said it has quorum. Only used by a node without a local disk.
	Quorate bool
	// Excluded: the connection has `allow-remote-read no`; DRBD does not
	// count such a peer at all. (drbdsim also uses it for a peer with the
	// non-upstream `non-voting` option.)
	Excluded bool
}

// Input is one node's view of one volume.
type Input struct {
	Quorum        Setting // `quorum`
	MinRedundancy Setting // `quorum-minimum-redundancy`
	Self          Disk
	Peers         []Peer
	// QuorateNow is the quorum the node holds right now. The tiebreaker only
	// keeps quorum, it never gains it.
	QuorateNow bool
}

// Path says how a node came to be quorate (or not).
type Path uint8

const (
	// PathNone: not quorate.
	PathNone Path = iota
	// PathOff: `quorum off`, always quorate.
	PathOff
	// PathCount: enough voters present, enough of them UpToDate.
	PathCount
	// PathQuoratePeer: a node without a local disk connected to an UpToDate
	// peer that reports quorum. quorum-minimum-redundancy is NOT applied on
	// this path (docs/drbd-quorum.md).
	PathQuoratePeer
	// PathTiebreaker: one vote short among an even number of voters, a
	// majority of the diskless nodes connected, and already quorate. Keeps,
	// never gains; qmr is NOT applied on this path either.
	PathTiebreaker
)

func (p Path) String() string {
	switch p {
	case PathNone:
		return "none"
	case PathOff:
		return "off"
	case PathCount:
		return "count"
	case PathQuoratePeer:
		return "quorate-peer"
	case PathTiebreaker:
		return "tiebreaker"
	}
	return "invalid"
}

// Result is the decision and the numbers behind it, named as in the kernel.
type Result struct {
	Quorate bool
	Path    Path

	// The sorted nodes, the computing node included.
	UpToDate        int
	Present         int
	Outdated        int
	Quorumless      int // after the "far side might be quorate" fold-in
	Unknown         int
	Diskless        int
	MissingDiskless int
	QuoratePeers    int

	// Voters is the size of the electorate; QuorumAt and RedundancyAt are
	// what the settings require of it.
	Voters       int
	QuorumAt     int
	RedundancyAt int
}

// Absent is the number of voters that are not visible.
func (r Result) Absent() int { return r.Outdated + r.Quorumless + r.Unknown }

// Visible is the number of voters this node sees (itself included).
func (r Result) Visible() int { return r.UpToDate + r.Present }

// Reason explains the result in DRBD's words where DRBD has words for it
// ("1 of 3 nodes visible, need 2 for quorum"). It allocates; call it for
// messages, not in a model checker's inner loop.
func (r Result) Reason() string {
	switch r.Path {
	case PathOff:
		return "quorum off"
	case PathQuoratePeer:
		return fmt.Sprintf("connected to %d UpToDate peer(s) with quorum", r.QuoratePeers)
	case PathTiebreaker:
		return fmt.Sprintf("%d of %d nodes visible, need %d for quorum; kept by tiebreaker (%d of %d diskless nodes connected)",
			r.Visible(), r.Voters, r.QuorumAt, r.Diskless, r.Diskless+r.MissingDiskless)
	}
	if r.Path == PathCount || r.Visible() < r.QuorumAt {
		return fmt.Sprintf("%d of %d nodes visible, need %d for quorum", r.Visible(), r.Voters, r.QuorumAt)
	}
	return fmt.Sprintf("%d of %d nodes up_to_date, need %d for quorum-minimum-redundancy", r.UpToDate, r.Voters, r.RedundancyAt)
}

// Compute applies DRBD 9.2's quorum rule to one node's view (see the package
// comment and docs/drbd-quorum.md, "The rule"). It does not allocate.
func Compute(in *Input) Result { return compute(in, in.QuorateNow, false) }

// AfterLostPeer is the node's quorum once a peer it saw (now absent in in.Peers) is
// gone without a goodbye and the empty cluster-wide state change DRBD runs for it
// has run (docs/drbd-quorum.md, "The members set"): the node's quorum at the loss
// (Compute), and, if it is quorate then, its quorum after the agreement, which makes
// every voter it cannot reach leave its members set (Peer.LeftMembers for each absent
// one), judged as quorate now. It is the quorum the node keeps while the peer stays
// away. It does not model DRBD's refusal of that change while it would take a
// Primary's quorum: a Primary keeps its quorum through this agreement, but not through
// the next one, which any connection loss among the survivors starts. It does not
// allocate.
func AfterLostPeer(in *Input) Result {
	r := Compute(in)
	if !r.Quorate {
		return r
	}
	return compute(in, true, true)
}

// compute is Compute with the node's current quorum given apart, and allLeft: every
// absent peer is outside the node's members set.
func compute(in *Input, quorateNow, allLeft bool) Result {
	var r Result

	// Sort the node itself. With an attached disk it is a voter; without one
	// it is a tiebreaker vote if configured diskless, else an absent voter
	// (a detached diskful replica must not get a tiebreaker vote).
	withDisk := in.Self == DiskUpToDate || in.Self == DiskPresent
	switch in.Self {
	case DiskUpToDate:
		r.UpToDate++
	case DiskPresent:
		r.Present++
	case DiskNone:
		r.Diskless++
	case DiskDetached:
		r.Unknown++
	}

	for i := range in.Peers {
		p := &in.Peers[i]
		switch {
		case p.Excluded:
		case p.Connected && p.Disk == DiskNone && (p.Diskless || !withDisk):
			r.Diskless++
		case p.Connected && p.Disk == DiskUpToDate:
			r.UpToDate++
			if !withDisk && p.Quorate {
				r.QuoratePeers++
			}
		case p.Connected:
			r.Present++
		case p.Diskless:
			r.MissingDiskless++
		case p.Outdated:
			r.Outdated++
		case (p.LeftMembers || allLeft) && quorateNow:
			// Only a quorate node sets its members set against the
			// others (drbd_state.c: quorumless_nodes =
			// have_quorum[NOW] ? ~members : 0); one without quorum counts
			// every absent voter as unknown.
			r.Quorumless++
		default:
			r.Unknown++
		}
	}

	// If the absent nodes could form a quorum among themselves (with what
	// we see), a peer that left our members set might be quorate over
	// there: it is unknown, not gone.
	if r.Absent() >= in.Quorum.At(r.Absent()+r.UpToDate+r.Present) {
		r.Unknown += r.Quorumless
		r.Quorumless = 0
	}
	// When every absent voter is outdated or quorumless, the other side
	// cannot promote, so those leave the electorate.
	if r.Unknown > 0 {
		r.Voters = r.Absent() + r.UpToDate + r.Present
	} else {
		r.Voters = r.UpToDate + r.Present
	}
	r.QuorumAt = in.Quorum.At(r.Voters)
	r.RedundancyAt = in.MinRedundancy.At(r.Voters)

	if in.Quorum == Off {
		r.Quorate, r.Path = true, PathOff
		return r
	}
	if r.QuoratePeers > 0 {
		r.Quorate, r.Path = true, PathQuoratePeer
		return r
	}
	if r.Visible() >= r.QuorumAt && r.UpToDate >= r.RedundancyAt {
		r.Quorate, r.Path = true, PathCount
		return r
	}
	// The tiebreaker: an even electorate split in half, and we see most of
	// the diskless nodes. It only keeps quorum: both halves may see "the"
	// tiebreaker one after the other, and only the one that never lost
	// quorum may keep it. voters != 0 as in the kernel: a node that knows no
	// voter at all has nothing to break a tie between.
	if r.Voters != 0 && r.Voters%2 == 0 && r.Visible() == r.QuorumAt-1 &&
		r.Diskless >= Majority.At(r.Diskless+r.MissingDiskless) && quorateNow {
		r.Quorate, r.Path = true, PathTiebreaker
	}
	return r
}
