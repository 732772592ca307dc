package drbd

import "net/netip"

// VolumeNumber is the only DRBD volume meshvol uses: one RV is one resource
// with one volume. Keeping it a constant (not a field) makes "multi-volume"
// an explicit future change rather than a silently half-supported one.
const VolumeNumber = 0

// Resource is the desired DRBD configuration of one resource on this node.
//
// It is a pure value: the renderer turns it into a .res file, drbdsim
// interprets it directly. Options are already resolved (see Resolve), so a
// Resource never carries "inherit" markers.
type Resource struct {
	// Name is the DRBD resource name (derived from the RV name). DRBD's rules
	// apply; see ValidateName.
	Name string
	// Self is this node: its "on" host name, node-id and listen address.
	Self Host
	// Minor is this node's /dev/drbd<Minor>.
	Minor int
	// Disk is the local backing device; nil means diskless ("disk none").
	Disk *Disk
	// Peers are the nodes this node connects to. Not every member of the
	// datamesh is a peer of every other: Access and TieBreaker members connect
	// only to full-mesh members, so the renderer writes one connection block
	// per peer rather than a connection-mesh.
	Peers []Peer
	// Options are resolved (no nils); see Resolve.
	Options Options
}

// Host is a DRBD host: the name in its "on" section, its node-id and the
// address DRBD listens on / connects to.
type Host struct {
	Name    string
	NodeID  int
	Address Address
}

// Address is an IP address and TCP port. Port is an int (not uint16) so that
// an out-of-range value coming from an API object is reported by Validate
// instead of being silently truncated.
type Address struct {
	IP   netip.Addr
	Port int
}

// Disk is the local backing device of a diskful replica.
type Disk struct {
	// BackingDevice is the block device path, e.g. /dev/vg0/pvc-…_00000.
	BackingDevice string
	// MetaDisk is where DRBD keeps its metadata; meshvol uses "internal".
	MetaDisk string
}

// MetaDiskInternal keeps DRBD metadata at the end of the backing device.
const MetaDiskInternal = "internal"

// Peer is one node this node has a DRBD connection to.
type Peer struct {
	Name    string
	NodeID  int
	Address Address
	// Minor is the peer's own device minor. The local kernel never uses it,
	// but drbdadm parses every host section and expects a device for each, so
	// the renderer writes the peer's real minor (from the datamesh) rather
	// than inventing one.
	Minor int
	// Diskless means the peer is configured "disk none" (an Access or
	// TieBreaker member). drbdadm then creates the peer device without a
	// bitmap slot ("bitmap no"), which is what keeps the metadata's peer slots
	// for diskful peers.
	Diskless bool
	// AllowRemoteRead overrides Options.Net.AllowRemoteRead for this
	// connection; nil inherits. DRBD does not count a peer whose connection
	// has allow-remote-read no towards quorum (docs/drbd-quorum.md).
	AllowRemoteRead *bool
}

// EffectiveAllowRemoteRead is the allow-remote-read value of the connection
// to p under the resolved resource options o.
func (p Peer) EffectiveAllowRemoteRead(o Options) bool {
	if p.AllowRemoteRead != nil {
		return *p.AllowRemoteRead
	}
	return o.Net.AllowRemoteRead
}

// Diskless reports whether this node is configured without a backing disk.
func (r *Resource) Diskless() bool { return r.Disk == nil }

// Peer returns the peer with the given node-id.
func (r *Resource) Peer(nodeID int) (Peer, bool) {
	for _, p := range r.Peers {
		if p.NodeID == nodeID {
			return p, true
		}
	}
	return Peer{}, false
}
