package datamesh

// nameIndex is a small open-addressing hash table from names to slice indexes, rebuilt
// per Process in scratch storage (no allocation once warm). Names of one volume's
// replicas share long prefixes and differ at the end, so the hash reads the length and
// the last eight bytes; a collision only costs one more probe, since every hit is
// confirmed by comparing the whole name.
type nameIndex struct {
	slot  []int32  // index+1; 0 = empty
	keys  []string // the names, by index (string headers only: no copy of the bytes)
	mask  uint32
	valid bool
}

func hashName(s string) uint32 {
	v := uint64(len(s))
	start := len(s) - 8
	if start < 0 {
		start = 0
	}
	for i := start; i < len(s); i++ {
		v = v<<8 | uint64(s[i])
	}
	v ^= uint64(len(s)) << 56
	v *= 0x9E3779B97F4A7C15
	return uint32(v >> 32)
}

// build indexes n names given by name(i).
func (x *nameIndex) build(n int, name func(int) string) {
	size := 8
	for size < 2*n {
		size <<= 1
	}
	if cap(x.slot) < size {
		x.slot = make([]int32, size)
	} else {
		x.slot = x.slot[:size]
		clear(x.slot)
	}
	x.mask = uint32(size - 1)
	x.keys = x.keys[:0]
	for i := 0; i < n; i++ {
		x.keys = append(x.keys, name(i))
	}
	for i := 0; i < n; i++ {
		s := x.keys[i]
		if s == "" {
			continue
		}
		h := hashName(s) & x.mask
		for x.slot[h] != 0 {
			h = (h + 1) & x.mask
		}
		x.slot[h] = int32(i + 1)
	}
	x.valid = true
}

// find returns the first index whose name is s, or -1.
func (x *nameIndex) find(s string) int {
	if len(x.slot) == 0 {
		return -1
	}
	h := hashName(s) & x.mask
	for {
		v := x.slot[h]
		if v == 0 {
			return -1
		}
		if x.keys[v-1] == s {
			return int(v - 1)
		}
		h = (h + 1) & x.mask
	}
}
