package layout

import "strconv"

// Zone guards apply to TransZonal volumes only; the engine skips them for
// other topologies. They ask one question per zone: if this whole zone were
// lost after the change, would the rest still serve IO with the promised
// copies? A zone is lost as a unit (power, network, a datacenter), so it can
// take several D at once, and the TB placement is what makes the survivors
// quorate when a zone holds half of the voters.
//
// Zones are checked in sorted order of name and the first failing zone is
// reported, so a message never flips between reconciles. The slice need not
// be sorted and may repeat a zone (entries of one name are added up); the
// guards do not allocate unless they refuse.

// ZoneCount is what one zone holds, counted by the engine from the members.
type ZoneCount struct {
	Zone      string
	D         int // voters: D + D∅
	UpToDateD int // D whose disk is UpToDate (part of D)
	TB        int
	// Diskless counts the other intentionally diskless members (A, sD∅).
	// The specification calls A invisible to quorum, but DRBD's tiebreaker asks for a
	// majority of all diskless peers, so an A in a lost zone can deny the
	// bridge that a TB elsewhere would give (docs/drbd-quorum.md).
	Diskless int
}

// Leaving is the voter a transition is about to take away. The guards count
// it as gone from the voters of its zone. When it stays as an A or TB
// (ChangeReplicaType), count it in its zone's Diskless or TB as well: it
// then still weighs in DRBD's diskless majority.
type Leaving struct {
	Zone string
	// UpToDate says whether its disk is UpToDate. The specification's pseudocode
	// assumes it is; when it is not, its removal costs no copy (see GuardGMDR).
	UpToDate bool
}

// zoneTotals adds up the entries named zone.
func zoneTotals(zones []ZoneCount, zone string) (z ZoneCount) {
	z.Zone = zone
	for _, c := range zones {
		if c.Zone == zone {
			z.D += c.D
			z.UpToDateD += c.UpToDateD
			z.TB += c.TB
			z.Diskless += c.Diskless
		}
	}
	return z
}

// firstOfName reports whether zones[i] is the first entry with its name, so
// that each zone is judged once.
func firstOfName(zones []ZoneCount, i int) bool {
	for j := 0; j < i; j++ {
		if zones[j].Zone == zones[i].Zone {
			return false
		}
	}
	return true
}

// checkZones returns "" for consistent counts, else a refusal naming the
// field and the rule. Inconsistent counts are an engine bug; refusing is the
// safe answer, and a panic is not an answer.
func checkZones(zones []ZoneCount) string {
	for _, c := range zones {
		switch {
		case c.D < 0 || c.UpToDateD < 0 || c.TB < 0 || c.Diskless < 0:
			return "invalid input: zone " + strconv.Quote(c.Zone) + ": counts must not be negative"
		case c.UpToDateD > c.D:
			return "invalid input: zone " + strconv.Quote(c.Zone) + ": UpToDateD=" +
				strconv.Itoa(c.UpToDateD) + " exceeds D=" + strconv.Itoa(c.D)
		}
	}
	return ""
}

// checkLeaving returns "" when the leaving voter exists in the counts.
func checkLeaving(zones []ZoneCount, l Leaving) string {
	z := zoneTotals(zones, l.Zone)
	if z.D < 1 || (l.UpToDate && z.UpToDateD < 1) {
		what := "D"
		if l.UpToDate {
			what = "UpToDate D"
		}
		return "invalid input: leaving zone " + strconv.Quote(l.Zone) + " has no " + what
	}
	return ""
}

// GuardZoneGMDR refuses to take a D away if, afterwards, losing some zone
// would leave no more than targetGMDR UpToDate D: the copies the promise
// counts on must not share a fate.
//
// The specification's pseudocode, per zone z:
//
//	inZone    = UpToDate_D_in_zone(z) - (1 if z is the leaving D's zone)
//	surviving = (UpToDate_D_count - 1) - inZone
//	blocked if surviving <= target_GMDR
//
// The "- 1" terms apply only when the leaving D is UpToDate: the specification's
// literal rule would refuse to remove a broken D from a zone that also holds
// its synced replacement, forever.
func GuardZoneGMDR(zones []ZoneCount, leaving Leaving, targetGMDR int) (bool, string) {
	if msg := checkZones(zones); msg != "" {
		return false, msg
	}
	if msg := checkLeaving(zones, leaving); msg != "" {
		return false, msg
	}
	total := 0
	for _, c := range zones {
		total += c.UpToDateD
	}
	if leaving.UpToDate {
		total--
	}
	bad, badN := -1, 0
	for i := range zones {
		if !firstOfName(zones, i) {
			continue
		}
		z := zoneTotals(zones, zones[i].Zone)
		in := z.UpToDateD
		if leaving.UpToDate && z.Zone == leaving.Zone {
			in--
		}
		if n := total - in; n <= targetGMDR && (bad < 0 || z.Zone < zones[bad].Zone) {
			bad, badN = i, n
		}
	}
	if bad < 0 {
		return true, ""
	}
	return false, "Would violate zone GMDR: losing zone " + zones[bad].Zone + " would leave " +
		strconv.Itoa(badN) + " D, need > " + strconv.Itoa(targetGMDR)
}

// zoneSurvives reports whether the voters outside zone z keep quorum when z
// is lost, voters and diskless counted after the change. It is DRBD's rule
// for nodes that were quorate before the loss: a majority (≥ q), or exactly
// one short with an even voter count and a strict majority of the diskless
// members (TB and the rest) still connected: the tiebreaker.
//
// The specification's pseudocode bridges with "TB_surviving > 0" alone; DRBD also
// needs the even voter count and the diskless majority, and DRBD wins.
func zoneSurvives(voters, q, dlTotal int, z ZoneCount) bool {
	d := voters - z.D
	if d >= q {
		return true
	}
	dl := dlTotal - z.TB - z.Diskless
	return d == q-1 && voters%2 == 0 && 2*dl > dlTotal
}

// GuardZoneFTT refuses to take a voter away if, afterwards, losing some zone
// would leave the other zones without quorum. q is the q the transition will
// set, Quorum(voters-1, effective); the specification writes ⌊(D_count-1)/2⌋+1, which
// is the same number whenever GuardFTT passes, and the floor makes this
// stricter, never looser, when it is not.
//
// The message is the specification's table text, "losing zone {z} would leave {d}
// voters, need > {min}", with min = q-1, or q-2 when the tiebreaker can
// bridge the gap for that zone (an even voter count and a diskless majority
// outside it). The specification's pseudocode prints "… D, q=…, TB=…" instead; the
// table is the contract, and the bridging shows in min.
func GuardZoneFTT(zones []ZoneCount, leaving Leaving, effective Layout) (bool, string) {
	if msg := checkZones(zones); msg != "" {
		return false, msg
	}
	if msg := checkLeaving(zones, leaving); msg != "" {
		return false, msg
	}
	voters, dl := -1, 0
	for _, c := range zones {
		voters += c.D
		dl += c.TB + c.Diskless
	}
	q := Quorum(voters, effective)
	bad, badD, badMin := -1, 0, 0
	for i := range zones {
		if !firstOfName(zones, i) {
			continue
		}
		z := zoneTotals(zones, zones[i].Zone)
		if z.Zone == leaving.Zone {
			z.D--
		}
		if zoneSurvives(voters, q, dl, z) || (bad >= 0 && z.Zone >= zones[bad].Zone) {
			continue
		}
		need := q - 1
		if voters%2 == 0 && 2*(dl-z.TB-z.Diskless) > dl {
			need = q - 2
		}
		bad, badD, badMin = i, voters-z.D, need
	}
	if bad < 0 {
		return true, ""
	}
	return false, "Would violate zone FTT: losing zone " + zones[bad].Zone + " would leave " +
		strconv.Itoa(badD) + " voters, need > " + strconv.Itoa(badMin)
}

// GuardZoneTBRequired refuses to take a TB away from tbZone if that breaks
// the survival of some zone's loss: a zone whose loss the voters outside it
// survive now (through the tiebreaker) but would not survive without this
// TB. Zones whose loss is not survivable with the TB either are not this
// guard's business; the TB does not protect them. q is Quorum(voters,
// effective): removing a TB does not change q.
//
// Typical refusal: 4D+1TB (2,1) over three zones as 2+1+1 D with the TB in a
// one-D zone; losing the two-D zone leaves two voters, one short of q=3, and
// only the TB bridges. Add the replacement TB (in a zone other than the
// two-D zone) first.
func GuardZoneTBRequired(zones []ZoneCount, tbZone string, effective Layout) (bool, string) {
	if msg := checkZones(zones); msg != "" {
		return false, msg
	}
	if zoneTotals(zones, tbZone).TB < 1 {
		return false, "invalid input: TB zone " + strconv.Quote(tbZone) + " has no TB"
	}
	voters, dl := 0, 0
	for _, c := range zones {
		voters += c.D
		dl += c.TB + c.Diskless
	}
	q := Quorum(voters, effective)
	bad := -1
	for i := range zones {
		if !firstOfName(zones, i) || (bad >= 0 && zones[i].Zone >= zones[bad].Zone) {
			continue
		}
		z := zoneTotals(zones, zones[i].Zone)
		before := zoneSurvives(voters, q, dl, z)
		if z.Zone == tbZone {
			z.TB--
		}
		if before && !zoneSurvives(voters, q, dl-1, z) {
			bad = i
		}
	}
	if bad < 0 {
		return true, ""
	}
	return false, "Would violate zone TB coverage for zone " + zones[bad].Zone
}

// MinZones is the fewest zones over which a TransZonal volume of layout l can be placed
// so that losing any one whole zone leaves the other zones quorate (a majority of the
// voters, or one short with the tiebreaker) and holding more than GMDR UpToDate copies:
// the promise TransZonal makes. It is derived by trying every spread of the layout's D
// and TB over z zones, z = 2, 3, …, with the zone guards' own rule (zoneSurvives). A
// layout with FTT 0 tolerates no failure, so no zone count makes it survive a zone
// loss: 1.
//
// Every valid layout with FTT ≥ 1 needs 3 zones, except 4D (FTT 1, GMDR 2), which needs
// 4: over 3 zones one zone holds 2 of the 4 D, and losing it leaves 2 copies where
// GMDR 2 promises 3. ZoneGMDR would then refuse every replacement of that volume for
// ever (docs/layouts.md), so the configuration is refused up front instead.
func (l Layout) MinZones() int {
	if l.FTT == 0 {
		return 1
	}
	d := l.DiskfulCount()
	tb := TieBreakerMin(d, l.FTT)
	q := Quorum(d, l)
	for z := 2; z < d+tb; z++ {
		if survivesAnyZone(d, tb, z, q, l.GMDR) {
			return z
		}
	}
	return d + tb
}

// survivesAnyZone: some spread of d D (each zone at least one member) and tb TB over z
// zones survives the loss of every single zone.
func survivesAnyZone(d, tb, z, q, gmdr int) bool {
	counts := make([]int, z)
	var try func(k, left int) bool
	try = func(k, left int) bool {
		if k == z-1 {
			counts[k] = left
			for t := 0; t < z || (tb == 0 && t == 0); t++ {
				if spreadSurvives(counts, t, d, tb, q, gmdr) {
					return true
				}
				if tb == 0 {
					break
				}
			}
			return false
		}
		for n := 0; n <= left; n++ {
			counts[k] = n
			if try(k+1, left-n) {
				return true
			}
		}
		return false
	}
	return try(0, d)
}

// spreadSurvives: with counts[k] D in zone k and the TB (if any) in zone t, every zone
// holds a member and losing any one zone keeps quorum and more than gmdr copies.
func spreadSurvives(counts []int, t, d, tb, q, gmdr int) bool {
	for k, n := range counts {
		tbHere := 0
		if tb > 0 && k == t {
			tbHere = tb
		}
		if n+tbHere == 0 {
			return false // an empty zone: this is a spread over fewer zones
		}
		if d-n <= gmdr || !zoneSurvives(d, q, tb, ZoneCount{D: n, TB: tbHere}) {
			return false
		}
	}
	return true
}
