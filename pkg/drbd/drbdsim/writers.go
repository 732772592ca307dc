package drbdsim

import (
	"fmt"
	"slices"
	"strings"
)

// maxTwoWriterRecords bounds the record: the first windows say what went wrong.
const maxTwoWriterRecords = 64

// recordWriters notes every moment at which two nodes could both write the same
// resource without either seeing the other's writes: each is Primary, quorate by its
// own view and has UpToDate data in reach (the conditions under which drbdsim
// acknowledges a write), and they are in different connected components, so no
// cluster-wide state change and no replicated write passes between them. Within one
// component two Primaries (allow-two-primaries) replicate to each other and are not a
// split. Called at the end of every settle, with c.mu held: this is the simulator's
// own record of who held role and quorum, independent of anything the agent or the
// controller reports.
func (c *Cluster) recordWriters() {
	var byName map[string][]*resource
	for _, r := range c.runningResources() {
		if r.role != rolePrimary || !r.quorate || !r.dataAccessible() {
			continue
		}
		if byName == nil {
			byName = map[string][]*resource{}
		}
		byName[r.name] = append(byName[r.name], r)
	}
	for name, ws := range byName {
		if len(ws) < 2 {
			continue
		}
		for i, a := range ws {
			comp := c.component(a)
			for _, b := range ws[i+1:] {
				if slices.Contains(comp, b) {
					continue
				}
				rec := fmt.Sprintf("%s: %s and %s both Primary with quorum and UpToDate data in reach, not connected", name, a.n.name, b.n.name)
				if c.twoWriters == nil {
					c.twoWriters = map[string][]string{}
				}
				prev := c.twoWriters[name]
				if len(prev) < maxTwoWriterRecords && (len(prev) == 0 || !strings.HasSuffix(prev[len(prev)-1], rec)) {
					c.twoWriters[name] = append(prev, c.now.Format("15:04:05.000")+" "+rec)
				}
			}
		}
	}
}

// TwoWriters returns every recorded moment (virtual time) at which two nodes could
// both write res without replicating to each other: the split brain quorum exists to
// prevent, seen from the simulated kernels themselves. Empty is the promise.
func (c *Cluster) TwoWriters(res string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.twoWriters[res])
}
