package layout

import "strconv"

// Guards decide whether a transition may start; the transition itself decides
// how q moves. Each returns ok, or false and the message the engine shows in
// the transition's progress (docs/datamesh-spec.md, "Preconditions"). Messages are built
// only on refusal, so an accepted check allocates nothing.
//
// The guards for leaving D run, in the specification's order, QMRReady, GMDR, FTT,
// and for TransZonal also ZoneGMDR and ZoneFTT (zones.go); for leaving TB,
// TBRequired and for TransZonal ZoneTBRequired. VolumeAccessLocal and
// NotAttached are about attachment, not layout, and live in the engine.

// GuardQMRReady refuses to take a D away while qmr is above the target
// layout's GMDR+1: the embedded qmr↓ (or a ChangeQuorum) has not been applied
// yet. Removing a D first would leave the remaining D unable to meet the old,
// higher qmr after one more failure, and a downgrade would lose availability
// it was meant to keep. The message's target is the qmr the target layout
// wants, GMDR+1, so both numbers are in the same unit.
func GuardQMRReady(currentQMR, targetGMDR int) (bool, string) {
	if currentQMR <= targetGMDR+1 {
		return true, ""
	}
	return false, "ChangeQuorum not yet applied: qmr=" + strconv.Itoa(currentQMR) +
		", target=" + strconv.Itoa(targetGMDR+1)
}

// GuardGMDR refuses to take a D away when the UpToDate copies left would no
// longer cover the target GMDR: afterwards ADR must still be ≥ GMDR.
//
// The specification states it as ADR > target_GMDR on the current counts, which
// assumes the leaving D is UpToDate. When it is not (a failed disk, a replica
// that never finished its sync), taking it away leaves ADR unchanged, so
// ADR ≥ target_GMDR is enough; the specification's rule would then refuse to remove
// a broken D from 2D (0,1) + its synced replacement forever. leavingUpToDate
// says which case applies; with true this is the specification's rule and message,
// with false the message names the threshold actually required
// (need > target_GMDR-1).
func GuardGMDR(upToDateD int, leavingUpToDate bool, targetGMDR int) (bool, string) {
	need := targetGMDR
	if !leavingUpToDate {
		need--
	}
	adr := ADR(upToDateD)
	if adr > need {
		return true, ""
	}
	return false, "Would violate GMDR: ADR=" + strconv.Itoa(adr) + ", need > " + strconv.Itoa(need)
}

// GuardFTT refuses to take a voter away while the voter count (D + D∅) is
// not above the target layout's D count: there is no spare, and removing one
// would leave fewer voters than FTT failures need. Replace by adding first,
// or lower the configuration first.
func GuardFTT(dCount int, target Layout) (bool, string) {
	minD := target.DiskfulCount()
	if dCount > minD {
		return true, ""
	}
	return false, "Would violate FTT: D_count=" + strconv.Itoa(dCount) + ", need > " + strconv.Itoa(minD)
}

// GuardTBRequired refuses to take a TB away when the voters still need one:
// an even voter count whose target FTT is half of it survives FTT failures
// only through DRBD's tiebreaker (TieBreakerMin). tbCount is the number of
// TB before the removal; with zero there is nothing to remove and the guard
// refuses rather than guess.
//
// Below the layout (a degraded datamesh) the rule stays the specification's, exactly
// FTT = D/2, and that is right: with D < FTT+GMDR+1 ≤ 2·GMDR+2 the half that
// survives D/2 failures holds fewer than GMDR+1 copies, so no TB can restore
// the promise there. (It would keep DRBD quorate, since the tiebreaker
// ignores qmr, which is the opposite of what GMDR asks.)
func GuardTBRequired(tbCount, dCount, targetFTT int) (bool, string) {
	if tbCount < 1 {
		return false, "invalid input: TB_count=" + strconv.Itoa(tbCount) + ", removing a TB needs TB_count ≥ 1"
	}
	if tbCount > TieBreakerMin(dCount, targetFTT) {
		return true, ""
	}
	return false, "TB required: D_count=" + strconv.Itoa(dCount) + " even, FTT=" + strconv.Itoa(targetFTT) + " = D/2"
}
