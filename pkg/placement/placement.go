// Package placement turns the engine's "create a Diskful / TieBreaker / Access replica" into
// nodes. It is a pure function of what the caller read from its caches (Input),
// so every rule is a table test. The rules, in the order a node is judged:
//
//   - the node is an eligible node of the volume's pool, its agent is live, the pool is
//     ready there, it is not cordoned for meshvol (label storage.meshvol.io/cordon, or
//     spec.unschedulable) and it offers the volume's HMAC algorithm;
//   - it holds no replica of this volume (one replica per node, ever: the RVR is named
//     <rv>-<node>);
//   - it is in the configuration's zones, when some are listed;
//   - a Diskful replica needs free capacity in the pool there for its backing volume:
//     the volume's size plus DRBD's internal metadata (Fits);
//   - topology: Zonal keeps every Diskful and TieBreaker replica in one zone, TransZonal
//     spreads them so that losing any one zone leaves quorum and the promised copies,
//     Ignored places without regard to zones;
//   - among the nodes left: a node with an attachment first (for a Diskful replica of a
//     volume whose volumeAccess is not Any), then the fewest replicas of any volume,
//     then the most free space, then the name (so the answer never depends on map
//     order).
//
// Diskful and TieBreaker replicas are placed all together or not at all: a volume
// never gets half of what it asked for and a condition saying it is stuck. Access
// replicas go to the node their attachment names, each on its own.
//
// The controller places replicas with it (pkg/controller); the CSI controller service
// asks it, before it creates a volume, whether the pool as it is could place one at all,
// so that CreateVolume refuses with ResourceExhausted what placement would refuse.
package placement

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// BackingBytes is what a Diskful replica of a volume of size bytes takes from its pool:
// the backing volume the agent creates, the data and DRBD's internal metadata for
// v1.DRBDMaxPeers peers.
func BackingBytes(size int64) int64 { return drbd.BackingBytes(size, v1.DRBDMaxPeers) }

// Fits reports whether free bytes of a pool on a node hold a Diskful replica of a
// volume of size bytes.
func Fits(free, size int64) bool { return free >= BackingBytes(size) }

// Node is what placement knows about one node.
type Node struct {
	Name string
	Zone string
	// InPool: the node is an eligible node of the volume's storage pool.
	InPool bool
	// PoolReady: the pool's storage is usable there (the agent reports its capacity).
	PoolReady bool
	// Cordoned: storage.meshvol.io/cordon or spec.unschedulable.
	Cordoned bool
	// AgentLive: the node's agent Lease is valid.
	AgentLive bool
	// HMACOK: the node's kernel offers the volume's shared-secret algorithm (true when
	// the agent does not say: DRBD then reports the failure on the connection).
	HMACOK bool
	// PortsFull: every DRBD port of the controller's range is held on the node (a port
	// is unique per node; docs/controller.md, "Allocation and the shared secret").
	PortsFull bool
	// Free is the pool's free bytes on the node, less what replicas placed there but
	// not yet backed will take; HasFree says whether the agent reported it at all.
	Free    int64
	HasFree bool
	// Replicas counts replicas of every volume on the node (the load to spread).
	Replicas int
}

// Replica is an existing replica of the volume.
type Replica struct {
	Node     string
	Type     v1.ReplicaType
	Deleting bool
}

// Input is everything one placement decision reads.
type Input struct {
	Config   v1.ReplicatedVolumeConfiguration
	Size     resource.Quantity
	Existing []Replica
	// Diskful and TieBreaker are how many replicas of each type to place now.
	Diskful, TieBreaker int
	// AttachNodes are nodes with an attachment request for the volume.
	AttachNodes []string
	// Requisite and Preferred are the volume's CSI accessibility requirements
	// (spec.placementHints). Diskful replicas go to the preferred segments first, in
	// order; with volumeAccess Local one of them must be in a requisite segment.
	Requisite, Preferred []v1.TopologySegment
	// SeedNode, when set, must hold a Diskful replica: a restore's first replica starts
	// from the snapshot's copy on that node (docs/snapshots.md, "Restore and clone").
	SeedNode string
	Nodes    []Node
}

// Choice is a node chosen for a new replica.
type Choice struct {
	Node string
	Type v1.ReplicaType
}

// Error is why no set of nodes fits. Constraint names the rule that failed
// (for the condition's reason); Error() is the message a person reads.
type Error struct {
	Constraint string
	Message    string
}

func (e *Error) Error() string { return e.Message }

// Constraint names (condition reasons when placement fails).
const (
	ConstraintNoEligibleNodes = "NoEligibleNodes"
	ConstraintCapacity        = "InsufficientCapacity"
	ConstraintZonal           = "ZonalNoZoneFits"
	ConstraintTransZonal      = "TransZonalNotEnoughZones"
	ConstraintNodes           = "NotEnoughNodes"
	ConstraintAccessNode      = "AccessNodeUnavailable"
	ConstraintRequisite       = "RequisiteTopologyUnavailable"
	ConstraintSeedNode        = "SourceNodeUnavailable"
)

// Place chooses nodes for in.Diskful Diskful and in.TieBreaker TieBreaker replicas,
// all or none.
func Place(in Input) ([]Choice, error) {
	if in.Diskful == 0 && in.TieBreaker == 0 {
		return nil, nil
	}
	p := newPlacer(in)
	var out []Choice
	var err error
	switch in.Config.Topology {
	case v1.TopologyZonal:
		out, err = p.zonal()
	case v1.TopologyTransZonal:
		out, err = p.transZonal()
	default:
		out, err = p.anywhere()
	}
	if err != nil {
		return nil, err
	}
	if p.needSeed() {
		return nil, &Error{Constraint: ConstraintSeedNode,
			Message: "the volume starts from the copy of its data source on node " + in.SeedNode +
				", which cannot take a Diskful replica in pool " + strconv.Quote(in.Config.StoragePool) + p.excluded()}
	}
	if p.needRequisite() {
		var segs []string
		for _, s := range in.Requisite {
			segs = append(segs, segmentString(s))
		}
		return nil, &Error{Constraint: ConstraintRequisite,
			Message: "volumeAccess=Local needs a Diskful replica in one of the requisite topology segments (" + strings.Join(segs, "; ") +
				") in pool " + strconv.Quote(in.Config.StoragePool) + ": no node there fits" + p.excluded()}
	}
	return out, nil
}

func segmentString(s v1.TopologySegment) string {
	var parts []string
	if s.NodeName != "" {
		parts = append(parts, "node "+s.NodeName)
	}
	if s.Zone != "" {
		parts = append(parts, "zone "+s.Zone)
	}
	if len(parts) == 0 {
		return "anywhere"
	}
	return strings.Join(parts, ", ")
}

func SegmentMatches(s v1.TopologySegment, node, zone string) bool {
	return (s.NodeName == "" || s.NodeName == node) && (s.Zone == "" || s.Zone == zone)
}

// needRequisite: volumeAccess Local with requisite segments, and no Diskful replica of
// the volume (existing or placed now) in one of them yet.
func (p *placer) needRequisite() bool {
	if p.in.Config.VolumeAccess != v1.VolumeAccessLocal || len(p.in.Requisite) == 0 {
		return false
	}
	for _, r := range p.in.Existing {
		if !r.Deleting && r.Type == v1.ReplicaTypeDiskful && p.inRequisite(r.Node, p.zoneOf(r.Node)) {
			return false
		}
	}
	for _, n := range p.placedD {
		if p.inRequisite(n, p.zoneOf(n)) {
			return false
		}
	}
	return true
}

// needSeed: a seed node is set and no Diskful replica of the volume (existing or placed
// now) is on it yet.
func (p *placer) needSeed() bool {
	if p.in.SeedNode == "" || slices.Contains(p.placedD, p.in.SeedNode) {
		return false
	}
	return !slices.ContainsFunc(p.in.Existing, func(r Replica) bool {
		return !r.Deleting && r.Type == v1.ReplicaTypeDiskful && r.Node == p.in.SeedNode
	})
}

func (p *placer) inRequisite(node, zone string) bool {
	for _, s := range p.in.Requisite {
		if SegmentMatches(s, node, zone) {
			return true
		}
	}
	return false
}

// prefRank is the index of the first preferred segment the node is in (len when none).
func (p *placer) prefRank(n *Node) int {
	for i, s := range p.in.Preferred {
		if SegmentMatches(s, n.Name, n.Zone) {
			return i
		}
	}
	return len(p.in.Preferred)
}

type placer struct {
	in    Input
	in0   Input           // the input as given (messages judge the nodes before this call)
	size  int64           // what a Diskful replica takes from the pool (BackingBytes)
	taken map[string]bool // nodes with a replica of this volume (existing or placed now)
	free  map[string]int64
	// refused counts, per rule, the nodes it removed (for messages).
	why map[string][]string
	// placedD are the nodes this call gave a Diskful replica.
	placedD []string
}

func newPlacer(in Input) *placer {
	orig := in
	in.Nodes = slices.Clone(in.Nodes) // take() counts placed replicas on its own copy
	p := &placer{in: in, in0: orig, size: BackingBytes(in.Size.Value()), taken: map[string]bool{}, free: map[string]int64{}, why: map[string][]string{}}
	for _, r := range in.Existing {
		p.taken[r.Node] = true
	}
	for _, n := range in.Nodes {
		p.free[n.Name] = n.Free
	}
	return p
}

// usable reports whether n may take a replica at all, and records why not.
func (p *placer) usable(n *Node, record bool) bool {
	reason := ""
	switch {
	case !n.InPool:
		reason = "not in pool"
	case p.taken[n.Name]:
		reason = "already holds a replica of this volume"
	case !n.AgentLive:
		reason = "agent not live"
	case !n.PoolReady:
		reason = "pool not ready"
	case n.Cordoned:
		reason = "cordoned"
	case !n.HMACOK:
		reason = "lacks the shared-secret algorithm"
	case n.PortsFull:
		reason = "no free DRBD port"
	case len(p.in.Config.Zones) > 0 && !slices.Contains(p.in.Config.Zones, n.Zone):
		reason = "zone " + quoteZone(n.Zone) + " not in the configuration's zones"
	}
	if reason != "" && record {
		p.why[reason] = append(p.why[reason], n.Name)
	}
	return reason == ""
}

// fits reports whether n has room for a Diskful replica.
func (p *placer) fits(n *Node) bool {
	return n.HasFree && p.free[n.Name] >= p.size
}

func (p *placer) wantsLocal() bool {
	return p.in.Config.VolumeAccess != v1.VolumeAccessAny
}

// better orders candidates: for a Diskful replica, a requisite segment first while
// volumeAccess Local still needs one, then an attachment node (unless volumeAccess Any),
// then the earliest preferred segment; then fewest replicas, most free, name.
func (p *placer) better(diskful bool) func(a, b *Node) int {
	needReq := diskful && p.needRequisite()
	needSeed := diskful && p.needSeed()
	return func(a, b *Node) int {
		if needSeed && (a.Name == p.in.SeedNode) != (b.Name == p.in.SeedNode) {
			if a.Name == p.in.SeedNode {
				return -1
			}
			return 1
		}
		if needReq {
			ra, rb := p.inRequisite(a.Name, a.Zone), p.inRequisite(b.Name, b.Zone)
			if ra != rb {
				if ra {
					return -1
				}
				return 1
			}
		}
		if diskful && p.wantsLocal() {
			la, lb := slices.Contains(p.in.AttachNodes, a.Name), slices.Contains(p.in.AttachNodes, b.Name)
			if la != lb {
				if la {
					return -1
				}
				return 1
			}
		}
		if diskful {
			if pa, pb := p.prefRank(a), p.prefRank(b); pa != pb {
				return pa - pb
			}
		}
		if a.Replicas != b.Replicas {
			return a.Replicas - b.Replicas
		}
		if fa, fb := p.free[a.Name], p.free[b.Name]; fa != fb {
			if fa > fb {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	}
}

// candidates returns usable nodes (in zone when zone != nil), Diskful-fitting when
// diskful, best first.
func (p *placer) candidates(diskful bool, zone *string) []*Node {
	var out []*Node
	for i := range p.in.Nodes {
		n := &p.in.Nodes[i]
		if zone != nil && n.Zone != *zone {
			continue
		}
		if !p.usable(n, false) || (diskful && !p.fits(n)) {
			continue
		}
		out = append(out, n)
	}
	slices.SortFunc(out, p.better(diskful))
	return out
}

func (p *placer) take(n *Node, t v1.ReplicaType, out []Choice) []Choice {
	p.taken[n.Name] = true
	if t == v1.ReplicaTypeDiskful {
		p.free[n.Name] -= p.size
		p.placedD = append(p.placedD, n.Name)
	}
	n.Replicas++
	return append(out, Choice{Node: n.Name, Type: t})
}

// anywhere: topology Ignored.
func (p *placer) anywhere() ([]Choice, error) {
	var out []Choice
	for range p.in.Diskful {
		c := p.candidates(true, nil)
		if len(c) == 0 {
			return nil, p.shortage(v1.ReplicaTypeDiskful, p.in.Diskful, nil)
		}
		out = p.take(c[0], v1.ReplicaTypeDiskful, out)
	}
	for range p.in.TieBreaker {
		c := p.candidates(false, nil)
		if len(c) == 0 {
			return nil, p.shortage(v1.ReplicaTypeTieBreaker, p.in.TieBreaker, nil)
		}
		out = p.take(c[0], v1.ReplicaTypeTieBreaker, out)
	}
	return out, nil
}

// zonal: every Diskful and TieBreaker replica in one zone: the zone the volume's
// replicas already use, else the zone that fits them all with the most room.
func (p *placer) zonal() ([]Choice, error) {
	existing := p.existingZones()
	zones := p.zones()
	if len(existing) > 0 {
		zones = existing[:1] // the volume's zone (the first by name if it has several)
	}
	opts := p.zoneOptions(zones)
	if len(opts) == 0 || !p.zoneFitsAll(opts[0]) {
		return nil, p.zonalRefusal(opts, existing)
	}
	z := opts[0].zone
	var out []Choice
	for range p.in.Diskful {
		out = p.take(p.candidates(true, &z)[0], v1.ReplicaTypeDiskful, out)
	}
	for range p.in.TieBreaker {
		out = p.take(p.candidates(false, &z)[0], v1.ReplicaTypeTieBreaker, out)
	}
	return out, nil
}

// zoneOption is one zone as zonal placement weighs it.
type zoneOption struct {
	zone       string
	d, tb      int // nodes that can take a Diskful replica, any replica
	free       int64
	replicaSum int
	pref       int // best preferred-segment rank of its nodes (requisite first when needed)
}

// zoneOptions weighs the zones, best first: one that fits every replica, then the best
// preferred segment, the most free space, the name.
func (p *placer) zoneOptions(zones []string) []zoneOption {
	var opts []zoneOption
	for _, z := range zones {
		zz := z
		d := p.candidates(true, &zz)
		tb := p.candidates(false, &zz)
		o := zoneOption{zone: z, d: len(d), tb: len(tb), pref: len(p.in.Preferred) + 1}
		for _, n := range d {
			o.free += p.free[n.Name]
			r := p.prefRank(n)
			if p.needRequisite() && p.inRequisite(n.Name, n.Zone) {
				r = -1
			}
			if p.needSeed() && n.Name == p.in.SeedNode {
				r = -2
			}
			o.pref = min(o.pref, r)
		}
		for _, n := range tb {
			o.replicaSum += n.Replicas
		}
		opts = append(opts, o)
	}
	sort.SliceStable(opts, func(i, j int) bool {
		fi, fj := p.zoneFitsAll(opts[i]), p.zoneFitsAll(opts[j])
		if fi != fj {
			return fi
		}
		if opts[i].pref != opts[j].pref {
			return opts[i].pref < opts[j].pref
		}
		if opts[i].free != opts[j].free {
			return opts[i].free > opts[j].free
		}
		return opts[i].zone < opts[j].zone
	})
	return opts
}

// zoneFitsAll: the zone has enough Diskful nodes and, beyond them, enough nodes for the
// TieBreakers (a TB may not share a node with a D of the volume).
func (p *placer) zoneFitsAll(o zoneOption) bool {
	return o.d >= p.in.Diskful && o.tb >= p.in.Diskful+p.in.TieBreaker
}

// zonalRefusal says that no zone fits, with what each has.
func (p *placer) zonalRefusal(opts []zoneOption, existing []string) error {
	var parts []string
	for _, o := range opts {
		parts = append(parts, "zone "+quoteZone(o.zone)+" has "+strconv.Itoa(o.d))
	}
	sort.Strings(parts)
	where := "no zone has eligible nodes"
	if len(parts) > 0 {
		where = strings.Join(parts, ", ")
	}
	what := strconv.Itoa(p.in.Diskful) + " nodes with free capacity ≥ " + p.sizeString()
	if p.in.TieBreaker > 0 {
		what += " and " + strconv.Itoa(p.in.TieBreaker) + " more for a TieBreaker"
	}
	scope := "one zone"
	if len(existing) > 0 {
		scope = "zone " + quoteZone(existing[0]) + " (where the volume's replicas are)"
	}
	return &Error{Constraint: ConstraintZonal,
		Message: "Zonal needs " + what + " in " + scope + " in pool " + strconv.Quote(p.in.Config.StoragePool) + ": " + where + p.excluded()}
}

// transZonal spreads Diskful replicas over zones (fewest Diskful first), then puts each
// TieBreaker in the zone with the fewest replicas, so 3D goes 1/1/1, 2D+1TB D/D/TB,
// 4D+1TB 2/1+TB/1 and 5D 2/2/1.
func (p *placer) transZonal() ([]Choice, error) {
	// need: the zones over which losing any one keeps quorum and GMDR+1 copies
	// (docs/layouts.md §7), the same count the engine refuses a configuration by.
	// FTT 0 promises nothing about zones (1): its replicas spread as far as the
	// zones allow. needD of them must take a Diskful replica, the others a TieBreaker.
	l := layout.Layout{FTT: int(p.in.Config.FailuresToTolerate), GMDR: int(p.in.Config.GuaranteedMinimumDataRedundancy)}
	need := l.MinZones()
	needD := max(need-layout.TieBreakerMin(l.DiskfulCount(), l.FTT), 1)
	tally := p.existingTally()
	zones := p.zones()
	dZones, anyZones, lacking := p.transZonalZones(zones, tally)
	if len(anyZones) < need || len(dZones) < needD {
		return nil, p.transZonalRefusal(need, needD, len(zones), len(dZones), lacking)
	}
	var out []Choice
	var err error
	for range p.in.Diskful {
		if out, err = p.takeInEmptiestZone(v1.ReplicaTypeDiskful, dZones, tally, out); err != nil {
			return nil, err
		}
	}
	for range p.in.TieBreaker {
		if out, err = p.takeInEmptiestZone(v1.ReplicaTypeTieBreaker, anyZones, tally, out); err != nil {
			return nil, err
		}
	}
	if need > 1 {
		if err := p.checkSpread(needD, dZones, tally.d); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// zoneTally counts the volume's replicas per zone, those it has and those this call
// places: Diskful ones (d), and Diskful and TieBreaker ones (all).
type zoneTally struct{ d, all map[string]int }

func (p *placer) existingTally() zoneTally {
	t := zoneTally{d: map[string]int{}, all: map[string]int{}}
	for _, r := range p.in.Existing {
		if r.Deleting {
			continue
		}
		z := p.zoneOf(r.Node)
		if r.Type == v1.ReplicaTypeDiskful {
			t.d[z]++
		}
		if r.Type == v1.ReplicaTypeDiskful || r.Type == v1.ReplicaTypeTieBreaker {
			t.all[z]++
		}
	}
	return t
}

// transZonalZones sorts the zones: those that can take a Diskful replica now or already
// hold one (dZones), those that can take any replica (anyZones: a TieBreaker needs no
// capacity), and what the others lack.
func (p *placer) transZonalZones(zones []string, tally zoneTally) (dZones, anyZones, lacking []string) {
	for _, z := range zones {
		zz := z
		switch {
		case len(p.candidates(true, &zz)) > 0 || tally.d[z] > 0:
			dZones = append(dZones, z)
			anyZones = append(anyZones, z)
		case len(p.candidates(false, &zz)) > 0 || tally.all[z] > 0:
			anyZones = append(anyZones, z)
			lacking = append(lacking, "zone "+quoteZone(z)+" has none")
		default:
			lacking = append(lacking, "zone "+quoteZone(z)+" has none")
		}
	}
	return dZones, anyZones, lacking
}

// transZonalRefusal says there are too few zones: need in all, needD of them with room
// for a Diskful replica; the pool's usable nodes are in zones zones, dZones of them
// with room.
func (p *placer) transZonalRefusal(need, needD, zones, dZones int, lacking []string) error {
	msg := "TransZonal needs " + strconv.Itoa(need) + " zones"
	if needD < need {
		msg += " (" + strconv.Itoa(needD) + " with free capacity ≥ " + p.sizeString() + ", one more for the TieBreaker)"
	} else {
		msg += " with free capacity ≥ " + p.sizeString()
	}
	msg += " in pool " + strconv.Quote(p.in.Config.StoragePool)
	switch {
	case need == 4:
		msg = "TransZonal with failuresToTolerate=1, guaranteedMinimumDataRedundancy=2 (4D) needs 4 zones: over 3 zones one zone holds 2 of 4 Diskful and losing it leaves no quorum; " +
			"zones with free capacity ≥ " + p.sizeString() + " in pool " + strconv.Quote(p.in.Config.StoragePool) + ": " + strconv.Itoa(dZones)
	case zones < need:
		msg += ": the pool's usable nodes are in " + strconv.Itoa(zones) + " zone(s)"
	}
	if len(lacking) > 0 {
		msg += ": " + strings.Join(lacking, ", ")
	}
	return &Error{Constraint: ConstraintTransZonal, Message: msg + p.excluded()}
}

// takeInEmptiestZone places a replica of type t in the first of zones, ordered by fewest
// replicas of its kind (then, for a TieBreaker, fewest replicas; then name), that has a
// candidate node.
func (p *placer) takeInEmptiestZone(t v1.ReplicaType, zones []string, tally zoneTally, out []Choice) ([]Choice, error) {
	count := tally.all
	if t == v1.ReplicaTypeDiskful {
		count = tally.d
	}
	order := slices.Clone(zones)
	slices.SortStableFunc(order, func(a, b string) int {
		if count[a] != count[b] {
			return count[a] - count[b]
		}
		if t == v1.ReplicaTypeTieBreaker && tally.all[a] != tally.all[b] {
			return tally.all[a] - tally.all[b]
		}
		return strings.Compare(a, b)
	})
	for _, z := range order {
		zz := z
		if c := p.candidates(t == v1.ReplicaTypeDiskful, &zz); len(c) > 0 {
			if t == v1.ReplicaTypeDiskful {
				tally.d[z]++
			}
			tally.all[z]++
			return p.take(c[0], t, out), nil
		}
	}
	return nil, p.shortage(t, 1, nil)
}

// checkSpread: greedy spreading can still pile up when a zone runs out of nodes, so no
// zone may hold more Diskful replicas than an even spread over needD zones gives.
func (p *placer) checkSpread(needD int, dZones []string, dCount map[string]int) error {
	total := 0
	for _, c := range dCount {
		total += c
	}
	limit := (total + needD - 1) / needD
	for _, z := range dZones {
		if dCount[z] > limit {
			return &Error{Constraint: ConstraintTransZonal,
				Message: "TransZonal cannot spread " + strconv.Itoa(total) + " Diskful over " + strconv.Itoa(needD) +
					" zones with at most " + strconv.Itoa(limit) + " per zone in pool " + strconv.Quote(p.in.Config.StoragePool) +
					": zone " + quoteZone(z) + " would hold " + strconv.Itoa(dCount[z]) + p.excluded()}
		}
	}
	return nil
}

// zones lists the zones of usable nodes (configuration's zones only), sorted.
func (p *placer) zones() []string {
	seen := map[string]bool{}
	for i := range p.in.Nodes {
		n := &p.in.Nodes[i]
		if p.usable(n, false) || (n.InPool && p.taken[n.Name]) {
			if len(p.in.Config.Zones) == 0 || slices.Contains(p.in.Config.Zones, n.Zone) {
				seen[n.Zone] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for z := range seen {
		out = append(out, z)
	}
	sort.Strings(out)
	return out
}

func (p *placer) zoneOf(node string) string {
	for i := range p.in.Nodes {
		if p.in.Nodes[i].Name == node {
			return p.in.Nodes[i].Zone
		}
	}
	return ""
}

// existingZones are the zones of the volume's live Diskful and TieBreaker replicas.
func (p *placer) existingZones() []string {
	seen := map[string]bool{}
	for _, r := range p.in.Existing {
		if !r.Deleting && (r.Type == v1.ReplicaTypeDiskful || r.Type == v1.ReplicaTypeTieBreaker) {
			seen[p.zoneOf(r.Node)] = true
		}
	}
	out := make([]string, 0, len(seen))
	for z := range seen {
		out = append(out, z)
	}
	sort.Strings(out)
	return out
}

func (p *placer) sizeString() string {
	q := p.in.Size
	return q.String()
}

// shortage explains why no node is left for a replica of type t, judged on the nodes as
// they were before this call placed anything.
func (p *placer) shortage(t v1.ReplicaType, want int, zone *string) error {
	p = newPlacer(p.in0)
	constraint := ConstraintNodes
	what := strconv.Itoa(want) + " " + string(t) + " replica(s)"
	usable, room := 0, 0
	var small []string
	for i := range p.in.Nodes {
		n := &p.in.Nodes[i]
		if !p.usable(n, false) {
			continue
		}
		usable++
		switch {
		case p.fits(n):
			room++
		case n.HasFree:
			small = append(small, n.Name+" has "+resource.NewQuantity(p.free[n.Name], resource.BinarySI).String())
		default:
			small = append(small, n.Name+" reports no capacity")
		}
	}
	msg := ""
	if t == v1.ReplicaTypeDiskful {
		what += " with free capacity ≥ " + p.sizeString()
	}
	switch {
	case len(p.in.Nodes) == 0:
		constraint = ConstraintNoEligibleNodes
		msg = ": the pool has no eligible nodes"
	case t == v1.ReplicaTypeDiskful:
		if room < usable {
			constraint = ConstraintCapacity
		}
		msg = ": " + strconv.Itoa(room) + " of " + strconv.Itoa(usable) + " usable node(s) have room"
		if len(small) > 0 {
			sort.Strings(small)
			msg += " (" + strings.Join(small, ", ") + ")"
		}
	default:
		msg = ": " + strconv.Itoa(usable) + " usable node(s)"
	}
	return &Error{Constraint: constraint, Message: "No node fits: need " + what + " in pool " +
		strconv.Quote(p.in.Config.StoragePool) + msg + p.excluded()}
}

// excluded lists the nodes rules took out, "; excluded: a, b (agent not live); …".
func (p *placer) excluded() string {
	for k := range p.why {
		delete(p.why, k)
	}
	for i := range p.in.Nodes {
		p.usable(&p.in.Nodes[i], true)
	}
	if len(p.why) == 0 {
		return ""
	}
	reasons := make([]string, 0, len(p.why))
	for r := range p.why {
		reasons = append(reasons, r)
	}
	var parts []string
	for _, r := range reasons {
		nodes := p.why[r]
		sort.Strings(nodes)
		parts = append(parts, strings.Join(nodes, ", ")+" ("+r+")")
	}
	sort.Strings(parts) // by node name: a person looks for a node
	return "; excluded: " + strings.Join(parts, "; ")
}

func quoteZone(z string) string {
	if z == "" {
		return `""`
	}
	return z
}

// CheckAccess checks that an Access replica may go to node (the node an attachment
// names): its agent is live and it holds no replica of the volume yet. Access
// replicas are diskless: pool capacity and cordon do not apply (cordon governs where
// data lives, not where a volume may be used).
func CheckAccess(node string, existing []Replica, nodes []Node) error {
	for _, r := range existing {
		if r.Node == node {
			return &Error{Constraint: ConstraintAccessNode, Message: fmt.Sprintf("node %s already holds a replica of this volume", node)}
		}
	}
	for i := range nodes {
		if nodes[i].Name == node {
			if !nodes[i].AgentLive {
				return &Error{Constraint: ConstraintAccessNode,
					Message: fmt.Sprintf("node %s has no live meshvol agent (Lease %s%s is missing or expired)", node, v1.AgentLeasePrefix, node)}
			}
			if !nodes[i].HMACOK {
				return &Error{Constraint: ConstraintAccessNode,
					Message: fmt.Sprintf("node %s does not offer the volume's shared-secret algorithm", node)}
			}
			if nodes[i].PortsFull {
				return &Error{Constraint: ConstraintAccessNode,
					Message: fmt.Sprintf("node %s has no free DRBD port: every port of the controller's --port-range is held by a replica there", node)}
			}
			return nil
		}
	}
	return &Error{Constraint: ConstraintAccessNode,
		Message: fmt.Sprintf("node %s has no meshvol agent (no Lease %s%s)", node, v1.AgentLeasePrefix, node)}
}
