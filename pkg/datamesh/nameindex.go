package datamesh

import v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"

// memberIndex is a small open-addressing hash table over the members of the datamesh,
// by name or by node name, rebuilt per Process in scratch storage (no allocation once
// warm). A slot holds the key's hash and the member's index, eight bytes with no
// pointer in them, so building the table is clearing and storing integers; a lookup
// confirms a hash match by comparing the member's own string.
type memberIndex struct {
	slot  []uint64 // hash<<32 | index+1; 0 = empty
	mask  uint32
	valid bool
}

// hashName mixes the length, the first and the last two bytes: names of one volume's
// replicas (and of a cluster's nodes) share prefixes and differ at the end. Cheap enough
// to inline; a collision only costs one more probe.
func hashName(s string) uint32 {
	v := uint32(len(s))
	if n := len(s); n >= 2 {
		v |= uint32(s[n-1])<<8 | uint32(s[n-2])<<16 | uint32(s[0])<<24
	} else if n == 1 {
		v |= uint32(s[0]) << 8
	}
	v *= 0x9E3779B1
	return v ^ v>>15
}

func memberKey(m *v1.DatameshMember, byNode bool) string {
	if byNode {
		return m.NodeName
	}
	return m.Name
}

// build indexes ms by node name (byNode) or by name. Empty keys are not indexed; of
// equal keys, find returns the first member.
func (x *memberIndex) build(ms []v1.DatameshMember, byNode bool) {
	size := 8
	for size < 2*len(ms) {
		size <<= 1
	}
	if cap(x.slot) < size {
		x.slot = make([]uint64, size)
	} else {
		x.slot = x.slot[:size]
		clear(x.slot)
	}
	x.mask = uint32(size - 1)
	x.valid = true
	for i := range ms {
		k := memberKey(&ms[i], byNode)
		if k == "" {
			continue
		}
		hs := hashName(k)
		h := hs & x.mask
		for x.slot[h] != 0 {
			h = (h + 1) & x.mask
		}
		x.slot[h] = uint64(hs)<<32 | uint64(i+1)
	}
}

// find returns the index of the first member of ms (as built) whose key is s, or -1.
func (x *memberIndex) find(ms []v1.DatameshMember, byNode bool, s string) int {
	if len(x.slot) == 0 {
		return -1
	}
	hs := hashName(s)
	h := hs & x.mask
	for {
		v := x.slot[h]
		if v == 0 {
			return -1
		}
		if uint32(v>>32) == hs {
			if i := int(uint32(v)) - 1; memberKey(&ms[i], byNode) == s {
				return i
			}
		}
		h = (h + 1) & x.mask
	}
}
