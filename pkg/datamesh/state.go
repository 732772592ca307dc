package datamesh

import (
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// State is a datamesh member state in the specification's notation (docs/datamesh-spec.md "States"). New (✦)
// and Gone (✕) are the outside of the datamesh before and after; the others are the
// member types.
type State uint8

const (
	StateNew  State = iota // ✦ an RVR that wants to join
	StateA                 // A  Access
	StateTB                // TB TieBreaker
	StateDL                // D∅ LiminalDiskful
	StateD                 // D  Diskful
	StateSDL               // sD∅ LiminalShadowDiskful
	StateSD                // sD ShadowDiskful
	StateGone              // ✕ removed
	numStates
)

var stateNotation = [numStates]string{"✦", "A", "TB", "D∅", "D", "sD∅", "sD", "✕"}

// String is the specification's notation.
func (s State) String() string {
	if s < numStates {
		return stateNotation[s]
	}
	return "?"
}

// ParseState reads the specification's notation (also accepting ASCII: new, gone, DL, sDL).
func ParseState(s string) (State, bool) {
	for i, n := range stateNotation {
		if n == s {
			return State(i), true
		}
	}
	switch s {
	case "new", "+":
		return StateNew, true
	case "gone", "x", "X":
		return StateGone, true
	case "DL", "D0":
		return StateDL, true
	case "sDL", "sD0":
		return StateSDL, true
	}
	return 0, false
}

// IsMember reports whether the state is a datamesh member (not ✦ or ✕).
func (s State) IsMember() bool { return s != StateNew && s != StateGone && s < numStates }

// IsVoter: D and D∅ count toward quorum.
func (s State) IsVoter() bool { return s == StateD || s == StateDL }

// IsFullMesh: D, D∅, sD, sD∅ connect to every member; A and TB are star members.
func (s State) IsFullMesh() bool {
	return s == StateD || s == StateDL || s == StateSD || s == StateSDL
}

// IsStar: A and TB, connected to the full-mesh members only.
func (s State) IsStar() bool { return s == StateA || s == StateTB }

// IsLiminal: D∅ and sD∅, always transitional.
func (s State) IsLiminal() bool { return s == StateDL || s == StateSDL }

// IsShadow: sD and sD∅ need the non-voting DRBD option.
func (s State) IsShadow() bool { return s == StateSD || s == StateSDL }

// MemberType converts a member state to the API type ("" for ✦ and ✕).
func (s State) MemberType() v1.MemberType {
	switch s {
	case StateA:
		return v1.MemberTypeAccess
	case StateTB:
		return v1.MemberTypeTieBreaker
	case StateDL:
		return v1.MemberTypeLiminalDiskful
	case StateD:
		return v1.MemberTypeDiskful
	case StateSDL:
		return v1.MemberTypeLiminalShadowDiskful
	case StateSD:
		return v1.MemberTypeShadowDiskful
	}
	return ""
}

// StateOfMember converts an API member type to a state (StateGone for unknown types).
func StateOfMember(t v1.MemberType) State {
	switch t {
	case v1.MemberTypeAccess:
		return StateA
	case v1.MemberTypeTieBreaker:
		return StateTB
	case v1.MemberTypeLiminalDiskful:
		return StateDL
	case v1.MemberTypeDiskful:
		return StateD
	case v1.MemberTypeLiminalShadowDiskful:
		return StateSDL
	case v1.MemberTypeShadowDiskful:
		return StateSD
	}
	return StateGone
}

// StateOfReplicaType is the settled member state a replica of type t becomes.
func StateOfReplicaType(t v1.ReplicaType) (State, bool) {
	switch t {
	case v1.ReplicaTypeAccess:
		return StateA, true
	case v1.ReplicaTypeTieBreaker:
		return StateTB, true
	case v1.ReplicaTypeDiskful:
		return StateD, true
	case v1.ReplicaTypeShadowDiskful:
		return StateSD, true
	}
	return 0, false
}

// ReplicaType is the replica type whose settled state is s ("" for liminal states).
func (s State) ReplicaType() v1.ReplicaType {
	switch s {
	case StateA:
		return v1.ReplicaTypeAccess
	case StateTB:
		return v1.ReplicaTypeTieBreaker
	case StateD:
		return v1.ReplicaTypeDiskful
	case StateSD:
		return v1.ReplicaTypeShadowDiskful
	}
	return ""
}
