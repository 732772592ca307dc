package v1alpha1

// Enumerations shared by several kinds. Their string values are API: never rename one.

// ReplicaType is the kind of replica a ReplicatedVolumeReplica asks to be. The datamesh
// member types add the liminal (transitional) states; see MemberType.
// +kubebuilder:validation:Enum=Diskful;Access;TieBreaker;ShadowDiskful
type ReplicaType string

const (
	// ReplicaTypeDiskful holds a full copy of the data and votes in quorum.
	ReplicaTypeDiskful ReplicaType = "Diskful"
	// ReplicaTypeAccess is diskless: it lets a node without a copy use the volume.
	ReplicaTypeAccess ReplicaType = "Access"
	// ReplicaTypeTieBreaker is diskless and breaks a tie between an even number of voters.
	ReplicaTypeTieBreaker ReplicaType = "TieBreaker"
	// ReplicaTypeShadowDiskful holds a full copy but does not vote. It needs a DRBD with
	// the non-voting disk option (feature ShadowDiskful).
	ReplicaTypeShadowDiskful ReplicaType = "ShadowDiskful"
)

// MemberType is the type of a datamesh member (docs/datamesh-spec.md, "States"). Liminal types are
// always transitional: the member has full-mesh connections but DRBD runs it diskless.
// +kubebuilder:validation:Enum=Diskful;LiminalDiskful;ShadowDiskful;LiminalShadowDiskful;Access;TieBreaker
type MemberType string

const (
	MemberTypeDiskful              MemberType = "Diskful"              // D
	MemberTypeLiminalDiskful       MemberType = "LiminalDiskful"       // D∅
	MemberTypeShadowDiskful        MemberType = "ShadowDiskful"        // sD
	MemberTypeLiminalShadowDiskful MemberType = "LiminalShadowDiskful" // sD∅
	MemberTypeAccess               MemberType = "Access"               // A
	MemberTypeTieBreaker           MemberType = "TieBreaker"           // TB
)

// IsVoter reports whether members of this type count toward DRBD quorum (D and D∅).
func (t MemberType) IsVoter() bool {
	return t == MemberTypeDiskful || t == MemberTypeLiminalDiskful
}

// ConnectsToAllPeers reports whether members of this type are full-mesh members (D, D∅,
// sD, sD∅): connected to every other member. A and TB are star members, connected to the
// full-mesh members only.
func (t MemberType) ConnectsToAllPeers() bool {
	switch t {
	case MemberTypeDiskful, MemberTypeLiminalDiskful, MemberTypeShadowDiskful, MemberTypeLiminalShadowDiskful:
		return true
	}
	return false
}

// HasDisk reports whether DRBD runs a member of this type with its backing disk attached.
func (t MemberType) HasDisk() bool {
	return t == MemberTypeDiskful || t == MemberTypeShadowDiskful
}

// Topology says how replicas spread over zones.
// +kubebuilder:validation:Enum=Zonal;TransZonal;Ignored
type Topology string

const (
	// TopologyZonal keeps every replica of a volume in one zone.
	TopologyZonal Topology = "Zonal"
	// TopologyTransZonal spreads replicas so that losing one zone keeps the volume
	// available and its data safe.
	TopologyTransZonal Topology = "TransZonal"
	// TopologyIgnored places replicas without regard to zones.
	TopologyIgnored Topology = "Ignored"
)

// VolumeAccess says where a volume may be attached relative to its diskful replicas.
// +kubebuilder:validation:Enum=Local;EventuallyLocal;PreferablyLocal;Any
type VolumeAccess string

const (
	// VolumeAccessLocal attaches only on a node that holds a diskful replica.
	VolumeAccessLocal VolumeAccess = "Local"
	// VolumeAccessEventuallyLocal attaches anywhere and then moves a diskful replica to
	// the attached node.
	VolumeAccessEventuallyLocal VolumeAccess = "EventuallyLocal"
	// VolumeAccessPreferablyLocal prefers nodes with a diskful replica.
	VolumeAccessPreferablyLocal VolumeAccess = "PreferablyLocal"
	// VolumeAccessAny attaches anywhere; reads and writes may go over the network.
	VolumeAccessAny VolumeAccess = "Any"
)

// Replication is the legacy protection setting of a storage class, kept for
// compatibility. It maps to FTT/GMDR (see pkg/datamesh/layout) and never appears in a
// volume's resolved configuration.
// +kubebuilder:validation:Enum=None;Availability;Consistency;ConsistencyAndAvailability
type Replication string

const (
	ReplicationNone                       Replication = "None"                       // FTT 0, GMDR 0: 1D
	ReplicationAvailability               Replication = "Availability"               // FTT 1, GMDR 0: 2D+1TB
	ReplicationConsistency                Replication = "Consistency"                // FTT 0, GMDR 1: 2D
	ReplicationConsistencyAndAvailability Replication = "ConsistencyAndAvailability" // FTT 1, GMDR 1: 3D
)

// Layout is a pair of protection levels. D count = FTT + GMDR + 1.
type Layout struct {
	// failuresToTolerate is how many nodes may fail while the volume stays writable.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	FailuresToTolerate int32 `json:"failuresToTolerate"`
	// guaranteedMinimumDataRedundancy is how many copies beyond one every acknowledged
	// write is guaranteed to have.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2
	GuaranteedMinimumDataRedundancy int32 `json:"guaranteedMinimumDataRedundancy"`
}

// DRBDOptions are DRBD settings a storage class, a volume or a replica may override.
// A nil field inherits from the broader scope (built-in defaults → storage class →
// volume → replica); any set value, including false and 0, is explicit and wins.
type DRBDOptions struct {
	// onNoQuorum is what IO does when a replica loses quorum: io-error fails it at once,
	// suspend-io freezes it until quorum returns.
	// +kubebuilder:validation:Enum=io-error;suspend-io
	// +optional
	OnNoQuorum *string `json:"onNoQuorum,omitempty"`
	// onNoDataAccessible is what IO does when no UpToDate data is reachable.
	// +kubebuilder:validation:Enum=io-error;suspend-io
	// +optional
	OnNoDataAccessible *string `json:"onNoDataAccessible,omitempty"`
	// discardZeroesIfAligned tells DRBD that aligned discards read back as zeroes.
	// +optional
	DiscardZeroesIfAligned *bool `json:"discardZeroesIfAligned,omitempty"`
	// rsDiscardGranularity (bytes) lets resync discard instead of write zeroes; 0 turns it off.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1048576
	// +optional
	RsDiscardGranularity *int32 `json:"rsDiscardGranularity,omitempty"`
	// allowRemoteRead lets a replica read from peers; false makes reads local-only.
	// +optional
	AllowRemoteRead *bool `json:"allowRemoteRead,omitempty"`
	// pingTimeoutTenthsOfSecond is DRBD's ping-timeout, in tenths of a second.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	// +optional
	PingTimeoutTenthsOfSecond *int32 `json:"pingTimeoutTenthsOfSecond,omitempty"`
	// resyncMaxRateKiB caps the dynamic resync rate (c-max-rate), in KiB/s.
	// +kubebuilder:validation:Minimum=250
	// +kubebuilder:validation:Maximum=4194304
	// +optional
	ResyncMaxRateKiB *int32 `json:"resyncMaxRateKiB,omitempty"`
}
