package layout

import "math/bits"

// A model of how DRBD 9.2 decides quorum, written from docs/drbd-quorum.md
// and independent of the package's formulas: the proofs feed it the q and qmr
// the package computes and check what the nodes would actually do.
//
// Nodes are numbered; sets of nodes are bitmasks. Every node runs one
// configuration (a member set with q and qmr). Two nodes are connected when
// they are on the same side of the network and each lists the other as a
// member. Failed nodes are on no side. Only failure by crash or partition is
// modelled (peers see the node as unknown, not as Outdated), which is the
// case FTT is about.

type drbdConfig struct {
	voters   uint32 // D and D∅: nodes that vote
	diskless uint32 // TB and A: intentionally diskless members
	q, qmr   int
}

func (c drbdConfig) members() uint32 { return c.voters | c.diskless }

func count(m uint32) int { return bits.OnesCount32(m) }

// drbdView is how a diskful node sorts the members it knows
// (docs/drbd-quorum.md). Nothing in these models is known Outdated or quorumless,
// so every absent voter is unknown.
type drbdView struct {
	upToDate, present, unknown int // voters, itself included
	diskless, missingDiskless  int
}

// drbdDecide is DRBD's decision for a node with a local disk. wasQuorate is
// its state before this change: the tiebreaker only keeps quorum.
func drbdDecide(v drbdView, q, qmr int, wasQuorate bool) bool {
	absent := v.unknown
	voters := v.upToDate + v.present
	if v.unknown > 0 {
		voters += absent
	}
	// An explicit q is taken literally, whatever the voter count.
	if v.upToDate+v.present >= q && v.upToDate >= qmr {
		return true
	}
	return voters%2 == 0 && v.upToDate+v.present == q-1 && wasQuorate &&
		v.diskless > v.missingDiskless // a majority of the diskless members is connected
}

// viewOf is what voter x, running configs[which[x]], sees when connected to
// conn. A connected peer is sorted by its own configuration (DRBD learns
// from the peer whether it is intentionally diskless); an unconnected one by
// what x's configuration says it is.
func viewOf(x int, configs []drbdConfig, which []int, conn, upToDate uint32) drbdView {
	cx := configs[which[x]]
	var v drbdView
	for y := range which {
		bit := uint32(1) << y
		switch {
		case y == x || conn&bit != 0:
			switch {
			case configs[which[y]].voters&bit == 0:
				v.diskless++
			case upToDate&bit != 0:
				v.upToDate++
			default:
				v.present++
			}
		case cx.voters&bit != 0:
			v.unknown++
		case cx.diskless&bit != 0:
			v.missingDiskless++
		}
	}
	return v
}

// drbdVoterQuorate is DRBD's decision on voter x when every member runs c,
// x is connected to conn, and upToDate holds the voters with an UpToDate
// disk (the others are present: Inconsistent, Outdated, or a detached D∅).
// It also reports how many UpToDate disks x sees.
func drbdVoterQuorate(x int, c drbdConfig, conn, upToDate uint32, wasQuorate bool) (bool, int) {
	which := make([]int, bits.Len32(c.members()))
	v := viewOf(x, []drbdConfig{c}, which, conn&c.members(), upToDate)
	return drbdDecide(v, c.q, c.qmr, wasQuorate), v.upToDate
}

// failureTolerance is the brute-force FTT of a datamesh whose every member
// runs c with all voters UpToDate: the largest f such that, for every set of
// at most f failed members, taken in every order, some surviving voter stays
// quorate and sees at least c.qmr UpToDate disks (the meshvol promise: DRBD
// itself does not check qmr on the tiebreaker path). -1 when even the intact
// datamesh does not serve IO.
func failureTolerance(c drbdConfig) int {
	all := c.members()
	memo := map[uint32]bool{}
	f := -1
	for k := 0; k <= count(all); k++ {
		for failed := uint32(0); failed <= all; failed++ {
			if failed&^all == 0 && count(failed) == k && !servesAfter(c, failed, memo) {
				return f
			}
		}
		f = k
	}
	return f
}

// servesAfter reports whether c still serves IO (a surviving voter is
// quorate and sees qmr UpToDate disks) after exactly the failures in failed,
// whatever order they came in: the tiebreaker keeps quorum only if it was
// held just before the last failure, so every order must have kept it.
func servesAfter(c drbdConfig, failed uint32, memo map[uint32]bool) bool {
	if v, ok := memo[failed]; ok {
		return v
	}
	alive := c.members() &^ failed
	v := false
	if x := c.voters & alive; x != 0 {
		first := 0
		for x&(1<<first) == 0 {
			first++
		}
		q, utd := drbdVoterQuorate(first, c, alive, c.voters, false)
		v = q && utd >= c.qmr
		if !v && failed != 0 {
			before := true
			for m := failed; m != 0; m &= m - 1 {
				if !servesAfter(c, failed&^(m&-m), memo) {
					before = false
					break
				}
			}
			q, utd = drbdVoterQuorate(first, c, alive, c.voters, before)
			v = q && utd >= c.qmr
		}
	}
	memo[failed] = v
	return v
}

// splitBrain looks for two disjoint sets of voters that are both quorate:
// every member runs one of the given configurations (nodes in fixed[i] >= 0
// are pinned to configuration fixed[i]), and the network is cut into two
// sides in every possible way. wasQuorate[i] says whether a node running
// configuration i may have been quorate before the cut (the tiebreaker only
// keeps quorum); upToDate holds the voters with an
// UpToDate disk. It returns a description of the first
// split brain found, or "".
func splitBrain(nodes int, configs []drbdConfig, wasQuorate []bool, fixed []int, upToDate uint32) string {
	all := uint32(1)<<nodes - 1
	var free []int
	for i := 0; i < nodes; i++ {
		if fixed[i] < 0 {
			free = append(free, i)
		}
	}
	which := make([]int, nodes)
	for assign := 0; assign < pow(len(configs), len(free)); assign++ {
		a := assign
		for i := 0; i < nodes; i++ {
			if fixed[i] >= 0 {
				which[i] = fixed[i]
			}
		}
		for _, i := range free {
			which[i] = a % len(configs)
			a /= len(configs)
		}
		// Side A always holds node 0; side B is the rest.
		for sideA := uint32(1); sideA <= all; sideA += 2 {
			if sideA&^all != 0 {
				continue
			}
			if quorateOn(sideA, configs, wasQuorate, which, upToDate) && quorateOn(all&^sideA, configs, wasQuorate, which, upToDate) {
				return describe(sideA, all, which)
			}
		}
	}
	return ""
}

// quorateOn reports whether some voter on side is quorate under its own
// configuration, all voters in upToDate being UpToDate.
func quorateOn(side uint32, configs []drbdConfig, wasQuorate []bool, which []int, upToDate uint32) bool {
	for x := range which {
		cx := configs[which[x]]
		if side&(1<<x) == 0 || cx.voters&(1<<x) == 0 {
			continue
		}
		var conn uint32
		for y := range which {
			if side&(1<<y) != 0 && cx.members()&(1<<y) != 0 && configs[which[y]].members()&(1<<x) != 0 {
				conn |= 1 << y
			}
		}
		if drbdDecide(viewOf(x, configs, which, conn, upToDate), cx.q, cx.qmr, wasQuorate[which[x]]) {
			return true
		}
	}
	return false
}

func describe(sideA, all uint32, which []int) string {
	s := "side A {"
	for x := range which {
		if sideA&(1<<x) != 0 {
			s += " n" + string(rune('0'+x)) + "/cfg" + string(rune('0'+which[x]))
		}
	}
	s += " } side B {"
	for x := range which {
		if (all&^sideA)&(1<<x) != 0 {
			s += " n" + string(rune('0'+x)) + "/cfg" + string(rune('0'+which[x]))
		}
	}
	return s + " }"
}

func pow(b, e int) int {
	r := 1
	for ; e > 0; e-- {
		r *= b
	}
	return r
}

// layoutConfig is the DRBD configuration of a layout's full replica set,
// voters first (nodes 0..d-1), then tb TBs.
func layoutConfig(l Layout, d, tb int) drbdConfig {
	return drbdConfig{
		voters:   uint32(1)<<d - 1,
		diskless: (uint32(1)<<tb - 1) << d,
		q:        Quorum(d, l),
		qmr:      QMR(l),
	}
}
