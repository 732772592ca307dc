package layout

import "github.com/meshvol/meshvol/pkg/drbd/quorum"

// KeepsQuorumWithoutOneD says whether the layout, formed and healthy (every D
// UpToDate and connected, its TieBreakers connected, q and qmr as Quorum and QMR
// give them), keeps DRBD's quorum on its Diskful survivors while one of its D is
// away: not only at the moment it goes, but after the agreement DRBD runs among the
// nodes left, which takes the away node out of their electorate
// (quorum.AfterLostPeer; docs/drbd-quorum.md, "The members set"). 2D+1TB does not:
// under its explicit q=2 the one D left is a voter short of an odd electorate, where
// the tiebreaker does not apply. Every other layout with FTT ≥ 1 does; no layout
// with FTT 0 does.
func (l Layout) KeepsQuorumWithoutOneD() bool {
	d := l.DiskfulCount()
	if !l.valid() || d < 2 {
		return false
	}
	var peers [MaxFTT + MaxGMDR + 2]quorum.Peer
	n := 0
	for i := 0; i < d-2; i++ {
		peers[n] = quorum.Peer{Connected: true, Disk: quorum.DiskUpToDate}
		n++
	}
	peers[n] = quorum.Peer{} // the D away: a voter of unknown state
	n++
	for i := 0; i < TieBreakerMin(d, l.FTT); i++ {
		peers[n] = quorum.Peer{Connected: true, Diskless: true}
		n++
	}
	in := quorum.Input{Quorum: quorum.Count(Quorum(d, l)), MinRedundancy: quorum.Count(QMR(l)),
		Self: quorum.DiskUpToDate, Peers: peers[:n], QuorateNow: true}
	return quorum.AfterLostPeer(&in).Quorate
}

// RaisedForMaintenance is the layout a node maintenance raises l to while it copies
// the volume elsewhere before its node goes (docs/operating.md, "Copying a volume
// elsewhere before its node goes"): the first of one more failure to tolerate, one
// more guaranteed copy, or both, that the layout rules allow (Validate) and that keeps
// quorum while one of its D is away (KeepsQuorumWithoutOneD). 1D becomes 3D (2D+1TB
// would lose quorum once the node is away, and 2D needs both copies), 2D and 2D+1TB
// become 3D, 3D (FTT 0) 4D, 3D (FTT 1) 4D+1TB, 4D 5D, 4D+1TB 5D. ok is false for 5D,
// which has no layout above it.
func (l Layout) RaisedForMaintenance() (raised Layout, ok bool) {
	for _, c := range [...]Layout{{l.FTT + 1, l.GMDR}, {l.FTT, l.GMDR + 1}, {l.FTT + 1, l.GMDR + 1}} {
		if c.valid() && c.KeepsQuorumWithoutOneD() {
			return c, true
		}
	}
	return l, false
}
