package layout

// The effective layout (rv.Status.EffectiveLayout) is the protection the
// datamesh provides now; q and qmr are derived from it (Quorum, QMR), never
// from the configuration, which is only the goal. It is a monotonic ratchet
// (docs/datamesh-spec.md, "Effective layout"):
//
//   - each value moves only toward the configured value, never away from it
//     and never past it: it rises as steps add protection, and it is held
//     once reached;
//   - it falls when the configuration is lowered below it (explicit
//     downgrade), and then not below the new configuration, and after a lost
//     member's force removal has been confirmed by every survivor, to what the
//     members that are left provide (docs/datamesh-spec.md: the q↓ of ForceRemoveReplica(D)
//     for even → odd voters). The engine publishes that fall only once the
//     removal is confirmed (datamesh's quorumAfterForceRemoval): the removed node,
//     if alive behind a partition, is then alone and cannot be quorate, while a q
//     lowered at once would let it keep the old quorum with a replica that has
//     not applied the removal;
//   - a removal that a lowered configuration allowed may finish after the
//     configuration was raised again (its disk already detached): the engine then
//     lowers the effective FTT to what the members left provide once nothing is in
//     flight, as after a force removal, and the layout asks for the replacement
//     (docs/datamesh.md, "q, qmr and the effective layout");
//   - formation sets it to the configuration (Formed); a formation restart
//     tears the datamesh down and resets it to zero (Reset).
//
// The rules, as the engine applies them inside step mutations:
//
//	after a step that changes the voter or TB count (q↑, q↓, or neither):
//	    eff.FTT  = toward(eff.FTT, cfg.FTT, eff.FTTForVoters(voters, tb))
//	the qmr a qmr↑/qmr↓ step sets:
//	    qmr = cfg.GMDR+1                                  if cfg.GMDR ≤ eff.GMDR
//	    qmr = toward(eff.GMDR, cfg.GMDR, ADR(upToDateD)-min(eff.FTT, cfg.FTT))+1
//	                                                      otherwise
//	after a step that set qmr:
//	    eff.GMDR = qmr-1, then eff.FTT as above (qmr bounds FTT)
//
// where toward(e, c, p) clamps p into [min(e,c), max(e,c)].
//
// Examples (docs/layouts.md has more):
//
//	upgrade 3D (1,1) → 4D+1TB (2,1): add TB (3 voters + TB: FTT 1, held);
//	A → D∅+q↑ (4 voters + TB: FTTForVoters 2) → eff (2,1), q=3, qmr=2.
//	downgrade 5D (2,2) → 3D (1,1): qmr↓ → eff (2,1); D∅ → ✕ (4 voters:
//	FTTForVoters 1) → eff (1,1), q=3; second removal, A+q↓ (3 voters) → q=2.
//	force removal of 2 dead D in 5D (2,2), configuration unchanged: q stays 3
//	until both removals are confirmed, then eff (0,2) (3 voters, qmr 3) and
//	q=2; 2D+1TB (1,0) losing a D: q=2 until confirmed, then eff (0,0), q=1.
//
// Where this departs from the specification. The specification updates FTT only on steps with
// q↑ or q↓. Two steps change the provided FTT without changing q: adding a
// voter even→odd (2D (0,1) → 3D (1,1): ✦ → D∅ leaves q=2 but provides
// FTT 1) and adding a TB (2D (0,1) → 2D+1TB (1,0) after the qmr↓). If FTT
// stayed behind there, q's floor would stay low: in 2D+1TB with eff (0,0) a
// force removal of a partitioned-but-alive D would give the survivor q=1
// while the removed D keeps quorum through the tiebreaker — two writers.
// AfterMembershipChange is idempotent, so the engine may call it after every
// step.

// toward moves an effective value toward its configured value as far as the
// provided value allows: it clamps provided into the interval between
// effective and configured. This one rule is the whole ratchet: raise toward
// the configuration, hold once there, and lower only when the configuration
// is below (never past it).
func toward(effective, configured, provided int) int {
	lo, hi := effective, configured
	if lo > hi {
		lo, hi = hi, lo
	}
	return min(max(provided, lo), hi)
}

// Formed is the effective layout when formation completes: formation creates
// the exact replica set of the configuration, so it provides all of it.
func Formed(configured Layout) Layout { return configured }

// Reset is the effective layout after a formation restart: the datamesh was
// torn down and provides nothing. q's floor is then 1 until formation ends.
func Reset() Layout { return Layout{} }

// AfterMembershipChange is the effective layout after a step that changed the
// number of voters (D + D∅) or tiebreakers, given the counts after the step:
// FTT moves toward the configuration as far as the new membership provides.
// GMDR is untouched: only a qmr step changes it.
func (eff Layout) AfterMembershipChange(configured Layout, voters, tb int) Layout {
	eff.FTT = toward(eff.FTT, configured.FTT, eff.FTTForVoters(voters, tb))
	return eff
}

// NextQMR is the qmr that the embedded qmr↑ (end of AddReplica(D)) or qmr↓
// (start of RemoveReplica(D)) step, or a ChangeQuorum, should set.
//
// Lowering (configured GMDR below effective) goes straight to the
// configuration: it is the explicit downgrade, and it must come first, before
// a D leaves, or the guard QMRReady refuses the removal.
//
// Raising goes only as far as the UpToDate copies cover the new qmr plus the
// FTT the volume keeps meanwhile: GMDR ≤ ADR - FTT, FTT being the smaller of
// effective and configured. A qmr above the UpToDate count would drop quorum
// at once (and DRBD refuses that change on a Primary); a qmr equal to it
// would keep the data promise but stop IO at the next failure, trading the
// FTT the user still has for the GMDR not yet reached. So 3D (1,1) → 4D
// (1,2) raises qmr to 3 only once the fourth D is UpToDate. With too few
// copies the qmr stays where it is.
func (eff Layout) NextQMR(configured Layout, upToDateD int) int {
	if configured.GMDR <= eff.GMDR {
		return configured.GMDR + 1
	}
	keep := min(eff.FTT, configured.FTT)
	return toward(eff.GMDR, configured.GMDR, ADR(upToDateD)-keep) + 1
}

// AfterQMRChange is the effective layout after a step that set qmr, given
// the membership after the step. GMDR follows qmr exactly, as the specification says
// (GMDR = qmr-1, including an emergency ChangeQuorum); FTT is then moved
// again because the data limit of FTTForVoters depends on GMDR: lowering
// qmr in 3D (0,2) → (1,1) is what gives that 3D its FTT of 1.
func (eff Layout) AfterQMRChange(configured Layout, qmr, voters, tb int) Layout {
	eff.GMDR = qmr - 1
	return eff.AfterMembershipChange(configured, voters, tb)
}
