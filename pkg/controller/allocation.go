package controller

import (
	"fmt"
	"sync"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Allocator hands out each volume's DRBD TCP port and device minor. Both are unique
// across the cluster (docs/contract.md: simpler than per node, and there is room), and
// both are recorded in the volume's status.datamesh, so the status is the only record:
// a restarted controller rebuilds the tables from its cache (Load) before its first
// reconcile, and an RV whose status was never written simply has nothing to rebuild.
//
// The table is also what keeps two reconciles apart whose caches have not yet seen each
// other's writes: a value handed out is taken at once in memory, before the status that
// records it is written, and a second call for the same volume returns the same values.
type Allocator struct {
	mu                  sync.Mutex
	portMin, portMax    int32
	minorMin, minorMax  int32
	ports, minors       map[int32]string // value → volume
	byVolume            map[string]Allocation
	nextPort, nextMinor int32
}

// Allocation is one volume's values.
type Allocation struct{ Port, Minor int32 }

// ExhaustedError says a range has no free value left. Its message is what a user
// sees (the Allocated condition, the volume's Event, CreateVolume's answer): the
// field, the rule that caps the volumes and what lifts the cap.
type ExhaustedError struct {
	What     string // "port" or "minor"
	Min, Max int32
}

func (e *ExhaustedError) Error() string {
	open := ""
	if e.What == "port" {
		open = ", and open the added ports between the nodes"
	}
	return fmt.Sprintf("status.datamesh.%s: no free DRBD %s in %d-%d: each volume holds one %s of the range, unique across the cluster, "+
		"so it holds at most %d volumes and every one is taken (widen the controller's --%s-range%s, or delete volumes)",
		e.What, e.What, e.Min, e.Max, e.What, int64(e.Max)-int64(e.Min)+1, e.What, open)
}

// NewAllocator returns an empty allocator for the inclusive ranges.
func NewAllocator(portMin, portMax, minorMin, minorMax int32) *Allocator {
	return &Allocator{portMin: portMin, portMax: portMax, minorMin: minorMin, minorMax: minorMax,
		ports: map[int32]string{}, minors: map[int32]string{}, byVolume: map[string]Allocation{},
		nextPort: portMin, nextMinor: minorMin}
}

// Load records the values every listed volume's status holds. Values outside the ranges
// are recorded too (they were handed out under other flags and are still in use). A
// value two volumes claim stays with the first one loaded; Conflicts reports the other.
func (a *Allocator) Load(rvs []v1.ReplicatedVolume) (conflicts []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range rvs {
		rv := &rvs[i]
		dm := &rv.Status.Datamesh
		if dm.Port == 0 && dm.Minor == 0 && rv.Status.DatameshRevision == 0 {
			continue
		}
		if _, ok := a.byVolume[rv.Name]; ok {
			continue
		}
		if o, ok := a.ports[dm.Port]; ok && o != rv.Name && dm.Port != 0 {
			conflicts = append(conflicts, fmt.Sprintf("volume %s: port %d is also held by %s", rv.Name, dm.Port, o))
		}
		if o, ok := a.minors[dm.Minor]; ok && o != rv.Name {
			conflicts = append(conflicts, fmt.Sprintf("volume %s: minor %d is also held by %s", rv.Name, dm.Minor, o))
		}
		a.record(rv.Name, Allocation{Port: dm.Port, Minor: dm.Minor})
	}
	return conflicts
}

func (a *Allocator) record(volume string, al Allocation) {
	a.byVolume[volume] = al
	if al.Port != 0 {
		if _, ok := a.ports[al.Port]; !ok {
			a.ports[al.Port] = volume
		}
	}
	if _, ok := a.minors[al.Minor]; !ok {
		a.minors[al.Minor] = volume
	}
}

// Get returns volume's values, allocating them on first call. An error leaves nothing
// allocated.
func (a *Allocator) Get(volume string) (Allocation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if al, ok := a.byVolume[volume]; ok {
		return al, nil
	}
	port, ok := next(a.ports, &a.nextPort, a.portMin, a.portMax)
	if !ok {
		return Allocation{}, &ExhaustedError{What: "port", Min: a.portMin, Max: a.portMax}
	}
	minor, ok := next(a.minors, &a.nextMinor, a.minorMin, a.minorMax)
	if !ok {
		return Allocation{}, &ExhaustedError{What: "minor", Min: a.minorMin, Max: a.minorMax}
	}
	al := Allocation{Port: port, Minor: minor}
	a.record(volume, al)
	return al, nil
}

// Peek returns volume's values if it has some.
func (a *Allocator) Peek(volume string) (Allocation, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	al, ok := a.byVolume[volume]
	return al, ok
}

// Release frees volume's values once the volume is gone. A value is reused only after
// every other free value has been handed out (the search goes round the range), so a
// node that still holds a stale resource of a deleted volume meets its port and minor
// again as late as possible.
func (a *Allocator) Release(volume string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	al, ok := a.byVolume[volume]
	if !ok {
		return
	}
	delete(a.byVolume, volume)
	if a.ports[al.Port] == volume {
		delete(a.ports, al.Port)
	}
	if a.minors[al.Minor] == volume {
		delete(a.minors, al.Minor)
	}
}

// next finds the first free value at or after *cursor, wrapping once.
func next(used map[int32]string, cursor *int32, lo, hi int32) (int32, bool) {
	if hi < lo {
		return 0, false
	}
	span := int64(hi) - int64(lo) + 1
	c := *cursor
	for i := int64(0); i < span; i++ {
		if c < lo || c > hi {
			c = lo
		}
		if _, taken := used[c]; !taken {
			*cursor = c + 1
			return c, true
		}
		c++
	}
	return 0, false
}
