package controller

import (
	"fmt"
	"sync"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Allocator hands out each volume's DRBD device minor and each member's DRBD TCP port
// (docs/controller.md, "Allocation and the shared secret").
//
//   - A port is unique on its node only: DRBD listens on the member's own address and
//     port, and a peer connects to that address and port, so two resources clash only
//     when they listen on one node. Each member of a volume has a port of its own
//     (status.datamesh.members[].port), so --port-range bounds the replicas one node
//     holds, not the volumes of the cluster. A member published before members had
//     ports (port 0) listens on the volume's status.datamesh.port, and holds that port
//     on its node.
//   - A minor is unique across the cluster: the volume's device is /dev/drbd<minor> on
//     every node, and the default range (about a million) is more than a cluster holds.
//
// Both are recorded in the volume's status, so the status is the only record: a
// restarted controller rebuilds the tables from its cache (Load) before its first
// reconcile, and an RV whose status was never written simply has nothing to rebuild.
//
// The table is also what keeps two reconciles apart whose caches have not yet seen each
// other's writes: a value handed out is taken at once in memory, before the status that
// records it is written, and a second call for the same volume (member) returns the
// same value.
type Allocator struct {
	mu                 sync.Mutex
	portMin, portMax   int32
	minorMin, minorMax int32
	minors             map[int32]string // minor → volume
	minorOf            map[string]int32 // volume → minor
	nextMinor          int32
	nodes              map[string]*nodePorts      // node → the ports held there
	members            map[string]map[string]hold // volume → member → its node and port
}

// nodePorts is one node's table of ports.
type nodePorts struct {
	used    map[int32]memberRef // port → holder
	next    int32               // where the search for a free port starts
	inRange int                 // how many of used are in the range (NodeFull without a scan)
}

type memberRef struct{ volume, member string }

type hold struct {
	node string
	port int32
}

// ExhaustedError says a range has no free value left. Its message is what a user
// sees (the Allocated condition, the volume's Event, CreateVolume's answer): the
// field, the rule that caps what and what lifts the cap.
type ExhaustedError struct {
	What     string // "port" or "minor"
	Min, Max int32
	// Node and Member, for a port: the node whose range is full and the member that
	// needed a port there.
	Node, Member string
}

func (e *ExhaustedError) Error() string {
	n := int64(e.Max) - int64(e.Min) + 1
	if e.What == "port" {
		return fmt.Sprintf("status.datamesh.members[%s].port: no free DRBD port in %d-%d on node %s: each replica on a node holds one port "+
			"of the range, unique on its node, so a node holds at most %d replicas and every one is taken (widen the controller's "+
			"--port-range, and open the added ports between the nodes, or move replicas off the node)", e.Member, e.Min, e.Max, e.Node, n)
	}
	return fmt.Sprintf("status.datamesh.minor: no free DRBD minor in %d-%d: each volume holds one minor of the range, unique across the cluster, "+
		"so it holds at most %d volumes and every one is taken (widen the controller's --minor-range, or delete volumes)", e.Min, e.Max, n)
}

// NewAllocator returns an empty allocator for the inclusive ranges.
func NewAllocator(portMin, portMax, minorMin, minorMax int32) *Allocator {
	return &Allocator{portMin: portMin, portMax: portMax, minorMin: minorMin, minorMax: minorMax,
		minors: map[int32]string{}, minorOf: map[string]int32{}, nextMinor: minorMin,
		nodes: map[string]*nodePorts{}, members: map[string]map[string]hold{}}
}

// Load records the values every listed volume's status holds: its minor and each
// member's port on the member's node. Values outside the ranges are recorded too (they
// were handed out under other flags and are still in use). A value two holders claim
// stays with the first one loaded; Load returns the others as conflicts.
func (a *Allocator) Load(rvs []v1.ReplicatedVolume) (conflicts []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range rvs {
		rv := &rvs[i]
		dm := &rv.Status.Datamesh
		if dm.Port == 0 && dm.Minor == 0 && len(dm.Members) == 0 && rv.Status.DatameshRevision == 0 {
			continue
		}
		if _, ok := a.minorOf[rv.Name]; !ok {
			if o, ok := a.minors[dm.Minor]; ok && o != rv.Name {
				conflicts = append(conflicts, fmt.Sprintf("volume %s: minor %d is also held by %s", rv.Name, dm.Minor, o))
			} else {
				a.minors[dm.Minor] = rv.Name
			}
			a.minorOf[rv.Name] = dm.Minor
		}
		for _, m := range dm.Members {
			port := MemberPort(dm, &m)
			if port == 0 || m.NodeName == "" {
				continue
			}
			if o, held := a.nodeOf(m.NodeName).used[port]; held && o != (memberRef{rv.Name, m.Name}) {
				conflicts = append(conflicts, fmt.Sprintf("volume %s member %s: port %d on node %s is also held by %s member %s",
					rv.Name, m.Name, port, m.NodeName, o.volume, o.member))
				continue
			}
			a.take(rv.Name, m.Name, hold{m.NodeName, port})
		}
	}
	return conflicts
}

// MemberPort is the port member m listens on: its own, or, for a member published
// before members had ports, the volume's.
func MemberPort(dm *v1.Datamesh, m *v1.DatameshMember) int32 {
	if m.Port != 0 {
		return m.Port
	}
	return dm.Port
}

func (a *Allocator) nodeOf(node string) *nodePorts {
	np := a.nodes[node]
	if np == nil {
		np = &nodePorts{used: map[int32]memberRef{}, next: a.portMin}
		a.nodes[node] = np
	}
	return np
}

func (a *Allocator) take(volume, member string, h hold) {
	np := a.nodeOf(h.node)
	if _, held := np.used[h.port]; !held && h.port >= a.portMin && h.port <= a.portMax {
		np.inRange++
	}
	np.used[h.port] = memberRef{volume, member}
	ms := a.members[volume]
	if ms == nil {
		ms = map[string]hold{}
		a.members[volume] = ms
	}
	ms[member] = h
}

// Minor returns volume's minor, allocating it on first call.
func (a *Allocator) Minor(volume string) (int32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m, ok := a.minorOf[volume]; ok {
		return m, nil
	}
	m, ok := nextFree(a.minors, &a.nextMinor, a.minorMin, a.minorMax)
	if !ok {
		return 0, &ExhaustedError{What: "minor", Min: a.minorMin, Max: a.minorMax}
	}
	a.minors[m], a.minorOf[volume] = volume, m
	return m, nil
}

// Port returns the port member of volume listens on on node, allocating it on first
// call: the one it already holds there, else has (the port its status names, which was
// handed out before), else shared when that is free on the node (a volume published
// with one port for every member keeps it where it can, so the agents of an earlier
// version render its members as this one does), else the next free one. An error
// leaves nothing allocated.
func (a *Allocator) Port(volume, member, node string, has, shared int32) (int32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h, ok := a.members[volume][member]; ok && h.node == node {
		return h.port, nil
	}
	np := a.nodeOf(node)
	free := func(p int32) bool {
		o, held := np.used[p]
		return p != 0 && (!held || o == memberRef{volume, member})
	}
	var port int32
	switch {
	case free(has):
		port = has
	case free(shared) && shared >= a.portMin && shared <= a.portMax:
		port = shared
	default:
		p, ok := nextFree(np.used, &np.next, a.portMin, a.portMax)
		if !ok {
			return 0, &ExhaustedError{What: "port", Min: a.portMin, Max: a.portMax, Node: node, Member: member}
		}
		port = p
	}
	if h, ok := a.members[volume][member]; ok {
		a.releaseMember(volume, member, h) // the member's record on another node
	}
	a.take(volume, member, hold{node, port})
	return port, nil
}

// NodeFull reports whether node has no free port left for a new member.
func (a *Allocator) NodeFull(node string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	held := 0
	if np := a.nodes[node]; np != nil {
		held = np.inRange
	}
	return int64(held) >= int64(a.portMax)-int64(a.portMin)+1
}

// RetainMembers frees the ports of volume's members for which keep is false: members
// that left the datamesh (and were never published again).
func (a *Allocator) RetainMembers(volume string, keep func(member string) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for member, h := range a.members[volume] {
		if !keep(member) {
			a.releaseMember(volume, member, h)
		}
	}
}

func (a *Allocator) releaseMember(volume, member string, h hold) {
	// The node's table stays, empty or not: its cursor is what makes a freed port
	// the last one handed out again.
	if np := a.nodes[h.node]; np != nil && np.used[h.port] == (memberRef{volume, member}) {
		delete(np.used, h.port)
		if h.port >= a.portMin && h.port <= a.portMax {
			np.inRange--
		}
	}
	delete(a.members[volume], member)
	if len(a.members[volume]) == 0 {
		delete(a.members, volume)
	}
}

// Release frees volume's minor and its members' ports once the volume is gone. A value
// is reused only after every other free value has been handed out (the search goes
// round the range), so a node that still holds a stale resource of a deleted volume
// meets its port and minor again as late as possible.
func (a *Allocator) Release(volume string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for member, h := range a.members[volume] {
		a.releaseMember(volume, member, h)
	}
	m, ok := a.minorOf[volume]
	if !ok {
		return
	}
	delete(a.minorOf, volume)
	if a.minors[m] == volume {
		delete(a.minors, m)
	}
}

// nextFree finds the first free value at or after *cursor, wrapping once.
func nextFree[T any](used map[int32]T, cursor *int32, lo, hi int32) (int32, bool) {
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
