// Package fencing decides whether the replicas on a lost node could still hold DRBD
// quorum, given which members live agents report cut off from them: if they cannot,
// DRBD already keeps that node from writing (on-no-quorum), whatever it still runs.
//
// The controller frees a lost node's pods on that answer (docs/controller.md,
// "--delete-lost-pods"). It needs it where the survivors' own quorum flag says nothing
// yet: a 2D+1TB volume whose Primary's node is lost leaves its survivors without
// quorum until the lost member is force-removed and q lowered (docs/drbd-quorum.md,
// "The members set"), although the lost node, one of two voters under q=2 and cut off
// from the TieBreaker, cannot be quorate either.
//
// Check is a pure function: no clock, no I/O. It applies DRBD's rule (pkg/drbd/quorum)
// to the worst case the reports leave open, the way the datamesh model checker judges a
// side of a cut (pkg/datamesh/modelcheck, partition.go): every member not reported cut
// off counts as on the lost side and connected to it, UpToDate and quorate; every member
// reported cut off is absent in each way DRBD may count an absent peer (unknown, left
// the members set, outdated, never seen), each tried for each such member; every node is
// taken as quorate before the cut, so the tiebreaker may keep quorum for it; qmr is off.
// A node of the lost side that is quorate under any of these makes the answer "not
// fenced".
package fencing

import (
	"fmt"
	"slices"
	"strings"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd/quorum"
)

// Member is one member of the datamesh the lost side may run.
type Member struct {
	Name string
	Type v1.MemberType
	// Lost: the member is on the lost node.
	Lost bool
	// CutOff: a live agent reports this member's DRBD not connected to any member on the
	// lost node it has a connection to. Meaningless when Lost.
	CutOff bool
}

// maxCutOff bounds the variants tried (4 per cut-off Diskful member): beyond it Check
// answers "not fenced" rather than guess.
const maxCutOff = 6

// Check says whether no member on the lost side can be quorate under quorum q (the
// datamesh's q, which every voter of the lost side runs: the caller makes sure no change
// of q or of the member set is in flight), and why, in words for an Event. members is
// the whole datamesh; at least one must be Lost.
func Check(members []Member, q int) (fenced bool, why string) {
	if q < 1 {
		return false, "quorum is off: DRBD fences nothing"
	}
	var lost, side, cut []int
	for i, m := range members {
		switch m.Type {
		case v1.MemberTypeDiskful, v1.MemberTypeAccess, v1.MemberTypeTieBreaker:
		default:
			// Liminal and shadow members run options (disk none with a bitmap slot,
			// non-voting) this check does not model; the survivors' quorum decides.
			return false, fmt.Sprintf("member %s is %s, which this check does not model", m.Name, m.Type)
		}
		switch {
		case m.Lost:
			lost = append(lost, i)
			side = append(side, i)
		case m.CutOff:
			cut = append(cut, i)
		default:
			side = append(side, i)
		}
	}
	if len(lost) == 0 {
		return false, "no member on the lost node"
	}
	if len(cut) > maxCutOff {
		return false, fmt.Sprintf("%d members cut off: more than the %d this check tries", len(cut), maxCutOff)
	}
	c := checker{members: members, side: side, cut: cut, q: q, variant: make([]absence, len(members))}
	if who := c.anyQuorate(0); who != "" {
		return false, who
	}
	var lostNames, cutNames []string
	for _, i := range lost {
		lostNames = append(lostNames, members[i].Name)
	}
	for _, i := range cut {
		cutNames = append(cutNames, members[i].Name)
	}
	return true, fmt.Sprintf("its replica %s cannot hold quorum (q=%d): %s report no connection to it",
		strings.Join(lostNames, ", "), q, strings.Join(cutNames, ", "))
}

// absence is how a node of the lost side counts a member reported cut off.
type absence uint8

const (
	absentUnknown  absence = iota // an absent voter it knows nothing of
	absentLeft                    // left its members set while it was quorate
	absentOutdated                // known Outdated
	absentUnseen                  // never seen: not counted at all
	numAbsence
)

type checker struct {
	members []Member
	side    []int // indexes: the lost node's members and every member not cut off
	cut     []int // indexes of the members cut off
	q       int
	variant []absence // by member index, for the members cut off
	peers   []quorum.Peer
}

// anyQuorate tries every absence for the cut-off members from cut[k] on and names a
// node of the lost side that is quorate under one of them, or "".
func (c *checker) anyQuorate(k int) string {
	if k == len(c.cut) {
		return c.sideQuorate()
	}
	i := c.cut[k]
	for a := absentUnknown; a < numAbsence; a++ {
		if !c.members[i].Type.IsVoter() && (a == absentLeft || a == absentOutdated) {
			continue // a diskless peer is a missing diskless vote whatever it told
		}
		c.variant[i] = a
		if who := c.anyQuorate(k + 1); who != "" {
			return who
		}
	}
	return ""
}

// sideQuorate applies the rule to every node of the lost side in the current variant
// and names one that is quorate, or "".
func (c *checker) sideQuorate() string {
	for _, i := range c.side {
		in := c.view(i)
		if r := quorum.Compute(&in); r.Quorate {
			return fmt.Sprintf("replica %s could still be quorate on the lost side (%s)", c.members[i].Name, r.Reason())
		}
	}
	return ""
}

// view is node i's quorum.Input in the current variant.
func (c *checker) view(i int) quorum.Input {
	self := c.members[i]
	c.peers = c.peers[:0]
	for j, m := range c.members {
		if j == i || !self.Type.ConnectsToAllPeers() && !m.Type.ConnectsToAllPeers() {
			continue // two star members have no connection: DRBD does not know the other
		}
		p := quorum.Peer{Diskless: !m.Type.ConnectsToAllPeers()}
		switch {
		case slices.Contains(c.side, j):
			p.Connected = true
			p.Disk = quorum.DiskNone
			if m.Type.HasDisk() {
				p.Disk = quorum.DiskUpToDate
				p.Quorate = true // the worst case: a quorate peer makes a diskless node quorate
			}
		case c.variant[j] == absentUnseen:
			continue
		case c.variant[j] == absentLeft:
			p.LeftMembers = true
		case c.variant[j] == absentOutdated:
			p.Outdated = true
		}
		c.peers = append(c.peers, p)
	}
	in := quorum.Input{Quorum: quorum.Count(32), Self: quorum.DiskNone, Peers: c.peers, QuorateNow: true}
	if self.Type.HasDisk() {
		in.Quorum, in.Self = quorum.Count(c.q), quorum.DiskUpToDate
	}
	return in
}
