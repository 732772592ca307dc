package datamesh

import v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"

// memberIndex finds a member of the datamesh by node name or by name. It is rebuilt per
// Process call when first needed; clearing a Go map keeps its storage, so a warm engine
// rebuilds it without allocating.
type memberIndex struct {
	idx   map[string]int
	valid bool
}

// build indexes ms by node name (byNode) or by name. Empty keys are not indexed; of
// equal keys, find returns the first member.
func (x *memberIndex) build(ms []v1.DatameshMember, byNode bool) {
	if x.idx == nil {
		x.idx = make(map[string]int, len(ms))
	} else {
		clear(x.idx)
	}
	for i := len(ms) - 1; i >= 0; i-- { // backwards, so the first of equal keys wins
		k := ms[i].Name
		if byNode {
			k = ms[i].NodeName
		}
		if k != "" {
			x.idx[k] = i
		}
	}
	x.valid = true
}

// find returns the index of the first member whose key is s, or -1.
func (x *memberIndex) find(s string) int {
	if i, ok := x.idx[s]; ok {
		return i
	}
	return -1
}
