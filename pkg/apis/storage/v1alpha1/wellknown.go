package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"
)

// Well-known names shared by the controller, the node agent and the CSI services.
// docs/contract.md explains who writes each and when; this file is the one place
// their spelling lives.

const (
	// DefaultNamespace is where the controller keeps per-volume Secrets and where
	// agents renew their Leases, unless --namespace (or POD_NAMESPACE) says otherwise.
	DefaultNamespace = "meshvol-system"

	// CSIDriverName is the name the CSI services register under.
	CSIDriverName = "csi.meshvol.io"

	// FieldManagerController and FieldManagerAgent are the server-side apply field
	// managers. Each owns only the fields docs/contract.md assigns to it.
	FieldManagerController = "meshvol-controller"
	FieldManagerAgent      = "meshvol-agent"
	// FieldManagerCSI writes RV and RVA specs on behalf of the CSI controller service.
	FieldManagerCSI = "meshvol-csi"
)

// Finalizers.
const (
	// FinalizerController is on every RV and RVA: the controller removes it from an RV
	// once every replica has left the datamesh and its RVR and Secret are gone, and
	// from an RVA once its Detach has been confirmed.
	FinalizerController = "storage.meshvol.io/controller"
	// FinalizerAgent is on every RVR, added by the controller at creation and removed
	// by the agent of spec.nodeName after it has taken DRBD down and deleted the
	// backing volume. For a node that is gone for good, the controller removes it
	// once the replica has been force-removed from the datamesh (docs/contract.md).
	FinalizerAgent = "storage.meshvol.io/agent"
)

// Labels the controller and CSI service put on the objects they create, so the
// others can select them from informer caches.
const (
	// LabelVolume names the RV an RVR or RVA belongs to.
	LabelVolume = "storage.meshvol.io/volume"
	// LabelNode names the node of an RVR or RVA.
	LabelNode = "storage.meshvol.io/node"

	// LabelCordon on a Node (any value but "false") keeps placement from putting
	// new replicas there; existing replicas stay.
	LabelCordon = "storage.meshvol.io/cordon"

	// LabelZone is the standard topology label placement and the agent read.
	LabelZone = "topology.kubernetes.io/zone"
	// TopologyKeyNode is the CSI topology key of a node (NodeGetInfo,
	// accessible_topology).
	TopologyKeyNode = "topology.meshvol.io/node"
)

// The CSI controller service's marks on the RVs it creates.
const (
	// AnnotationCSIVolumeName holds the CreateVolume name when it is not itself a valid
	// RV name (a DNS label of at most 63 characters): the RV is then named
	// CSIVolumeNamePrefix + a hash of it, and the annotation lets a retry find the RV and
	// tell a hash collision from the same request.
	AnnotationCSIVolumeName = "storage.meshvol.io/csi-volume-name"
	CSIVolumeNamePrefix     = "csi-"

	// CSIParameterStorageClass is the one CreateVolume parameter the CSI controller
	// service takes (from the StorageClass): the ReplicatedStorageClass of the volume.
	CSIParameterStorageClass = "replicatedStorageClassName"
)

// The agent's Lease and the node facts it carries. One Lease per node, named
// AgentLeasePrefix+<node> in the controller's namespace, holderIdentity = node name.
// Facts ride on its annotations so they cost no writes of their own: the agent
// changes an annotation only when the fact changes, in the same update as a renewal.
const (
	AgentLeasePrefix = "meshvol-node-"

	// AnnotationAddresses: the node's DRBD replication addresses, comma-separated
	// (IPv4 and/or IPv6, no ports).
	AnnotationAddresses = "storage.meshvol.io/addresses"
	// AnnotationZone: the node's zone as the agent sees it (from its Node's
	// topology.kubernetes.io/zone label or a flag).
	AnnotationZone = "storage.meshvol.io/zone"
	// AnnotationHMACAlgorithms: the cram-hmac-alg values the node's kernel offers,
	// comma-separated, in the kernel's order (the controller picks one every node
	// of the pool offers: docs/controller.md, "Allocation and the shared secret").
	AnnotationHMACAlgorithms = "storage.meshvol.io/hmac-algorithms"
	// AnnotationVerifyAlgorithms: the verify-alg values the node's kernel offers.
	AnnotationVerifyAlgorithms = "storage.meshvol.io/verify-algorithms"
	// AnnotationPoolCapacityPrefix + <pool name>: "total=<bytes>,free=<bytes>" for each
	// ReplicatedStoragePool the node serves. Written only when free space moved by at
	// least 1% of total or 1 GiB, whichever is smaller, or a volume was created or
	// deleted.
	AnnotationPoolCapacityPrefix = "capacity.storage.meshvol.io/"
	// AnnotationAgentVersion: the agent's build version.
	AnnotationAgentVersion = "storage.meshvol.io/agent-version"
	// AnnotationCapabilities: what the agent understands of what the controller
	// publishes and of how the controller deletes, comma-separated
	// (CapabilityDerivedSharedSecret, CapabilityTearDownWithVolume), for the controller to
	// rely on it only once the agent concerned does (docs/contract.md, "The shared secret",
	// "Deleting a volume").
	// It counts only beside AnnotationCapabilitiesAgentVersion equal to
	// AnnotationAgentVersion: an agent renews its Lease keeping the annotations it does
	// not know, so an earlier agent that replaced a newer one (a rollback) would
	// carry the newer one's announcement; it rewrites its version, which voids it.
	AnnotationCapabilities = "storage.meshvol.io/capabilities"
	// AnnotationCapabilitiesAgentVersion: the agent version that wrote
	// AnnotationCapabilities.
	AnnotationCapabilitiesAgentVersion = "storage.meshvol.io/capabilities-agent-version"
	// AnnotationPrerequisites: empty when every node prerequisite check passed
	// (pkg/nodecheck), else the failed findings, "; "-separated. The controller
	// reports such a node not ready in the pool's eligible nodes, with the message.
	AnnotationPrerequisites = "storage.meshvol.io/prerequisites"
)

// The controller's own liveness verdict on an RVR. The agent owns DRBDConfigured;
// the controller owns AgentReady (written by server-side apply with field manager
// meshvol-controller into status.conditions, whose list is keyed by type, so the two
// managers never share a field). The engine reads AgentReady=False as "this replica's
// reports are stale".
const (
	ConditionAgentReady = "AgentReady"

	// ReasonAgentLeaseValid: the node's agent Lease is being renewed.
	ReasonAgentLeaseValid = "LeaseValid"
	// ReasonAgentLeaseExpired: the Lease expired more than the grace period ago.
	ReasonAgentLeaseExpired = "LeaseExpired"
	// ReasonAgentLeaseMissing: no Lease exists for the node.
	ReasonAgentLeaseMissing = "LeaseMissing"
)

// ReplicaName is the name of a volume's RVR on a node, and AttachmentName that of its
// RVA there: both <rv>-<node> (docs/contract.md "Objects, names, writers"). One replica
// and one attachment of a volume per node, ever, so the name is the key; readers that
// only need to find them select by LabelVolume and LabelNode instead.
func ReplicaName(rv, node string) string { return nodeScopedName(rv, node) }

// AttachmentName: see ReplicaName.
func AttachmentName(rv, node string) string { return nodeScopedName(rv, node) }

func nodeScopedName(rv, node string) string { return rv + "-" + node }

// DRBDMaxPeers is the number of peer bitmap slots the agent gives DRBD's internal
// metadata at create-md. Every size that crosses a component depends on it: the agent
// sizes a backing volume as drbd.BackingBytes(size, DRBDMaxPeers), and the CSI service
// answers capacity and growth questions with the same count. A slot is needed for every
// diskful peer a replica will ever have at once: the largest layout is 5D, and a
// replacement or a shadow replica adds one or two while it syncs. DRBD cannot grow the
// slots of internal metadata in place, so the count is generous; each slot costs one
// bit per 4 KiB (32 KiB per GiB).
const DRBDMaxPeers = 7

// PoolCapacity is the value of one AnnotationPoolCapacityPrefix+<pool> annotation on an
// agent Lease: the pool's total and free bytes on the node.
type PoolCapacity struct {
	Total, Free int64
}

// String is the annotation value, "total=<bytes>,free=<bytes>", which
// ParsePoolCapacity reads.
func (c PoolCapacity) String() string {
	return "total=" + strconv.FormatInt(c.Total, 10) + ",free=" + strconv.FormatInt(c.Free, 10)
}

// ParsePoolCapacity reads a capacity annotation value. It is strict about what it
// uses: both keys, once each, each a non-negative number of bytes, since a value it
// guessed at would place replicas on a node without room for them. It skips keys it
// does not know, so that a newer agent may add one without an older controller
// losing the node's capacity.
func ParsePoolCapacity(s string) (PoolCapacity, error) {
	var c PoolCapacity
	var haveTotal, haveFree bool
	for _, part := range strings.Split(s, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok {
			return c, fmt.Errorf("capacity %q: %q is not key=value", s, part)
		}
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n < 0 {
			return c, fmt.Errorf("capacity %q: %s must be a non-negative number of bytes", s, k)
		}
		switch {
		case (k == "total" && haveTotal) || (k == "free" && haveFree):
			return c, fmt.Errorf("capacity %q: %s given twice", s, k)
		case k == "total":
			c.Total, haveTotal = n, true
		case k == "free":
			c.Free, haveFree = n, true
		}
	}
	if !haveTotal || !haveFree {
		return c, fmt.Errorf("capacity %q: needs total= and free=", s)
	}
	return c, nil
}

// Conditions the controller writes on an RV (status.conditions, field manager
// meshvol-controller). The CSI controller service reads Ready's message and waits on
// Formed; docs/contract.md says what each means.
const (
	// ConditionConfigured: the configuration source (class or manual) and its pool resolve.
	ConditionConfigured = "Configured"
	// ConditionScheduled: placement found nodes for every replica the engine wants.
	ConditionScheduled = "Scheduled"
	// ConditionAllocated: the volume has its DRBD port, minor and shared Secret.
	ConditionAllocated = "Allocated"
	// ConditionReady: the phase (as the reason), with a message naming the replicas and why.
	ConditionReady = "Ready"
	// ConditionDeleting: what the deletion of the volume waits for.
	ConditionDeleting = "Deleting"
	// ConditionFormed: the volume's first datamesh is in place (a published revision with
	// members, and no Formation transition in flight), reason ReasonFormed; while it is
	// not, the reason is the phase and the message what formation waits for. The CSI
	// controller service answers CreateVolume once it is True.
	ConditionFormed = "Formed"
	ReasonFormed    = "Formed"
	// ReasonMinorsExhausted: Allocated=False because every DRBD minor of the controller's
	// range is held by another volume — each volume holds one, unique across the
	// cluster, so a range of K minors holds at most K volumes (docs/controller.md,
	// "Allocation and the shared secret"). The CSI controller service answers
	// CreateVolume with RESOURCE_EXHAUSTED then. ReasonPortsExhausted was the same for
	// a port unique across the cluster; a port is now unique per node, a node whose
	// range is full takes no new replica (a placement constraint), and the CSI service
	// still treats the reason as exhausted for a controller of an earlier version.
	ReasonPortsExhausted  = "PortsExhausted"
	ReasonMinorsExhausted = "MinorsExhausted"
)

// ConditionAttached is the controller's condition on an RVA: True once the volume is
// attached on the RVA's node, with the engine's message while it is not.
const ConditionAttached = "Attached"

// The agent's condition on an RVR (besides DRBDConfigured): whether DRBD's role is the
// one the datamesh asks for (Primary when the member is attached, else Secondary).
const (
	ConditionDRBDRole = "DRBDRole"

	ReasonPrimary       = "Primary"
	ReasonSecondary     = "Secondary"
	ReasonPromoteFailed = "PromoteFailed"
	// ReasonPromoteNoQuorum: DRBD refused the promotion because the replica has no
	// quorum (state change error -25). The engine withdraws such an Attach
	// (docs/datamesh.md, "An Attach its member cannot promote").
	ReasonPromoteNoQuorum = "PromoteNoQuorum"
	// ReasonDemoteRefused: the device is held open (mounted); the agent retries
	// and never forces a demotion.
	ReasonDemoteRefused = "DemoteRefused"
)

// CapabilityDerivedSharedSecret, in AnnotationCapabilities: the agent derives a
// volume's shared secret from the cluster key when the volume's reference says
// derivation HMAC-SHA256. The controller derives a new volume's secret only while every
// agent announces it; otherwise the volume gets a Secret of its own (docs/controller.md,
// "Allocation and the shared secret"), since an agent that does not know derivation
// would configure the volume with a wrong secret.
const CapabilityDerivedSharedSecret = "derived-shared-secret"

// CapabilityTearDownWithVolume, in AnnotationCapabilities: the agent takes its replicas
// of a volume that goes (deleted, nothing attached, no Attach or Detach in flight) down
// on the volume's deletion mark and releases their finalizers before they are deleted.
// The controller then deletes such a node's replicas once released, each by a deletion
// that ends it at once, rather than first marking them deleted for the agent to act on
// (docs/contract.md, "Deleting a volume"); an agent that does not announce it gets its
// replicas deleted at once, as it expects.
const CapabilityTearDownWithVolume = "teardown-with-volume"

// SecretKeySharedSecret is the key of the per-volume Secret holding DRBD's shared
// secret (32 random bytes, base64 in the Secret's data as usual). Volumes formed
// before the cluster key, or while some agent did not announce
// CapabilityDerivedSharedSecret, have such a Secret; the others derive theirs from the
// key.
const SecretKeySharedSecret = "secret"

// SecretDRBDKey is the Secret, in the controller's namespace, that holds the cluster
// key every newer volume's DRBD shared secret is derived from (docs/contract.md, "The
// shared secret"), under SecretKeyDRBDKey. The controller creates it when absent and no
// volume uses a key yet; nothing rotates it. Back it up: a volume's secret can be
// derived only from the key it was formed with.
const (
	SecretDRBDKey    = "meshvol-drbd-key"
	SecretKeyDRBDKey = "key"
)
