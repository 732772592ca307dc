package v1alpha1

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

// SecretKeySharedSecret is the key of the per-volume Secret holding DRBD's shared
// secret (32 random bytes, base64 in the Secret's data as usual).
const SecretKeySharedSecret = "secret"
