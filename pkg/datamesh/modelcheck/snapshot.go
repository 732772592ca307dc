package modelcheck

import (
	"sort"

	"github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// MaxReplicas bounds the replica slots of one scenario. Every replica a
// scenario may ever create has a slot from the start, so a replica is always
// named by its slot index and a side of a partition is a bit mask.
const MaxReplicas = 10

// Snapshot is the part of a published datamesh that DRBD on one node runs:
// what the node's agent rendered when it applied revision Revision. Replicas
// keep a pointer to the snapshot they applied; snapshots are interned, so
// equal snapshots are the same pointer and a replica's state hashes cheaply.
type Snapshot struct {
	Revision    int64
	Q, QMR      int32
	Multiattach bool
	Members     []SnapMember // sorted by slot

	// bySlot maps a replica slot to its index in Members, -1 when absent.
	bySlot [MaxReplicas]int8
	hash   uint64
}

// SnapMember is one member as a snapshot records it.
type SnapMember struct {
	Slot     int8
	Type     v1alpha1.MemberType
	Attached bool
	NodeID   int32
}

// Member returns the member in slot s, or nil.
func (s *Snapshot) Member(slot int) *SnapMember {
	if s == nil || slot < 0 || slot >= MaxReplicas || s.bySlot[slot] < 0 {
		return nil
	}
	return &s.Members[s.bySlot[slot]]
}

// snapshotTable interns snapshots by content.
type snapshotTable struct {
	byHash map[uint64]*Snapshot
}

func newSnapshotTable() *snapshotTable {
	return &snapshotTable{byHash: make(map[uint64]*Snapshot)}
}

// intern returns the canonical snapshot of the datamesh published in st,
// naming members by slot through slotOf. A member whose name has no slot is
// dropped: it is not a replica of the scenario (the invariants report that
// separately as an engine fault).
func (t *snapshotTable) intern(st *v1alpha1.ReplicatedVolumeStatus, slotOf func(string) int) *Snapshot {
	s := Snapshot{
		Revision:    st.DatameshRevision,
		Q:           st.Datamesh.Quorum,
		QMR:         st.Datamesh.QuorumMinimumRedundancy,
		Multiattach: st.Datamesh.Multiattach,
	}
	for i := range s.bySlot {
		s.bySlot[i] = -1
	}
	for i := range st.Datamesh.Members {
		m := &st.Datamesh.Members[i]
		slot := slotOf(m.Name)
		if slot < 0 {
			continue
		}
		s.Members = append(s.Members, SnapMember{Slot: int8(slot), Type: m.Type, Attached: m.Attached, NodeID: m.NodeID})
	}
	sort.Slice(s.Members, func(i, j int) bool { return s.Members[i].Slot < s.Members[j].Slot })
	for i, m := range s.Members {
		if s.bySlot[m.Slot] < 0 { // a duplicate member keeps its first entry
			s.bySlot[m.Slot] = int8(i)
		}
	}
	var h hasher
	h.init()
	h.i64(s.Revision)
	h.i64(int64(s.Q))
	h.i64(int64(s.QMR))
	h.bool(s.Multiattach)
	for _, m := range s.Members {
		h.i64(int64(m.Slot))
		h.str(string(m.Type))
		h.bool(m.Attached)
		h.i64(int64(m.NodeID))
	}
	s.hash = h.sum()
	if p, ok := t.byHash[s.hash]; ok {
		return p
	}
	p := &s
	t.byHash[s.hash] = p
	return p
}

// hasher is FNV-1a over the canonical encoding of a state. 64 bits are
// enough for the state counts here (collision odds well below 1e-5 at 1e7
// states); a collision could only hide a state, never invent a violation.
type hasher struct{ h uint64 }

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func (h *hasher) init() { h.h = fnvOffset }
func (h *hasher) byte(b byte) {
	h.h ^= uint64(b)
	h.h *= fnvPrime
}
func (h *hasher) i64(v int64) {
	for i := 0; i < 8; i++ {
		h.byte(byte(v >> (8 * i)))
	}
}
func (h *hasher) bool(b bool) {
	if b {
		h.byte(1)
	} else {
		h.byte(0)
	}
}
func (h *hasher) str(s string) {
	for i := 0; i < len(s); i++ {
		h.byte(s[i])
	}
	h.byte(0xff) // separator: "ab","c" ≠ "a","bc"
}
func (h *hasher) sum() uint64 { return h.h }
