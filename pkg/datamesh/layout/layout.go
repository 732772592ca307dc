// Package layout is the arithmetic of a datamesh: which replica set a
// protection level needs, which DRBD quorum (q) and quorum-minimum-redundancy
// (qmr) that set gets, how the effective layout ratchets while transitions run,
// and the guards that refuse to take a voter or a tiebreaker away when doing so
// would break the promise.
//
// Everything here is plain integers and strings: no I/O, no clock, no API
// types, and no allocation on the paths the engine runs on every reconcile
// (a guard allocates only to format the message of a refusal).
//
// The rules are those of docs/datamesh-spec.md ("Preconditions", "Effective layout")
// corrected where real DRBD 9.2 behaves differently (docs/drbd-quorum.md).
// docs/layouts.md explains them for people; proof_test.go checks them against
// a model of DRBD's quorum rule by brute force.
package layout

import (
	"fmt"
	"strconv"
)

// The supported range of both protection levels. Every D receives every write
// synchronously (protocol C), so each extra D costs write latency, network
// bandwidth and capacity; 5D (FTT=2, GMDR=2) is the largest set the product
// offers. The arithmetic itself holds beyond this range (proof_test.go checks
// it up to 4), so the cap is policy, not math.
const (
	MaxFTT  = 2
	MaxGMDR = 2
)

// NonVoterQuorum is the q given to members that must never count toward
// quorum themselves (A, TB, and the diskless sD∅): DRBD knows at most 32
// nodes, so `quorum 32` is never reached by counting, and a diskless node with
// it is quorate exactly when it is connected to an UpToDate peer that reports
// quorum. It does not work for an attached disk: a diskful node with quorum 32
// is never quorate (docs/drbd-quorum.md), so a shadow diskful sD needs DRBD's
// non-voting option instead, which upstream DRBD does not have.
const NonVoterQuorum = 32

// Layout is a protection level, as configured (rv.Status.Configuration) or as
// currently provided (rv.Status.EffectiveLayout).
//
// FTT, failures to tolerate: how many nodes may fail, in any combination and
// order, while the volume keeps quorum and so keeps serving IO.
//
// GMDR, guaranteed minimum data redundancy: how many copies beyond the first
// every acknowledged write has. DRBD enforces it with qmr = GMDR+1: a node
// serves IO only while it sees GMDR+1 UpToDate disks.
type Layout struct {
	FTT  int
	GMDR int
}

// ValidationError says which field of a layout is wrong and by which rule.
// The CSI layer maps it to InvalidArgument; the API's CEL rules state the
// same rules so that the API server refuses the object first.
type ValidationError struct {
	Field string // the API field name, e.g. "failuresToTolerate"
	Rule  string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Rule }

// Validate accepts exactly the layouts meshvol can keep its promise for:
// FTT and GMDR in [0, 2], and FTT ≤ GMDR+1.
//
// Why FTT ≤ GMDR+1. A layout has D = FTT+GMDR+1 voters and q = ⌊D/2⌋+1.
// After FTT failures GMDR+1 voters remain (exactly qmr: the data promise
// holds with nothing to spare). They keep quorum only if GMDR+1 ≥ ⌊D/2⌋+1:
//
//   - FTT ≤ GMDR: D ≤ 2·GMDR+1, so ⌊D/2⌋ ≤ GMDR. The survivors are a majority.
//   - FTT = GMDR+1: D = 2·GMDR+2 is even and the survivors are D/2, one short
//     of q. DRBD's tiebreaker keeps quorum for exactly that case (an even
//     voter count, one vote short, a majority of the diskless members still
//     connected), so the layout needs one TB (TieBreakerMin).
//   - FTT ≥ GMDR+2: the survivors are one short with an odd D (DRBD's
//     tiebreaker needs an even voter count) or more than one short. No
//     number of tiebreakers helps. FTT=2, GMDR=0 would be 3D with q=2: one
//     node left after two failures, no quorum.
//
// The allowed set is therefore 1D (0,0), 2D (0,1), 3D (0,2), 2D+1TB (1,0),
// 3D (1,1), 4D (1,2), 4D+1TB (2,1), 5D (2,2); (2,0) is the only pair in range
// that is refused. TestLayoutProof checks each against the DRBD quorum rule.
func (l Layout) Validate() error {
	if l.valid() {
		return nil
	}
	if l.FTT < 0 || l.FTT > MaxFTT {
		return &ValidationError{Field: "failuresToTolerate",
			Rule: fmt.Sprintf("must be between 0 and %d, got %d", MaxFTT, l.FTT)}
	}
	if l.GMDR < 0 || l.GMDR > MaxGMDR {
		return &ValidationError{Field: "guaranteedMinimumDataRedundancy",
			Rule: fmt.Sprintf("must be between 0 and %d, got %d", MaxGMDR, l.GMDR)}
	}
	if l.FTT > l.GMDR+1 {
		d := l.DiskfulCount()
		return &ValidationError{Field: "failuresToTolerate",
			Rule: fmt.Sprintf("must be at most guaranteedMinimumDataRedundancy+1, got FTT=%d with GMDR=%d: "+
				"%dD has q=%d and %d failures leave %d", l.FTT, l.GMDR, d, d/2+1, l.FTT, d-l.FTT)}
	}
	return nil
}

// valid is Validate's verdict without its message: it does not allocate.
func (l Layout) valid() bool {
	return l.FTT >= 0 && l.FTT <= MaxFTT && l.GMDR >= 0 && l.GMDR <= MaxGMDR && l.FTT <= l.GMDR+1
}

// DiskfulCount is the number of D the layout needs: one copy, plus GMDR
// copies for the data promise, plus FTT voters that may fail. Each failure
// takes one voter and one copy, so after FTT failures GMDR+1 copies remain.
func (l Layout) DiskfulCount() int { return l.FTT + l.GMDR + 1 }

// TieBreakerMin is the number of TB a set of dCount voters needs to tolerate
// ftt failures: one when dCount is even and ftt = dCount/2, because then the
// survivors are exactly one vote short of q = dCount/2+1 and only DRBD's
// tiebreaker keeps them quorate; zero otherwise (a majority survives, or the
// count is odd and the tiebreaker does not apply). One is enough: the
// tiebreaker needs a majority of the diskless members, and one TB on the
// surviving side is a majority of one. (docs/datamesh-spec.md, GuardTBRequired.)
func TieBreakerMin(dCount, ftt int) int {
	if dCount > 0 && dCount%2 == 0 && ftt == dCount/2 {
		return 1
	}
	return 0
}

// String names the replica set, e.g. "3D" or "2D+1TB"; an invalid layout
// prints as "invalid(FTT=2,GMDR=0)" so that it cannot pass for a real one.
func (l Layout) String() string {
	if l.Validate() != nil {
		return "invalid(FTT=" + strconv.Itoa(l.FTT) + ",GMDR=" + strconv.Itoa(l.GMDR) + ")"
	}
	d := l.DiskfulCount()
	s := strconv.Itoa(d) + "D"
	if tb := TieBreakerMin(d, l.FTT); tb > 0 {
		s += "+" + strconv.Itoa(tb) + "TB"
	}
	return s
}

// FromReplication maps the legacy storage-class setting `replication` to a
// layout. The names promise: Availability keeps writing through one failure
// (FTT=1) with one copy guaranteed; Consistency guarantees a second copy
// (GMDR=1) and stops rather than write a single one.
func FromReplication(replication string) (Layout, error) {
	switch replication {
	case "None":
		return Layout{FTT: 0, GMDR: 0}, nil
	case "Availability":
		return Layout{FTT: 1, GMDR: 0}, nil
	case "Consistency":
		return Layout{FTT: 0, GMDR: 1}, nil
	case "ConsistencyAndAvailability":
		return Layout{FTT: 1, GMDR: 1}, nil
	}
	return Layout{}, &ValidationError{Field: "replication",
		Rule: fmt.Sprintf("must be one of None, Availability, Consistency, ConsistencyAndAvailability, got %q", replication)}
}

// FromClass decides the layout storage class class asks for: the legacy replication
// when it is set, else failuresToTolerate and guaranteedMinimumDataRedundancy, which
// must then both be set (a class with one of them says nothing about the other, and
// defaulting it would promise less, or cost more, than the class's author meant). The
// engine and the CSI controller service both ask it, so that CreateVolume refuses
// exactly the classes the engine would refuse to configure a volume from, with the
// same message. The layout it returns is not Validated yet: both callers do that next,
// as for a configuration from any source.
func FromClass(class string, replication *string, ftt, gmdr *int32) (Layout, error) {
	var l Layout
	var err error
	switch {
	case replication != nil:
		l, err = FromReplication(*replication)
	case ftt != nil && gmdr != nil:
		l = Layout{FTT: int(*ftt), GMDR: int(*gmdr)}
	case ftt != nil:
		err = &ValidationError{Field: "guaranteedMinimumDataRedundancy", Rule: classRule}
	default:
		err = &ValidationError{Field: "failuresToTolerate", Rule: classRule}
	}
	if err != nil {
		return Layout{}, fmt.Errorf("storage class %s: %w", class, err)
	}
	return l, nil
}

const classRule = "required: set replication, or both failuresToTolerate and guaranteedMinimumDataRedundancy"
