package drbdsim

import (
	"math/bits"
	"sort"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// DiskState is a DRBD disk state, spelled as drbdsetup prints it.
type DiskState string

const (
	DiskDiskless     DiskState = "Diskless"
	DiskAttaching    DiskState = "Attaching"
	DiskDetaching    DiskState = "Detaching"
	DiskFailed       DiskState = "Failed"
	DiskNegotiating  DiskState = "Negotiating"
	DiskInconsistent DiskState = "Inconsistent"
	DiskOutdated     DiskState = "Outdated"
	DiskUnknown      DiskState = "DUnknown"
	DiskConsistent   DiskState = "Consistent"
	DiskUpToDate     DiskState = "UpToDate"
)

// Connection, replication and role names as drbdsetup prints them.
const (
	connStandAlone     = "StandAlone"
	connUnconnected    = "Unconnected"
	connConnecting     = "Connecting"
	connConnected      = "Connected"
	connNetworkFailure = "NetworkFailure"
	connTearDown       = "TearDown"

	replOff         = "Off"
	replEstablished = "Established"
	replWFBitMapS   = "WFBitMapS"
	replWFBitMapT   = "WFBitMapT"
	replSyncSource  = "SyncSource"
	replSyncTarget  = "SyncTarget"
	replVerifyS     = "VerifyS"
	replVerifyT     = "VerifyT"

	rolePrimary   = "Primary"
	roleSecondary = "Secondary"
	roleUnknown   = "Unknown"
)

// blockSize is the granularity of DRBD's bitmap: one bit per 4 KiB.
const blockSize = 4096

// uuidJustCreated is the current UUID of fresh metadata (create-md).
const uuidJustCreated = 4

// bitmap is one bit per 4 KiB block of the volume.
type bitmap []uint64

func newBitmap(blocks int64) bitmap { return make(bitmap, (blocks+63)/64) }

func (b bitmap) set(i int64) {
	if i/64 < int64(len(b)) {
		b[i/64] |= 1 << (i % 64)
	}
}
func (b bitmap) clear(i int64) { b[i/64] &^= 1 << (i % 64) }
func (b bitmap) setAll(blocks int64) {
	for i := int64(0); i < blocks; i++ {
		b.set(i)
	}
}
func (b bitmap) count() int64 {
	var n int
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	return int64(n)
}
func (b bitmap) or(o bitmap) {
	for i := range b {
		if i < len(o) {
			b[i] |= o[i]
		}
	}
}
func (b bitmap) reset() { clear(b) }

// first returns the lowest set bit, or -1.
func (b bitmap) first() int64 {
	for i, w := range b {
		if w != 0 {
			return int64(i)*64 + int64(bits.TrailingZeros64(w))
		}
	}
	return -1
}

// metadata is DRBD's on-disk metadata of one replica, kept per backing
// device. It survives crashes and restarts of the simulated node.
type metadata struct {
	backing  string
	maxPeers int
	// id is written on the device itself at create-md (mdsig.go), so the
	// metadata belongs to the device, not to its path: a path reused for a
	// new device (a loop device number handed out again) has none.
	id uint64
	// sizeBytes is the usable size: the backing device minus internal
	// metadata (activity log, superblock, one bitmap per peer slot).
	sizeBytes int64
	current   uint64
	history   []uint64
	// disk is the persisted consistency: Inconsistent, Outdated, or
	// UpToDate (restored as it was on attach).
	disk  DiskState
	peers map[int]*peerMD
}

type peerMD struct {
	bitmapUUID uint64
	bits       bitmap
	// outdated: the peer is known Outdated (it left gracefully, or a
	// promotion agreement outdated it).
	outdated bool
}

func (m *metadata) blocks() int64 { return m.sizeBytes / blockSize }

func (m *metadata) peer(id int) *peerMD {
	p := m.peers[id]
	if p == nil {
		p = &peerMD{bits: newBitmap(m.blocks())}
		if m.current == uuidJustCreated {
			// Fresh metadata: nothing is known to be in sync, every bit
			// is set (capture 01 shows out-of-sync = the whole size).
			p.bits.setAll(m.blocks())
		}
		m.peers[id] = p
	}
	return p
}

func (m *metadata) inHistory(u uint64) bool {
	for _, h := range m.history {
		if h == u {
			return true
		}
	}
	return false
}

// rotate starts generation u: the current one goes into the history. Unlike DRBD
// (_drbd_uuid_push_history, drbd_main.c, never records the just-created UUID) it
// records the just-created UUID too, so any two replicas that began from fresh
// metadata share an ancestor: a pair DRBD would call unrelated is reported as a split
// brain (Diverged), the stricter verdict for the soak's check.
func (m *metadata) rotate(u uint64) {
	m.history = append(m.history, m.current)
	if len(m.history) > 8 {
		m.history = m.history[len(m.history)-8:]
	}
	m.current = u
}

// inherit adds u, a UUID of a sync source, to the history as DRBD's
// _drbd_uuid_push_history does (drbd_main.c): never 0, and never a UUID the metadata
// holds already (current, a bitmap UUID, or in the history). The history keeps the
// newest eight.
func (m *metadata) inherit(u uint64) {
	if u == 0 || u == m.current || m.inHistory(u) {
		return
	}
	for _, p := range m.peers {
		if p.bitmapUUID == u {
			return
		}
	}
	m.history = append(m.history, u)
	if len(m.history) > 8 {
		m.history = m.history[len(m.history)-8:]
	}
}

// internalMetaKiB is the size of DRBD's internal metadata for a backing
// device of size KiB and maxPeers bitmap slots: 4 KiB superblock, 32 KiB
// activity log, and per peer one bit per 4 KiB rounded up to 4 KiB. For the
// captures' 128 MiB and 2 peers that is 44 KiB, so size:131028.
func internalMetaKiB(sizeKiB int64, maxPeers int) int64 {
	bmBytes := (sizeKiB/4 + 7) / 8
	bmKiB := (bmBytes + 4095) / 4096 * 4
	return 36 + int64(maxPeers)*bmKiB
}

// resConfig is a written (not necessarily applied) configuration.
type resConfig struct {
	res drbd.Resource
}

// resource is a resource as the simulated kernel runs it on one node.
type resource struct {
	n    *Node
	name string
	cfg  drbd.Resource // as applied by Up/Adjust

	role string
	disk DiskState
	md   *metadata // nil while no disk is attached
	// claim: the backing device's claim while attached (claim.go); the
	// device itself is opened only for each batch of IO (claim.openData).
	claim *claim

	quorate bool
	// quorumView: the view quorate was last computed from (quorumView()).
	quorumView string
	// quorumBasis: quorumView without the peers' quorate flags (quorumBasis()).
	quorumBasis string
	// members: node-ids reachable at the last cluster-wide agreement this
	// node took part in while quorate (docs/drbd-quorum.md).
	members map[int]bool

	conns map[int]*conn

	suspendedQuorum bool
	// suspendedUser: `drbdsetup suspend-io` holds the write path until
	// `resume-io`; a flag of the resource, independent of quorum, kept
	// across promotion and demotion, cleared by down (the resource is gone).
	suspendedUser   bool
	forceIOFailures bool

	// Statistics in KiB, as drbdsetup prints them.
	read, written, alWrites, bmWrites int64

	// leaving: `down` is disconnecting it; it may no longer be promoted.
	leaving bool

	// dev is a Primary's block device with Options.LoopDevices (device.go).
	dev *device
	// heldDev: the device this resource had when it was demoted while a
	// reader held it open. Its loop device stays that reader's (losetup -d
	// only set autoclear) and serves its reads, and it keeps the resource
	// from detaching until closed (see demote).
	heldDev *device

	// published is the last state published per events2 object.
	published map[string]*object
}

type conn struct {
	peer     drbd.Peer
	cstate   string
	peerRole string
	repl     string
	peerDisk DiskState
	// peerQuorate is the peer's quorum flag from its last state report.
	peerQuorate bool
	// peerNonVoting: the peer runs with the non-upstream non-voting disk
	// option (learnt over the connection, remembered after it is lost).
	peerNonVoting bool
	// handshaken: the generation UUIDs have been compared since both
	// disks were last attached and connected.
	handshaken bool
	// lostHandshake: this node attached its disk while connected to the peer
	// and lost the peer's answer to the attach (Node.LoseAttachHandshake): its
	// disk stays Negotiating until this connection drops.
	lostHandshake bool

	standAloneMsg string
	splitBrain    bool

	// pathUp: the path (TCP) is established while the connection is not
	// yet reported Connected: connections that a node makes at the same
	// moment show all their paths first (contract-real.node3.seq, 20-21).
	pathUp bool
	// nextTry: when this side next tries to connect while Connecting.
	nextTry time.Time
	// wfUntil: while WFBitMapS/T, when the bitmap exchange completes.
	wfUntil time.Time
	// rsTotal is the number of blocks the running resync started with.
	rsTotal   int64
	rsStarted time.Time
	// ovNext: while VerifyS, the next block online verify compares.
	ovNext int64

	received, sent int64 // KiB
}

func (r *resource) attached() bool {
	return r.md != nil && r.claim != nil && r.disk != DiskDiskless && r.disk != DiskFailed && r.disk != DiskAttaching
}

// negotiated: the disk is attached and past the negotiation with its peers, so
// a handshake may compare generation UUIDs with it. While Negotiating a disk
// is attached (it holds data, takes writes and counts toward quorum, as
// pkg/drbd/quorum says) but runs no handshake: see Node.LoseAttachHandshake.
func (r *resource) negotiated() bool { return r.attached() && r.disk != DiskNegotiating }

// endNegotiation ends a Negotiating disk's wait because the connection to the
// peer whose handshake it lost is going down: the disk takes the state its
// metadata restores (Inconsistent for a fresh one), and the handshakes with the
// peers still connected run at the next settle (test/vm/FINDINGS.md, "The
// product on real DRBD", 16: `disk( Negotiating -> Inconsistent )` in the state
// change that drops the connection, then a resync from the others). The caller
// publishes.
func (r *resource) endNegotiation(k *conn) {
	if !k.lostHandshake {
		return
	}
	k.lostHandshake = false
	if r.disk == DiskNegotiating && r.md != nil {
		r.disk = r.md.disk
	}
	for _, o := range r.conns {
		o.handshaken = false
	}
}

func (r *resource) nodeID() int { return r.cfg.Self.NodeID }

func (r *resource) sortedConns() []*conn {
	out := make([]*conn, 0, len(r.conns))
	for _, k := range r.conns {
		out = append(out, k)
	}
	// drbdsetup lists connections by descending peer node-id in events2
	// (see the captures); status sorts ascending. Callers reorder.
	sort.Slice(out, func(i, j int) bool { return out[i].peer.NodeID < out[j].peer.NodeID })
	return out
}

func (k *conn) connected() bool { return k.cstate == connConnected }

// peerResource finds the running resource on the other end of k.
func (c *Cluster) peerResource(r *resource, k *conn) *resource {
	pn := c.nodes[k.peer.Name]
	if pn == nil || pn.crashed {
		return nil
	}
	return pn.res[r.name]
}
