package quorum

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Peers used by the scenarios. The cluster is the one of docs/drbd-quorum.md and
// the captures: node1 and node2 diskful, node3 diskless (a tiebreaker).
var (
	utd       = Peer{Connected: true, Disk: DiskUpToDate}
	utdQ      = Peer{Connected: true, Disk: DiskUpToDate, Quorate: true}
	inc       = Peer{Connected: true, Disk: DiskPresent}
	gone      = Peer{}                                    // diskful, unconnected, unknown
	outdated  = Peer{Outdated: true}                      // left gracefully / marked outdated
	leftMem   = Peer{LeftMembers: true}                   // unconnected, not in our members set
	tb        = Peer{Connected: true, Diskless: true}     // connected diskless (tiebreaker)
	tbGone    = Peer{Diskless: true}                      // diskless, not connected
	detachedP = Peer{Connected: true, Disk: DiskDetached} // diskful peer, currently detached
)

type scenario struct {
	name       string
	in         Input
	quorate    bool
	path       Path
	voters     int
	reason     string // DRBD's words, exact
	reasonPart string // or a part of them
}

func peers(p ...Peer) []Peer { return p }

// Every row of docs/drbd-quorum.md's "Observed" table that is a statement about
// one node's computation, in the order of the table, then the capture
// states and the corners of the rule.
var scenarios = []scenario{
	// Row 1: 2D + diskless, cut node1–node2 only → both diskful nodes stay
	// quorate through the tiebreaker (each was quorate before the cut).
	{
		name:    "row1/node1 after cut node1-node2 keeps quorum via tiebreaker",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
		quorate: true, path: PathTiebreaker, voters: 2,
		reasonPart: "1 of 2 nodes visible, need 2 for quorum; kept by tiebreaker",
	},
	{
		name:    "row1/node2 after cut node1-node2 keeps quorum too (quorum alone does not prevent two writers)",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
		quorate: true, path: PathTiebreaker, voters: 2,
	},
	// Row 2: then isolate node2; later reconnect it to node3 only.
	{
		name:    "row2/node2 isolated loses quorum (no diskless node connected)",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tbGone), QuorateNow: true},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "row2/node2 reconnected to node3 only does not regain quorum (tiebreaker keeps, never gains)",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: false},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "row2/node1 meanwhile, node2 still in its members set, keeps via tiebreaker",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
		quorate: true, path: PathTiebreaker, voters: 2,
	},
	{
		name:    "row2/node1 after an agreement without node2 (node2 left the members set) is quorate by count",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(leftMem, tb), QuorateNow: true},
		quorate: true, path: PathCount, voters: 1,
		reason: "1 of 1 nodes visible, need 1 for quorum",
	},
	// The product's 2D+1TB renders `quorum 2`, an explicit count, which the
	// shrunken electorate does not lower: after the survivors' agreement
	// without the lost Primary (drbd_state.c, twopc_after_lost_peer) the
	// surviving Diskful is one voter short of 2, an odd electorate, so the
	// tiebreaker does not apply (test/vm/FINDINGS.md, "The product on real
	// DRBD", 3).
	{
		name:    "quorum 2: a lost peer that left the members set takes the survivor's quorum",
		in:      Input{Quorum: Count(2), MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(leftMem, tb), QuorateNow: true},
		quorate: false, path: PathNone, voters: 1,
		reason: "1 of 1 nodes visible, need 2 for quorum",
	},
	{
		name:    "a node without quorum counts a peer outside its members set as unknown",
		in:      Input{Quorum: Count(2), MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(leftMem, tb)},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	// Row 3: `quorum 2`, isolate node2. node1 and node3 keep showing yes;
	// a node that is re-evaluated from a state in which it is not quorate
	// says no. When DRBD re-evaluates is the caller's business (drbdsim
	// recomputes only on the node's own state changes).
	{
		name:    "row3/quorum 2: node1 right after node2 is isolated still quorate (tiebreaker, as displayed)",
		in:      Input{Quorum: Count(2), Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
		quorate: true, path: PathTiebreaker, voters: 2,
	},
	{
		name:    "row3/quorum 2: node3 still quorate through node1's report",
		in:      Input{Quorum: Count(2), Self: DiskNone, Peers: peers(utdQ, gone)},
		quorate: true, path: PathQuoratePeer, voters: 2,
	},
	{
		name:    "row3/quorum 2: node1 recomputed from a non-quorate state: no",
		in:      Input{Quorum: Count(2), Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: false},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "row3/quorum 2: node3 once node1 reports no quorum: no",
		in:      Input{Quorum: Count(2), Self: DiskNone, Peers: peers(utd, gone)},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	// Row 4: qmr 2, node1 Primary, isolate node2: node1 keeps quorum via the
	// tiebreaker, where qmr is not applied, and writes.
	{
		name:    "row4/qmr 2: primary node1 keeps quorum via tiebreaker, qmr not applied",
		in:      Input{Quorum: Majority, MinRedundancy: Count(2), Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
		quorate: true, path: PathTiebreaker, voters: 2,
	},
	// Row 5: qmr 2, node2 down gracefully (Outdated); node1 may not promote,
	// diskless node3 becomes Primary through node1's quorate report.
	{
		name:    "row5/qmr 2: node1 with node2 outdated fails minimum redundancy",
		in:      Input{Quorum: Majority, MinRedundancy: Count(2), Self: DiskUpToDate, Peers: peers(outdated, tb), QuorateNow: true},
		quorate: false, path: PathNone, voters: 1,
		reason: "1 of 1 nodes up_to_date, need 2 for quorum-minimum-redundancy",
	},
	{
		name:    "row5/qmr 2: diskless node3 is quorate through node1's quorate report, qmr not applied",
		in:      Input{Quorum: Majority, MinRedundancy: Count(2), Self: DiskNone, Peers: peers(utdQ, outdated)},
		quorate: true, path: PathQuoratePeer, voters: 1,
	},
	// Row 6: diskless node with quorum 32: quorate exactly when connected to
	// an UpToDate peer that reports quorum.
	{
		name:    "row6/q32 diskless: connected to quorate UpToDate peer",
		in:      Input{Quorum: Count(32), Self: DiskNone, Peers: peers(utdQ, utd)},
		quorate: true, path: PathQuoratePeer, voters: 2,
	},
	{
		name:    "row6/q32 diskless: UpToDate peers without quorum",
		in:      Input{Quorum: Count(32), Self: DiskNone, Peers: peers(utd, utd)},
		quorate: false, path: PathNone, voters: 2,
		reason: "2 of 2 nodes visible, need 32 for quorum",
	},
	{
		name:    "row6/q32 diskless: quorate peer not UpToDate does not count",
		in:      Input{Quorum: Count(32), Self: DiskNone, Peers: peers(Peer{Connected: true, Disk: DiskPresent, Quorate: true})},
		quorate: false, path: PathNone, voters: 1,
	},
	// Row 7: diskful node with quorum 32: never quorate while attached;
	// quorate through a peer once detached.
	{
		name:    "row7/q32 diskful attached: never quorate, even with quorate peers",
		in:      Input{Quorum: Count(32), Self: DiskUpToDate, Peers: peers(utdQ, tb), QuorateNow: true},
		quorate: false, path: PathNone, voters: 2,
		reason: "2 of 2 nodes visible, need 32 for quorum",
	},
	{
		name:    "row7/q32 diskful detached: quorate through a quorate peer",
		in:      Input{Quorum: Count(32), Self: DiskDetached, Peers: peers(utdQ, tb)},
		quorate: true, path: PathQuoratePeer, voters: 2,
	},
	// Row 8: a non-UpToDate disk counts toward quorum, not toward minimum
	// redundancy.
	{
		name:    "row8/inconsistent disks count toward quorum (capture 01, node1)",
		in:      Input{Quorum: Majority, Self: DiskPresent, Peers: peers(inc, tb)},
		quorate: true, path: PathCount, voters: 2,
		reason: "2 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "row8/inconsistent disks do not count toward qmr",
		in:      Input{Quorum: Majority, MinRedundancy: Count(1), Self: DiskPresent, Peers: peers(inc, tb)},
		quorate: false, path: PathNone, voters: 2,
		reason: "0 of 2 nodes up_to_date, need 1 for quorum-minimum-redundancy",
	},
	{
		name:    "row8/outdated local disk counts toward quorum",
		in:      Input{Quorum: Majority, Self: DiskPresent, Peers: peers(utd, tb)},
		quorate: true, path: PathCount, voters: 2,
	},
	// Row 9: node2 left gracefully (Outdated), then node1 isolated: node1
	// alone keeps quorum ("last man standing").
	{
		name:    "row9/last man standing: outdated absent peer leaves the electorate",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(outdated, tbGone), QuorateNow: true},
		quorate: true, path: PathCount, voters: 1,
		reason: "1 of 1 nodes visible, need 1 for quorum",
	},
	{
		name:    "row9/last man standing does not need to be quorate before",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(outdated, tbGone)},
		quorate: true, path: PathCount, voters: 1,
	},
	{
		name:    "row9/one unknown peer brings the outdated ones back into the electorate",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(outdated, gone, tbGone), QuorateNow: true},
		quorate: false, path: PathNone, voters: 3,
		reason: "1 of 3 nodes visible, need 2 for quorum",
	},

	// The captures.
	{
		name:    "capture01/node3 diskless with two Inconsistent peers is quorate",
		in:      Input{Quorum: Majority, Self: DiskNone, Peers: peers(inc, inc)},
		quorate: true, path: PathCount, voters: 2,
	},
	{
		name:    "capture05/node1 Primary after node3 down: 2 of 2",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(utd, tbGone), QuorateNow: true},
		quorate: true, path: PathCount, voters: 2,
		reason: "2 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "capture05/node1 Primary after node2's link is cut: quorum:no",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tbGone), QuorateNow: true},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "capture05/node2 isolated: quorum:no",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tbGone), QuorateNow: true},
		quorate: false, path: PathNone, voters: 2,
	},

	// Corners of the rule.
	{
		name:    "off is always quorate",
		in:      Input{Quorum: Off, Self: DiskPresent, Peers: peers(gone, gone)},
		quorate: true, path: PathOff, voters: 3, reason: "quorum off",
	},
	{
		name:    "all needs every voter",
		in:      Input{Quorum: All, Self: DiskUpToDate, Peers: peers(utd, gone)},
		quorate: false, path: PathNone, voters: 3,
		reason: "2 of 3 nodes visible, need 3 for quorum",
	},
	{
		name:    "allow-remote-read no: peer not counted at all",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(Peer{Excluded: true}, gone)},
		quorate: false, path: PathNone, voters: 2,
		reason: "1 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "quorumless peers leave the electorate while too few are absent",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(utd, leftMem, tbGone), QuorateNow: true},
		quorate: true, path: PathCount, voters: 2,
	},
	{
		name:    "quorumless peers become unknown when the absent could be a quorum",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(leftMem, leftMem, tbGone), QuorateNow: true},
		quorate: false, path: PathNone, voters: 3,
		reason: "1 of 3 nodes visible, need 2 for quorum",
	},
	{
		name:    "detached diskful node counts itself as an absent voter and gets no tiebreaker vote",
		in:      Input{Quorum: Majority, Self: DiskDetached, Peers: peers(utd, gone)},
		quorate: false, path: PathNone, voters: 3,
		reason: "1 of 3 nodes visible, need 2 for quorum",
	},
	{
		name:    "connected detached diskful peer counts as present",
		in:      Input{Quorum: Majority, MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(detachedP, gone)},
		quorate: true, path: PathCount, voters: 3,
	},
	// What a connected peer counts as depends on what it reports and, for a node
	// with a disk, on what our configuration calls it (the kernel's
	// __calc_quorum_with_disk and __calc_quorum_no_disk): a peer our configuration
	// still names diskless (a replica that joined diskless and has since attached
	// its disk, before we applied that change) counts by the disk it reports.
	{
		name:    "a peer configured diskless that reports UpToDate counts as an UpToDate voter",
		in:      Input{Quorum: Count(2), MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(Peer{Connected: true, Diskless: true, Disk: DiskUpToDate})},
		quorate: true, path: PathCount, voters: 2,
	},
	{
		name:    "a peer configured diskless that reports Inconsistent counts as present",
		in:      Input{Quorum: Count(2), Self: DiskUpToDate, Peers: peers(Peer{Connected: true, Diskless: true, Disk: DiskPresent})},
		quorate: true, path: PathCount, voters: 2,
	},
	{
		name:    "a peer configured with a disk that reports Diskless counts as present for a node with a disk",
		in:      Input{Quorum: Count(2), Self: DiskUpToDate, Peers: peers(Peer{Connected: true, Disk: DiskNone})},
		quorate: true, path: PathCount, voters: 2,
	},
	{
		name:    "a peer configured with a disk that reports Diskless is a diskless vote for a node without a disk",
		in:      Input{Quorum: Majority, Self: DiskNone, Peers: peers(Peer{Connected: true, Disk: DiskNone}, gone, gone)},
		quorate: false, path: PathNone, voters: 2,
		reason: "0 of 2 nodes visible, need 2 for quorum",
	},
	{
		name:    "tiebreaker needs a majority of the diskless nodes",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tb, tbGone), QuorateNow: true},
		quorate: false, path: PathNone, voters: 2,
	},
	{
		name:    "tiebreaker needs an even electorate",
		in:      Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, gone, tb), QuorateNow: true},
		quorate: false, path: PathNone, voters: 3,
	},
	{
		name:    "diskless node alone knows no voter",
		in:      Input{Quorum: Majority, Self: DiskNone, Peers: peers(tb), QuorateNow: true},
		quorate: false, path: PathNone, voters: 0,
		reason: "0 of 0 nodes visible, need 1 for quorum",
	},
}

func TestScenarios(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			in := sc.in
			r := Compute(&in)
			if r.Quorate != sc.quorate || r.Path != sc.path || r.Voters != sc.voters {
				t.Fatalf("got quorate=%v path=%v voters=%d (%s), want quorate=%v path=%v voters=%d\nresult: %+v",
					r.Quorate, r.Path, r.Voters, r.Reason(), sc.quorate, sc.path, sc.voters, r)
			}
			if sc.reason != "" && r.Reason() != sc.reason {
				t.Errorf("reason %q, want %q", r.Reason(), sc.reason)
			}
			if sc.reasonPart != "" && !strings.Contains(r.Reason(), sc.reasonPart) {
				t.Errorf("reason %q does not contain %q", r.Reason(), sc.reasonPart)
			}
		})
	}
}

// The 4-voter tiebreaker: with 2 of 4 visible, majority needs 3, so two
// visible is exactly one short and the tiebreaker keeps quorum.
func TestTiebreakerFourVoters(t *testing.T) {
	in := Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(utd, gone, gone, tb), QuorateNow: true}
	r := Compute(&in)
	if !r.Quorate || r.Path != PathTiebreaker || r.QuorumAt != 3 {
		t.Fatalf("got %+v (%s)", r, r.Reason())
	}
}

func TestSettingAt(t *testing.T) {
	cases := []struct {
		s    Setting
		n    int
		want int
	}{
		{Off, 3, 0}, {Majority, 0, 1}, {Majority, 1, 1}, {Majority, 2, 2}, {Majority, 3, 2},
		{Majority, 4, 3}, {Majority, 5, 3}, {All, 4, 4}, {Count(2), 5, 2}, {Count(32), 3, 32},
	}
	for _, c := range cases {
		if got := c.s.At(c.n); got != c.want {
			t.Errorf("%v.At(%d) = %d, want %d", c.s, c.n, got, c.want)
		}
	}
}

func TestParseSetting(t *testing.T) {
	for _, s := range []string{"off", "majority", "all", "1", "2", "32"} {
		v, err := ParseSetting("quorum", s)
		if err != nil {
			t.Fatalf("ParseSetting(%q): %v", s, err)
		}
		if v.String() != s {
			t.Errorf("ParseSetting(%q).String() = %q", s, v.String())
		}
	}
	for _, s := range []string{"0", "33", "-1", "most", "2.5"} {
		_, err := ParseSetting("quorum-minimum-redundancy", s)
		if err == nil || !strings.Contains(err.Error(), "quorum-minimum-redundancy") {
			t.Errorf("ParseSetting(%q) error %v, want one naming the field", s, err)
		}
	}
}

func TestComputeDoesNotAllocate(t *testing.T) {
	in := Input{Quorum: Majority, MinRedundancy: Count(2), Self: DiskUpToDate, Peers: peers(utd, gone, leftMem, tb, tbGone), QuorateNow: true}
	if n := testing.AllocsPerRun(1000, func() { _ = Compute(&in) }); n != 0 {
		t.Fatalf("Compute allocates %v times per call", n)
	}
}

// TestNoTwoFreshPartitions checks the property the model checker builds
// on: if no node holds quorum before a partition (QuorateNow false, so the
// tiebreaker cannot keep anything) and every node's view is fresh, then two
// disjoint sides cannot both have a quorate node. Exhaustive over up to 5
// diskful + 2 diskless nodes, every split into two sides, every mix of
// UpToDate/Inconsistent disks, every quorum and qmr setting.
func TestNoTwoFreshPartitions(t *testing.T) {
	settings := []Setting{Majority, All, Count(1), Count(2), Count(3)}
	qmrs := []Setting{Off, Majority, Count(1), Count(2)}
	checked := 0
	for nd := 1; nd <= 5; nd++ {
		for nl := 0; nl <= 2; nl++ {
			n := nd + nl
			for side := 0; side < 1<<n; side++ {
				for utdMask := 0; utdMask < 1<<nd; utdMask++ {
					for _, q := range settings {
						for _, qmr := range qmrs {
							if q > 0 && int(q)*2 <= nd {
								// An explicit k at or below half the voters
								// lets two halves both reach it: that is the
								// operator's choice, not the rule's fault.
								continue
							}
							var quorate [2]bool
							for s := 0; s < 2; s++ {
								quorate[s] = sideQuorate(nd, nl, side, s, utdMask, q, qmr)
							}
							checked++
							if quorate[0] && quorate[1] {
								t.Fatalf("nd=%d nl=%d side=%b utd=%b q=%v qmr=%v: both sides quorate", nd, nl, side, utdMask, q, qmr)
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d partitions checked", checked)
}

// sideQuorate computes, for each node on side s (bit of side), quorum as a
// fresh node sees it: peers on its side connected, the others unknown. The
// diskful nodes go first so that diskless nodes see their reports.
func sideQuorate(nd, nl, side, s, utdMask int, q, qmr Setting) bool {
	n := nd + nl
	var reports [8]bool
	var buf [8]Peer
	any := false
	for i := 0; i < n; i++ {
		if (side>>i)&1 != s {
			continue
		}
		ps := buf[:0]
		for j := 0; j < n; j++ {
			if j == i {
				continue
			}
			p := Peer{Diskless: j >= nd}
			if (side>>j)&1 == s {
				p.Connected = true
				if j < nd {
					p.Disk = DiskPresent
					if utdMask>>j&1 == 1 {
						p.Disk = DiskUpToDate
					}
					p.Quorate = reports[j]
				}
			}
			ps = append(ps, p)
		}
		self := DiskNone
		if i < nd {
			self = DiskPresent
			if utdMask>>i&1 == 1 {
				self = DiskUpToDate
			}
		}
		in := Input{Quorum: q, MinRedundancy: qmr, Self: self, Peers: ps}
		r := Compute(&in)
		reports[i] = r.Quorate
		any = any || r.Quorate
	}
	return any
}

func BenchmarkCompute(b *testing.B) {
	in := Input{Quorum: Majority, MinRedundancy: Count(2), Self: DiskUpToDate,
		Peers: peers(utd, gone, leftMem, tb, tbGone, inc), QuorateNow: true}
	b.ReportAllocs()
	for b.Loop() {
		_ = Compute(&in)
	}
}

// FuzzCompute decodes arbitrary bytes into a view and checks the rule's
// invariants: it never panics, the counts add up, and each path's
// precondition holds.
func FuzzCompute(f *testing.F) {
	f.Add([]byte{1, 0, 3, 1, 0x15, 0x00, 0x03})
	f.Add([]byte{0xff, 0x02, 0x02, 0x00, 0x01, 0x20, 0x40, 0x7f})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 4 {
			return
		}
		settings := []Setting{Off, Majority, All, Count(1), Count(2), Count(3), Count(32)}
		in := Input{
			Quorum:        settings[int(b[0])%len(settings)],
			MinRedundancy: settings[int(b[1])%len(settings)],
			Self:          Disk(b[2] % 4),
			QuorateNow:    b[3]&1 == 1,
		}
		for _, x := range b[4:min(len(b), 36)] {
			in.Peers = append(in.Peers, Peer{
				Connected: x&1 != 0, Diskless: x&2 != 0, Disk: Disk(x >> 2 & 3), Outdated: x&16 != 0,
				LeftMembers: x&32 != 0, Quorate: x&64 != 0, Excluded: x&128 != 0,
			})
		}
		r := Compute(&in)
		nodes := 1
		for _, p := range in.Peers {
			if !p.Excluded {
				nodes++
			}
		}
		sum := r.UpToDate + r.Present + r.Outdated + r.Quorumless + r.Unknown + r.Diskless + r.MissingDiskless
		if sum != nodes {
			t.Fatalf("sorted %d nodes, have %d: %+v", sum, nodes, r)
		}
		if r.Voters < r.Visible() {
			t.Fatalf("voters %d < visible %d", r.Voters, r.Visible())
		}
		switch r.Path {
		case PathNone:
			if r.Quorate {
				t.Fatal("quorate without a path")
			}
		case PathOff:
			if in.Quorum != Off {
				t.Fatal("off path with quorum on")
			}
		case PathQuoratePeer:
			if in.Self == DiskUpToDate || in.Self == DiskPresent || r.QuoratePeers == 0 {
				t.Fatalf("quorate-peer path with a local disk or no quorate peer: %+v", r)
			}
		case PathCount:
			if r.Visible() < r.QuorumAt || r.UpToDate < r.RedundancyAt {
				t.Fatalf("count path without the count: %+v", r)
			}
		case PathTiebreaker:
			if !in.QuorateNow {
				t.Fatal("the tiebreaker gained quorum")
			}
		}
		if r.Quorate != (r.Path != PathNone) {
			t.Fatalf("quorate %v with path %v", r.Quorate, r.Path)
		}
		_ = r.Reason()
	})
}

// TestTiebreakerKeepsNeverGains states the tiebreaker rule by its meaning over every
// node view with up to four peers of seven kinds, under every quorum setting and local
// disk: a node that is not quorate now never becomes quorate through the tiebreaker;
// whatever it is quorate by without holding quorum, it is quorate by holding it too;
// the only things holding quorum adds are the tiebreaker path and, on the count path,
// peers outside the members set leaving the electorate (quorumless only to a quorate
// node). The model checker decides
// every node as possibly quorate before a cut (a sound over-approximation), so it never
// exercises "never gains" itself: this test does.
func TestTiebreakerKeepsNeverGains(t *testing.T) {
	kinds := []Peer{
		{Connected: true, Diskless: true}, {Connected: true, Disk: DiskUpToDate}, {Connected: true, Disk: DiskPresent},
		{Diskless: true}, {}, {Outdated: true}, {LeftMembers: true},
	}
	settings := []Setting{Majority, All, Count(1), Count(2), Count(3)}
	kept := 0
	var peers []Peer
	var walk func(n int)
	walk = func(n int) {
		for _, q := range settings {
			for self := Disk(0); self < 4; self++ {
				in := Input{Quorum: q, MinRedundancy: Count(1), Self: self, Peers: peers}
				gain := Compute(&in)
				in.QuorateNow = true
				keep := Compute(&in)
				switch {
				case gain.Path == PathTiebreaker:
					t.Fatalf("not quorate now, quorate by the tiebreaker: %+v\n%+v", in, gain)
				case gain.Quorate && !keep.Quorate:
					t.Fatalf("quorate only when not holding quorum: %+v", in)
				case keep.Quorate && !gain.Quorate:
					if keep.Path != PathTiebreaker && (keep.Path != PathCount || !slices.ContainsFunc(peers, func(p Peer) bool { return p.LeftMembers })) {
						t.Fatalf("holding quorum made a difference on path %v: %+v", keep.Path, in)
					}
					kept++
				}
			}
		}
		if n == 4 {
			return
		}
		for _, k := range kinds {
			peers = append(peers, k)
			walk(n + 1)
			peers = peers[:len(peers)-1]
		}
	}
	walk(0)
	if kept == 0 {
		t.Fatal("no view where the tiebreaker keeps quorum: the test exercises nothing")
	}
	t.Logf("%d views keep quorum only through the tiebreaker", kept)
}

// TestAfterLostPeer: the quorum a survivor keeps once the lost-peer agreement has
// taken the gone voter out of its members set (docs/drbd-quorum.md, "The members
// set"). meshvol's 2D+1TB (quorum 2): the Diskful survivor keeps quorum at the loss
// through the tiebreaker, and loses it after the agreement (one voter of an odd
// electorate); 3D (quorum 2, qmr 2) keeps it (two voters of two); quorum majority
// keeps it (the electorate shrinks); so does an even electorate left one short, through
// the tiebreaker; a node without quorum at the loss takes part in no agreement and
// stays without.
func TestAfterLostPeer(t *testing.T) {
	for _, c := range []struct {
		name     string
		in       Input
		atLoss   bool
		after    bool
		wantPath Path
		reason   string
	}{
		{"2D+1TB, q=2", Input{Quorum: Count(2), MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
			true, false, PathNone, "1 of 1 nodes visible, need 2 for quorum"},
		{"3D, q=2 qmr=2", Input{Quorum: Count(2), MinRedundancy: Count(2), Self: DiskUpToDate, Peers: peers(utd, gone), QuorateNow: true},
			true, true, PathCount, "2 of 2 nodes visible, need 2 for quorum"},
		{"2D+1TB, quorum majority", Input{Quorum: Majority, Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: true},
			true, true, PathCount, "1 of 1 nodes visible, need 1 for quorum"},
		{"4D+1TB, q=3, two gone", Input{Quorum: Count(3), MinRedundancy: Count(2), Self: DiskUpToDate, Peers: peers(utd, gone, gone, tb), QuorateNow: true},
			true, true, PathTiebreaker, "2 of 2 nodes visible, need 3 for quorum; kept by tiebreaker (1 of 1 diskless nodes connected)"},
		{"5D, q=3, two gone", Input{Quorum: Count(3), MinRedundancy: Count(3), Self: DiskUpToDate, Peers: peers(utd, utd, gone, gone), QuorateNow: true},
			true, true, PathCount, "3 of 3 nodes visible, need 3 for quorum"},
		{"not quorate at the loss", Input{Quorum: Count(2), MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(gone, tb), QuorateNow: false},
			false, false, PathNone, "1 of 2 nodes visible, need 2 for quorum"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			if r := Compute(&in); r.Quorate != c.atLoss {
				t.Fatalf("at the loss: quorate=%v (%s), want %v", r.Quorate, r.Reason(), c.atLoss)
			}
			r := AfterLostPeer(&in)
			if r.Quorate != c.after || r.Path != c.wantPath || r.Reason() != c.reason {
				t.Fatalf("after the agreement: quorate=%v path=%v %q, want %v %v %q", r.Quorate, r.Path, r.Reason(), c.after, c.wantPath, c.reason)
			}
			if !reflect.DeepEqual(in, c.in) {
				t.Fatalf("AfterLostPeer changed its input: %+v", in)
			}
		})
	}
	in := Input{Quorum: Count(2), MinRedundancy: Count(1), Self: DiskUpToDate, Peers: peers(utd, gone, tb), QuorateNow: true}
	if n := testing.AllocsPerRun(1000, func() { _ = AfterLostPeer(&in) }); n != 0 {
		t.Fatalf("AfterLostPeer allocates %v times per call", n)
	}
}
