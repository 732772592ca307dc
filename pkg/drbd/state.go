package drbd

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ResourceState is what this node's kernel says about one resource: the
// snapshot the agent turns into RVR status. It is built from events2
// (Observer) or from `status --json` (StateFromStatus); both give the same
// value for the same kernel state, which the capture tests check.
type ResourceState struct {
	Name string
	Role string // Primary, Secondary, Unknown
	// Suspended lists why IO is suspended ("user", "no-data", "fencing",
	// "quorum"); empty when IO flows.
	Suspended      []string
	MayPromote     *bool // events2 only
	PromotionScore *int  // events2 only
	Devices        map[int]*DeviceState
	Connections    map[int]*ConnectionState // by peer node-id
	// Updated is the timestamp of the last event applied (zero without
	// --timestamps or when built from status). DRBD recomputes quorum only
	// on its own state changes, so a quorum:yes is only as fresh as this.
	Updated time.Time
}

type DeviceState struct {
	Volume     int
	Minor      int
	DiskState  string // Diskless, Attaching, Inconsistent, Outdated, UpToDate, …
	Client     bool   // configured diskless ("disk none")
	Quorum     bool
	BackingDev string // events2 only ("none" when diskless)
	SizeKiB    int64  // --statistics
}

type ConnectionState struct {
	PeerNodeID int
	Name       string
	State      string // connection state: StandAlone, Connecting, Connected, …
	PeerRole   string
	Congested  bool
	// Paths in the order DRBD reported them; a pair of addresses (Local,
	// Peer) is one path. A slice, not a map by the pair: a connection has
	// one path or two, and a map of one entry cost an agent about 1 KB a
	// connection, the largest part of its Observer's memory (docs/scale.md,
	// "One agent on its own").
	Paths       []PathState
	PeerDevices map[int]*PeerDeviceState
}

// Path returns the path from local to peer.
func (c *ConnectionState) Path(local, peer string) (PathState, bool) {
	i := c.pathIndex(local, peer)
	if i < 0 {
		return PathState{}, false
	}
	return c.Paths[i], true
}

func (c *ConnectionState) pathIndex(local, peer string) int {
	return slices.IndexFunc(c.Paths, func(p PathState) bool { return p.Local == local && p.Peer == peer })
}

// samePaths says whether a and b hold the same paths, in any order.
func samePaths(a, b []PathState) bool {
	if len(a) != len(b) {
		return false
	}
	for _, p := range a {
		if !slices.Contains(b, p) {
			return false
		}
	}
	return true
}

type PathState struct {
	Local, Peer string // "ipv4:10.99.0.1:7000"
	Established bool
}

type PeerDeviceState struct {
	Volume          int
	Replication     string // Off, Established, SyncSource, SyncTarget, WFBitMapS, …
	PeerDisk        string
	PeerClient      bool
	ResyncSuspended string // "no" or the reasons
	OutOfSyncKiB    int64
	// PercentInSync is 100·(size − out-of-sync)/size, the figure drbdsetup
	// status prints as percent-in-sync (and, during a resync, as
	// percent-resync-done). NaN until both numbers are known.
	PercentInSync float64
}

// Resyncing reports whether a resync (or its bitmap exchange) is running.
func (p *PeerDeviceState) Resyncing() bool {
	return strings.HasPrefix(p.Replication, "Sync") || strings.HasPrefix(p.Replication, "PausedSync") ||
		strings.HasPrefix(p.Replication, "WFBitMap") || p.Replication == "StartingSyncS" || p.Replication == "StartingSyncT"
}

func newResourceState(name string) *ResourceState {
	return &ResourceState{Name: name, Devices: map[int]*DeviceState{}, Connections: map[int]*ConnectionState{}}
}

// Clone returns a deep copy (snapshots handed out must not alias the
// observer's working state).
func (s *ResourceState) Clone() *ResourceState {
	c := *s
	c.Suspended = append([]string(nil), s.Suspended...)
	if s.MayPromote != nil {
		v := *s.MayPromote
		c.MayPromote = &v
	}
	if s.PromotionScore != nil {
		v := *s.PromotionScore
		c.PromotionScore = &v
	}
	c.Devices = make(map[int]*DeviceState, len(s.Devices))
	for k, d := range s.Devices {
		dd := *d
		c.Devices[k] = &dd
	}
	c.Connections = make(map[int]*ConnectionState, len(s.Connections))
	for k, cn := range s.Connections {
		cc := *cn
		cc.Paths = slices.Clone(cn.Paths)
		cc.PeerDevices = make(map[int]*PeerDeviceState, len(cn.PeerDevices))
		for v, pd := range cn.PeerDevices {
			p := *pd
			cc.PeerDevices[v] = &p
		}
		c.Connections[k] = &cc
	}
	return &c
}

// Equal compares two states, ignoring Updated (two snapshots of the same
// kernel state taken at different times are equal).
func (s *ResourceState) Equal(o *ResourceState) bool {
	return s.Diff(o) == ""
}

// Diff describes the first differences between s and o ("" if none),
// ignoring Updated.
func (s *ResourceState) Diff(o *ResourceState) string {
	var d []string
	add := func(what string, a, b any) { d = append(d, fmt.Sprintf("%s: %v != %v", what, a, b)) }
	if s.Name != o.Name {
		add("name", s.Name, o.Name)
	}
	if s.Role != o.Role {
		add("role", s.Role, o.Role)
	}
	if strings.Join(s.Suspended, ",") != strings.Join(o.Suspended, ",") {
		add("suspended", s.Suspended, o.Suspended)
	}
	if fmtPtr(s.MayPromote) != fmtPtr(o.MayPromote) {
		add("may-promote", fmtPtr(s.MayPromote), fmtPtr(o.MayPromote))
	}
	if fmtPtr(s.PromotionScore) != fmtPtr(o.PromotionScore) {
		add("promotion-score", fmtPtr(s.PromotionScore), fmtPtr(o.PromotionScore))
	}
	for v := range union(s.Devices, o.Devices) {
		a, b := s.Devices[v], o.Devices[v]
		if a == nil || b == nil || *a != *b {
			add(fmt.Sprintf("device %d", v), a, b)
		}
	}
	for id := range union(s.Connections, o.Connections) {
		a, b := s.Connections[id], o.Connections[id]
		if a == nil || b == nil {
			add(fmt.Sprintf("connection %d", id), a, b)
			continue
		}
		if a.Name != b.Name || a.State != b.State || a.PeerRole != b.PeerRole || a.Congested != b.Congested {
			add(fmt.Sprintf("connection %d", id), *a, *b)
		}
		if !samePaths(a.Paths, b.Paths) {
			add(fmt.Sprintf("connection %d paths", id), a.Paths, b.Paths)
		}
		for v := range union(a.PeerDevices, b.PeerDevices) {
			pa, pb := a.PeerDevices[v], b.PeerDevices[v]
			if pa == nil || pb == nil || !pa.equal(pb) {
				add(fmt.Sprintf("connection %d peer-device %d", id, v), pa, pb)
			}
		}
	}
	return strings.Join(d, "; ")
}

func (p *PeerDeviceState) equal(o *PeerDeviceState) bool {
	a, b := *p, *o
	pa, pb := a.PercentInSync, b.PercentInSync
	a.PercentInSync, b.PercentInSync = 0, 0
	// Percentages are compared at drbdsetup's printed precision.
	same := (math.IsNaN(pa) && math.IsNaN(pb)) || math.Abs(pa-pb) <= 0.01
	return a == b && same
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprint(*p)
}

func union[V any](a, b map[int]V) map[int]bool {
	u := map[int]bool{}
	for k := range a {
		u[k] = true
	}
	for k := range b {
		u[k] = true
	}
	return u
}

func parseSuspended(v string) []string {
	if v == "no" || v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// apply updates s with one events2 object event. Fields absent from a
// change line keep their value: without --full, drbdsetup prints only what
// changed (plus statistics).
func (s *ResourceState) apply(ev *Event) error {
	if !ev.Time.IsZero() {
		s.Updated = ev.Time
	}
	switch ev.Object {
	case ObjResource:
		if ev.Kind == EventDestroy {
			return nil // the caller drops the resource
		}
		if v, ok := ev.Get("role"); ok {
			s.Role = v
		}
		if v, ok := ev.Get("suspended"); ok {
			s.Suspended = parseSuspended(v)
		}
		if b, ok, err := ev.boolField("may_promote"); err != nil {
			return err
		} else if ok {
			s.MayPromote = &b
		}
		if n, ok, err := ev.intField("promotion_score"); err != nil {
			return err
		} else if ok {
			v := int(n)
			s.PromotionScore = &v
		}
	case ObjDevice:
		vol := mustAtoi(ev, "volume")
		if ev.Kind == EventDestroy {
			delete(s.Devices, vol)
			return nil
		}
		d := s.Devices[vol]
		if d == nil {
			d = &DeviceState{Volume: vol}
			s.Devices[vol] = d
		}
		if _, ok := ev.Get("minor"); ok {
			d.Minor = mustAtoi(ev, "minor")
		}
		if v, ok := ev.Get("disk"); ok {
			d.DiskState = v
		}
		if v, ok := ev.Get("backing_dev"); ok {
			d.BackingDev = v
		}
		for key, dst := range map[string]*bool{"client": &d.Client, "quorum": &d.Quorum} {
			if b, ok, err := ev.boolField(key); err != nil {
				return err
			} else if ok {
				*dst = b
			}
		}
		if n, ok, err := ev.intField("size"); err != nil {
			return err
		} else if ok {
			d.SizeKiB = n
			s.recomputePercent()
		}
	case ObjConnection:
		id := mustAtoi(ev, "peer-node-id")
		if ev.Kind == EventDestroy {
			delete(s.Connections, id)
			return nil
		}
		c := s.connection(id)
		if v, ok := ev.Get("conn-name"); ok {
			c.Name = v
		}
		if v, ok := ev.Get("connection"); ok {
			c.State = v
		}
		if v, ok := ev.Get("role"); ok {
			c.PeerRole = v
		}
		if b, ok, err := ev.boolField("congested"); err != nil {
			return err
		} else if ok {
			c.Congested = b
		}
	case ObjPath:
		c := s.connection(mustAtoi(ev, "peer-node-id"))
		local, _ := ev.Get("local")
		peer, _ := ev.Get("peer")
		i := c.pathIndex(local, peer)
		if ev.Kind == EventDestroy {
			if i >= 0 {
				c.Paths = slices.Delete(c.Paths, i, i+1)
			}
			return nil
		}
		var p PathState
		if i >= 0 {
			p = c.Paths[i]
		}
		p.Local, p.Peer = local, peer
		if b, ok, err := ev.boolField("established"); err != nil {
			return err
		} else if ok {
			p.Established = b
		}
		if i >= 0 {
			c.Paths[i] = p
		} else {
			c.Paths = append(c.Paths, p)
		}
	case ObjPeerDevice:
		c := s.connection(mustAtoi(ev, "peer-node-id"))
		if v, ok := ev.Get("conn-name"); ok && c.Name == "" {
			c.Name = v
		}
		vol := mustAtoi(ev, "volume")
		if ev.Kind == EventDestroy {
			delete(c.PeerDevices, vol)
			return nil
		}
		p := c.PeerDevices[vol]
		if p == nil {
			p = &PeerDeviceState{Volume: vol, PercentInSync: math.NaN()}
			c.PeerDevices[vol] = p
		}
		if v, ok := ev.Get("replication"); ok {
			p.Replication = v
		}
		if v, ok := ev.Get("peer-disk"); ok {
			p.PeerDisk = v
		}
		if v, ok := ev.Get("resync-suspended"); ok {
			p.ResyncSuspended = v
		}
		if b, ok, err := ev.boolField("peer-client"); err != nil {
			return err
		} else if ok {
			p.PeerClient = b
		}
		if n, ok, err := ev.intField("out-of-sync"); err != nil {
			return err
		} else if ok {
			p.OutOfSyncKiB = n
			s.recomputePercent()
		}
	case ObjHelper:
		// Helper calls (quorum-lost, disconnected, …) are notifications,
		// not state; the Observer passes them on as they are.
	}
	return nil
}

func (s *ResourceState) connection(id int) *ConnectionState {
	c := s.Connections[id]
	if c == nil {
		c = &ConnectionState{PeerNodeID: id, PeerDevices: map[int]*PeerDeviceState{}}
		s.Connections[id] = c
	}
	return c
}

func (s *ResourceState) recomputePercent() {
	for _, c := range s.Connections {
		for v, p := range c.PeerDevices {
			d := s.Devices[v]
			if d == nil || d.SizeKiB <= 0 {
				continue
			}
			p.PercentInSync = percentInSync(d.SizeKiB, p.OutOfSyncKiB)
		}
	}
}

func percentInSync(size, oos int64) float64 {
	if size <= 0 {
		return math.NaN()
	}
	if oos > size {
		oos = size
	}
	// Truncated to two decimals, as drbdsetup prints it.
	return math.Floor(float64(size-oos)*10000/float64(size)) / 100
}

// mustAtoi reads an int field ParseEvent has already validated.
func mustAtoi(ev *Event, key string) int {
	v, _ := ev.Get(key)
	n, _ := strconv.Atoi(v)
	return n
}

// StateFromStatus converts `status --json` output to the same shape the
// Observer builds from events2.
func StateFromStatus(r StatusResource) *ResourceState {
	s := newResourceState(r.Name)
	s.Role = r.Role
	for _, reason := range []struct {
		on   bool
		name string
	}{{r.SuspendedUser, "user"}, {r.SuspendedNoData, "no-data"}, {r.SuspendedFencing, "fencing"}, {r.SuspendedQuorum, "quorum"}} {
		if reason.on {
			s.Suspended = append(s.Suspended, reason.name)
		}
	}
	for _, d := range r.Devices {
		// status --json does not print the backing device; BackingDev stays empty.
		s.Devices[d.Volume] = &DeviceState{Volume: d.Volume, Minor: d.Minor, DiskState: d.DiskState,
			Client: d.Client, Quorum: d.Quorum, SizeKiB: d.Size}
	}
	for _, c := range r.Connections {
		cs := s.connection(c.PeerNodeID)
		cs.Name, cs.State, cs.PeerRole, cs.Congested = c.Name, c.ConnectionState, c.PeerRole, c.Congested
		for _, p := range c.PeerDevices {
			cs.PeerDevices[p.Volume] = &PeerDeviceState{Volume: p.Volume, Replication: p.ReplicationState,
				PeerDisk: p.PeerDiskState, PeerClient: p.PeerClient, ResyncSuspended: p.ResyncSuspended,
				OutOfSyncKiB: p.OutOfSync, PercentInSync: p.PercentInSync}
		}
	}
	return s
}
