package layout

// Quorum is the q meshvol gives the voters (D and D∅) of a datamesh: the
// explicit number in DRBD's `quorum <q>` option. DRBD takes an explicit number
// literally, whatever the voter count (docs/drbd-quorum.md), so this function
// alone decides how many voters must see each other to serve IO.
//
//	q = max(⌊voters/2⌋+1, ⌊minD/2⌋+1), minD = effective FTT + GMDR + 1
//
// The first term is a strict majority: two disjoint sets of voters cannot
// both reach it, so two sides of a partition cannot both write.
//
// The second term is the floor. The voter count drops below the layout's
// minD only while something is wrong: a ForceRemoveReplica took out a node
// that did not confirm (it was merely unreachable; it may be alive behind a
// partition, still running the previous configuration with a majority of the
// old voter set), or a voter transition is half way. A quorum of the new
// configuration must still intersect every quorum of the old one:
// q_new + q_old > n_old. With one voter transition at a time n_old ≤ minD+1,
// and ⌊minD/2⌋+1 is exactly enough (TestQuorumFloor checks every case,
// tiebreaker included; its one exception, a TB layout at minD+1 voters with
// a member still on the old configuration, is for the engine to prevent:
// docs/layouts.md §8). So a transient shortage of voters never lowers q:
// the volume suspends instead of writing on a minority. This is also why the
// engine never lowers q "to get going". Only an explicit downgrade of the
// configuration lowers the effective layout, and with it the floor.
//
// Zero or negative voter counts give the floor (at least 1), which no empty
// voter set reaches.
func Quorum(voters int, effective Layout) int {
	q := voters/2 + 1
	if voters < 0 {
		q = 1
	}
	if f := effective.DiskfulCount()/2 + 1; f > q {
		q = f
	}
	return q
}

// QMR is the qmr meshvol gives every member: DRBD's
// `quorum-minimum-redundancy`. A diskful node is quorate only while it sees
// at least qmr UpToDate disks (itself included), so no write is acknowledged
// with fewer than GMDR+1 copies on that path.
//
// Real DRBD 9.2 does not check qmr on two other paths (docs/drbd-quorum.md): a
// diskless node (A, TB) is quorate through any quorate UpToDate peer, and the
// tiebreaker keeps quorum without looking at qmr. meshvol must therefore
// protect GMDR itself (guards here; attach policy in the engine).
func QMR(effective Layout) int { return effective.GMDR + 1 }

// ADR, available data redundancy, is how many copies beyond the first exist
// right now: the UpToDate D count minus one. GMDR is the promise, ADR the
// fact; the guards compare the two. No UpToDate D gives -1: the data is not
// available at all.
func ADR(upToDateD int) int { return upToDateD - 1 }

// FTTForVoters is the FTT that voters D-class members and tb tiebreakers
// provide under l.GMDR, counting every voter as UpToDate: how many members
// (voters or TBs, any combination) may fail while the rest still serve IO
// with l.GMDR+1 copies. The step mutations feed it to the effective-layout
// ratchet (AfterMembershipChange).
//
// Two limits, the smaller wins:
//   - quorum: voters - (⌊voters/2⌋+1) voters may go; with an even voter count
//     and a TB, one more (the tiebreaker keeps the half that still has the
//     TB; if a failure takes the TB instead, a majority of voters is left).
//     On DRBD the tiebreaker keeps it for good only for a half that holds
//     the Primary: a half of Secondaries loses it at its lost-peer agreement,
//     about a second after the failure, until the lost voter's force removal
//     lowers q (docs/drbd-quorum.md, "The members set"; the engine's order
//     for it: docs/datamesh.md, "Order for an even voter set with a
//     TieBreaker");
//   - data: voters - (GMDR+1), because every failed voter takes a copy and
//     qmr stops IO below GMDR+1 copies.
//
// It counts a plain majority, not Quorum's floor: the floor exists to hold
// q up while voters are missing, and letting a shrunken voter set argue the
// effective FTT down would let it argue the floor, and q, down with it.
// It counts every voter as UpToDate: while a new D is still syncing the real
// tolerance is lower, and DRBD's qmr enforces that by itself; the effective
// layout only feeds q's floor, where counting early errs toward a higher q.
func (l Layout) FTTForVoters(voters, tb int) int {
	if voters <= 0 {
		return 0
	}
	f := voters - (voters/2 + 1)
	if tb > 0 && voters%2 == 0 {
		f++
	}
	if d := voters - (l.GMDR + 1); d < f {
		f = d
	}
	if f < 0 {
		return 0
	}
	return f
}
