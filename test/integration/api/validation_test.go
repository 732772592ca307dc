package api

import (
	"testing"

	"github.com/meshvol/meshvol/internal/testenv"
)

// A badCase is one object the apiserver must refuse, with the field and the message it
// must refuse it with. When before is set, it is applied first (and must be accepted):
// bad is then an update of it, which is how the transition rules (immutability, no
// shrinking) get their oldSelf. When status is set, bad goes to the status subresource.
type badCase struct {
	name   string
	before string
	bad    string
	status bool
	// create sends bad with a plain create instead of server-side apply. Server-side
	// apply refuses duplicate keys of a set or map list before validation runs, with a
	// 500 "failed to create typed patch object"; kubectl create and controllers' Create
	// reach the schema's own duplicate check, which is what these cases prove.
	create bool
	field  string // the cause's field path, as the apiserver names it
	msg    string // a substring of the cause's message
}

// Bases the cases start from. Each case spells out its whole object, so a reader sees
// exactly what is refused without chasing a mutation function.
const (
	rscOK = `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec:
  storagePool: pool-a
  failuresToTolerate: 1
  guaranteedMinimumDataRedundancy: 1
`
	rspLVMOK = `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups:
  - {nodeName: node-1, name: vg-data}
`
	rvOK = `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 10Gi
  replicatedStorageClassName: rsc-3d
`
	rvrOK = `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
  type: Diskful
  storage: {pool: pool-a, volumeGroup: vg-data}
`
	rvrUnplaced = `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  type: Diskful
`
	rvaOK = `
kind: ReplicatedVolumeAttachment
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
`
)

// Messages of the OpenAPI rules, as the apiserver words them.
const (
	atMost2   = "should be less than or equal to 2"
	atLeast0  = "should be greater than or equal to 0"
	layoutMsg = "failuresToTolerate must be at most guaranteedMinimumDataRedundancy + 1: the allowed layouts are 1D, 2D, 3D, 2D+1TB, 4D, 4D+1TB and 5D"
	zonesMsg  = "zones must be empty when topology is Ignored"
	// transZonalZonesMsg: layout.MinZones, docs/layouts.md §7.
	transZonalZonesMsg = "TransZonal must be able to lose any one zone: failuresToTolerate 1 or 2 needs at least 3 zones, and 1 with guaranteedMinimumDataRedundancy 2 (4D) needs 4 (over 3 zones, one zone holds 2 of the 4 Diskful replicas and losing it leaves 2 copies, not 3)"
	// rootField is how the apiserver names the field of a rule on the whole object
	// (the only place a rule can see metadata.name): a CRD rule's fieldPath cannot
	// point into metadata, so the cause carries no field.
	rootField     = "<nil>"
	nodeNameRegex = `should match '^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'`
)

var badCases = []badCase{
	// ---- ReplicatedStorageClass ----
	{
		name: "rsc/ftt above 2",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 3, guaranteedMinimumDataRedundancy: 2}
`,
		field: "spec.failuresToTolerate", msg: atMost2,
	},
	{
		name: "rsc/gmdr negative",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 0, guaranteedMinimumDataRedundancy: -1}
`,
		field: "spec.guaranteedMinimumDataRedundancy", msg: atLeast0,
	},
	{
		name: "rsc/gmdr above 2",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 3}
`,
		field: "spec.guaranteedMinimumDataRedundancy", msg: atMost2,
	},
	{
		// FTT 2 with GMDR 0 would be 3D tolerating two failures: one survivor cannot
		// hold quorum, so no layout provides it.
		name: "rsc/ftt 2 gmdr 0",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 2, guaranteedMinimumDataRedundancy: 0}
`,
		field: "spec", msg: layoutMsg,
	},
	{
		name: "rsc/legacy replication together with ftt",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: Availability, failuresToTolerate: 1}
`,
		field: "spec", msg: "replication is the legacy form of failuresToTolerate and guaranteedMinimumDataRedundancy: set either replication or both of those, not both forms",
	},
	{
		name: "rsc/legacy replication together with gmdr",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: Consistency, guaranteedMinimumDataRedundancy: 1}
`,
		field: "spec", msg: "replication is the legacy form",
	},
	{
		name: "rsc/neither replication nor ftt+gmdr",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a}
`,
		field: "spec", msg: "set replication, or both failuresToTolerate and guaranteedMinimumDataRedundancy",
	},
	{
		name: "rsc/ftt without gmdr",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 1}
`,
		field: "spec", msg: "set replication, or both failuresToTolerate and guaranteedMinimumDataRedundancy",
	},
	{
		name: "rsc/zones with topology Ignored",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, topology: Ignored, zones: [zone-a]}
`,
		field: "spec", msg: zonesMsg,
	},
	{
		// The default topology is Ignored and defaults apply before validation, so
		// zones without a topology are refused too: the user must say TransZonal or Zonal.
		name: "rsc/zones with topology defaulted to Ignored",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, zones: [zone-a]}
`,
		field: "spec", msg: zonesMsg,
	},
	{
		// 4D over exactly three zones cannot survive a zone loss (docs/layouts.md §7).
		name: "rsc/TransZonal 4D over three zones",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 2, topology: TransZonal, zones: [a, b, c]}
`,
		create: true,
		field:  "spec", msg: transZonalZonesMsg,
	},
	{
		name: "rsc/TransZonal Availability over two zones",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: Availability, topology: TransZonal, zones: [a, b]}
`,
		create: true,
		field:  "spec", msg: transZonalZonesMsg,
	},
	{
		name: "rv/manual TransZonal 4D over three zones",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 10Gi
  configurationMode: Manual
  manualConfiguration: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 2, topology: TransZonal, zones: [a, b, c]}
`,
		create: true,
		field:  "spec.manualConfiguration", msg: transZonalZonesMsg,
	},
	{
		name: "rv/quorumOverride without values",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d, quorumOverride: {reason: "lost two nodes"}}
`,
		create: true,
		field:  "spec.quorumOverride", msg: "quorumOverride must set quorum, quorumMinimumRedundancy or both",
	},
	{
		name: "rv/quorumOverride without a reason",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d, quorumOverride: {quorum: 1, reason: ""}}
`,
		create: true,
		field:  "spec.quorumOverride.reason", msg: "should be at least 1 chars long",
	},
	{
		name:   "rsc/storagePool immutable",
		before: rscOK,
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-b, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 1}
`,
		field: "spec", msg: "storagePool is immutable: volumes cannot move between pools",
	},
	{
		name: "rsc/storagePool empty",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: "", replication: None}
`,
		field: "spec.storagePool", msg: "should be at least 1 chars long",
	},
	{
		name: "rsc/topology enum",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, topology: Regional}
`,
		field: "spec.topology", msg: `Unsupported value: "Regional": supported values: "Zonal", "TransZonal", "Ignored"`,
	},
	{
		name: "rsc/replication enum",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: Full}
`,
		field: "spec.replication", msg: `Unsupported value: "Full": supported values: "None", "Availability", "Consistency", "ConsistencyAndAvailability"`,
	},
	{
		name: "rsc/volumeAccess enum",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, volumeAccess: Remote}
`,
		field: "spec.volumeAccess", msg: `Unsupported value: "Remote": supported values: "Local", "EventuallyLocal", "PreferablyLocal", "Any"`,
	},
	{
		name: "rsc/reclaimPolicy enum",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, reclaimPolicy: Recycle}
`,
		field: "spec.reclaimPolicy", msg: `Unsupported value: "Recycle": supported values: "Delete", "Retain"`,
	},
	{
		name: "rsc/zones duplicate",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, topology: TransZonal, zones: [zone-a, zone-a]}
`,
		create: true,
		field:  "spec.zones[1]", msg: `Duplicate value: "zone-a"`,
	},
	{
		name: "rsc/drbdOptions onNoQuorum enum",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, drbdOptions: {onNoQuorum: freeze}}
`,
		field: "spec.drbdOptions.onNoQuorum", msg: `Unsupported value: "freeze": supported values: "io-error", "suspend-io"`,
	},
	{
		name: "rsc/drbdOptions resync rate below minimum",
		bad: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, drbdOptions: {resyncMaxRateKiB: 100}}
`,
		field: "spec.drbdOptions.resyncMaxRateKiB", msg: "should be greater than or equal to 250",
	},

	// ---- ReplicatedStoragePool ----
	{
		name: "rsp/LVM without volumeGroups",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec: {type: LVM}
`,
		field: "spec", msg: "volumeGroups must list at least one node's volume group when type is LVM or LVMThin",
	},
	{
		name: "rsp/LVMThin without thinPool",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVMThin
  volumeGroups:
  - {nodeName: node-1, name: vg-data, thinPool: thin}
  - {nodeName: node-2, name: vg-data}
`,
		field: "spec", msg: "every volumeGroups entry needs thinPool when type is LVMThin",
	},
	{
		name: "rsp/LVMThin without volumeGroups",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec: {type: LVMThin}
`,
		field: "spec", msg: "volumeGroups must list at least one node's volume group when type is LVM or LVMThin",
	},
	{
		name: "rsp/LVM with thinPool",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups:
  - {nodeName: node-1, name: vg-data, thinPool: thin}
`,
		field: "spec", msg: "thinPool must be empty when type is LVM",
	},
	{
		name: "rsp/File without file",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec: {type: File}
`,
		field: "spec", msg: "file.directory is required when type is File",
	},
	{
		name: "rsp/LVM with file",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups: [{nodeName: node-1, name: vg-data}]
  file: {directory: /var/lib/meshvol}
`,
		field: "spec", msg: "file must be empty unless type is File",
	},
	{
		name:   "rsp/type immutable",
		before: rspLVMOK,
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVMThin
  volumeGroups:
  - {nodeName: node-1, name: vg-data, thinPool: thin}
`,
		field: "spec", msg: "type is immutable",
	},
	{
		name: "rsp/type enum",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec: {type: ZFS, file: {directory: /tank}}
`,
		field: "spec.type", msg: `Unsupported value: "ZFS": supported values: "LVM", "LVMThin", "File"`,
	},
	{
		name: "rsp/file directory relative",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec: {type: File, file: {directory: var/lib/meshvol}}
`,
		field: "spec.file.directory", msg: "should match '^/.*'",
	},
	{
		name: "rsp/volume group name with a slash",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups: [{nodeName: node-1, name: vg/data}]
`,
		field: "spec.volumeGroups[0].name", msg: "should match '^[A-Za-z0-9+_.][A-Za-z0-9+_.-]*$'",
	},
	{
		name: "rsp/volume group nodeName not a DNS subdomain",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups: [{nodeName: Worker-1, name: vg-data}]
`,
		field: "spec.volumeGroups[0].nodeName", msg: nodeNameRegex,
	},
	{
		name: "rsp/two volume groups for one node",
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups:
  - {nodeName: node-1, name: vg-a}
  - {nodeName: node-1, name: vg-b}
`,
		create: true,
		field:  "spec.volumeGroups[1]", msg: `Duplicate value: map[string]interface {}{"nodeName":"node-1"}`,
	},

	// ---- ReplicatedVolume ----
	{
		name: "rv/Manual without manualConfiguration",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, configurationMode: Manual}
`,
		field: "spec", msg: "manualConfiguration is required when configurationMode is Manual",
	},
	{
		name: "rv/Auto without class",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, configurationMode: Auto}
`,
		field: "spec", msg: "replicatedStorageClassName is required when configurationMode is Auto",
	},
	{
		name: "rv/Auto with empty class",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: ""}
`,
		field: "spec", msg: "replicatedStorageClassName is required when configurationMode is Auto",
	},
	{
		name: "rv/Auto with manualConfiguration",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 10Gi
  configurationMode: Auto
  replicatedStorageClassName: rsc-3d
  manualConfiguration: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 1}
`,
		field: "spec", msg: "manualConfiguration must be empty when configurationMode is Auto",
	},
	{
		name:   "rv/size shrink",
		before: rvOK,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 9Gi, replicatedStorageClassName: rsc-3d}
`,
		field: "spec", msg: "size may not shrink: a volume can only grow",
	},
	{
		// 10Gi written as 10737418239 bytes is one byte less: the comparison is by
		// value, not by spelling.
		name:   "rv/size shrink by one byte in another unit",
		before: rvOK,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: "10737418239", replicatedStorageClassName: rsc-3d}
`,
		field: "spec", msg: "size may not shrink: a volume can only grow",
	},
	{
		name: "rv/size zero",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: "0", replicatedStorageClassName: rsc-3d}
`,
		field: "spec.size", msg: "size must be greater than zero",
	},
	{
		name: "rv/size negative",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: -1Gi, replicatedStorageClassName: rsc-3d}
`,
		field: "spec.size", msg: "size must be greater than zero",
	},
	{
		name: "rv/size not a quantity",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: ten-gigs, replicatedStorageClassName: rsc-3d}
`,
		field: "spec.size", msg: "should match",
	},
	{
		name: "rv/name with a dot",
		bad: `
kind: ReplicatedVolume
metadata: {name: pvc.one}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d}
`,
		field: rootField, msg: "metadata.name must be a DNS label of at most 63 characters (it becomes the DRBD resource name)",
	},
	{
		name: "rv/name of 64 characters",
		bad: `
kind: ReplicatedVolume
metadata: {name: pvc-0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d}
`,
		field: rootField, msg: "metadata.name must be a DNS label of at most 63 characters",
	},
	{
		name: "rv/maxAttachments 3",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d, maxAttachments: 3}
`,
		field: "spec.maxAttachments", msg: atMost2,
	},
	{
		name: "rv/maxAttachments 0",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d, maxAttachments: 0}
`,
		field: "spec.maxAttachments", msg: "should be greater than or equal to 1",
	},
	{
		name: "rv/configurationMode enum",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d, configurationMode: Inherit}
`,
		field: "spec.configurationMode", msg: `Unsupported value: "Inherit": supported values: "Auto", "Manual"`,
	},
	{
		name: "rv/manualConfiguration ftt 2 gmdr 0",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 10Gi
  configurationMode: Manual
  manualConfiguration: {storagePool: pool-a, failuresToTolerate: 2, guaranteedMinimumDataRedundancy: 0}
`,
		field: "spec.manualConfiguration", msg: layoutMsg,
	},
	{
		name: "rv/manualConfiguration zones with topology Ignored",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 10Gi
  configurationMode: Manual
  manualConfiguration: {storagePool: pool-a, failuresToTolerate: 0, guaranteedMinimumDataRedundancy: 0, zones: [zone-a]}
`,
		field: "spec.manualConfiguration", msg: zonesMsg,
	},
	{
		name: "rv/manualConfiguration without storagePool",
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 10Gi
  configurationMode: Manual
  manualConfiguration: {failuresToTolerate: 0, guaranteedMinimumDataRedundancy: 0}
`,
		field: "spec.manualConfiguration.storagePool", msg: "Required value",
	},

	// ---- ReplicatedVolumeReplica ----
	{
		name:   "rvr/nodeName change after set",
		before: rvrOK,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-2
  type: Diskful
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
		field: "spec", msg: "nodeName is immutable once set",
	},
	{
		// Dropping nodeName is a change too, and must be refused with the rule's own
		// message rather than a CEL "no such key" error.
		name:   "rvr/nodeName removed after set",
		before: rvrOK,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  type: Diskful
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
		field: "spec", msg: "nodeName is immutable once set",
	},
	{
		name:   "rvr/replicatedVolumeName change",
		before: rvrOK,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-2
  nodeName: node-1
  type: Diskful
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
		field: "spec", msg: "replicatedVolumeName is immutable",
	},
	{
		name: "rvr/Access with storage",
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
  type: Access
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
		field: "spec", msg: "storage must be empty for diskless types Access and TieBreaker",
	},
	{
		// A retype keeps the storage the replica had; it never moves it.
		name:   "rvr/retyped to Access with another storage",
		before: rvrOK,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
  type: Access
  storage: {pool: pool-a, volumeGroup: vg-other}
`,
		field: "spec", msg: "storage must be empty for diskless types Access and TieBreaker",
	},
	{
		name: "rvr/Access gains storage",
		before: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-1, nodeName: node-1, type: Access}
`,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
  type: Access
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
		field: "spec", msg: "storage must be empty for diskless types Access and TieBreaker",
	},
	{
		name: "rvr/TieBreaker with storage",
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
  type: TieBreaker
  storage: {pool: pool-a}
`,
		field: "spec", msg: "storage must be empty for diskless types Access and TieBreaker",
	},
	{
		name: "rvr/nodeName not a DNS subdomain",
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-1, nodeName: Node_1, type: Access}
`,
		field: "spec.nodeName", msg: "should match '^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'",
	},
	{
		name: "rvr/type enum",
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-1, nodeName: node-1, type: Witness}
`,
		field: "spec.type", msg: `Unsupported value: "Witness": supported values: "Diskful", "Access", "TieBreaker", "ShadowDiskful"`,
	},
	{
		name: "rvr/replicatedVolumeName longer than a DNS label",
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-0123456789abcdef0123456789abcdef0123456789abcdef0123456789ab, type: Access}
`,
		field: "spec.replicatedVolumeName", msg: "may not be more than 63 bytes",
	},

	// ---- ReplicatedVolumeAttachment ----
	{
		name:   "rva/spec change",
		before: rvaOK,
		bad: `
kind: ReplicatedVolumeAttachment
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-1, nodeName: node-2}
`,
		field: "spec", msg: "spec is immutable: create a new attachment instead",
	},
	{
		name: "rva/nodeName not a DNS subdomain",
		bad: `
kind: ReplicatedVolumeAttachment
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-1, nodeName: node-1.}
`,
		field: "spec.nodeName", msg: nodeNameRegex,
	},
	{
		name: "rva/replicatedVolumeName empty",
		bad: `
kind: ReplicatedVolumeAttachment
metadata: {name: $NAME}
spec: {replicatedVolumeName: "", nodeName: node-1}
`,
		field: "spec.replicatedVolumeName", msg: "should be at least 1 chars long",
	},

	// ---- status halves: the controller's and the agent's writes are validated too ----
	{
		name:   "rv status/member nodeID beyond DRBD's 31",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    members: [{name: $NAME-0, type: Diskful, nodeName: node-1, nodeID: 32}]
`,
		field: "status.datamesh.members[0].nodeID", msg: "should be less than or equal to 31",
	},
	{
		name:   "rv status/member type enum",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    members: [{name: $NAME-0, type: Diskless, nodeName: node-1, nodeID: 0}]
`,
		field: "status.datamesh.members[0].type", msg: `Unsupported value: "Diskless"`,
	},
	{
		name:   "rv status/transition planVersion 0",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datameshTransitions:
  - {type: Formation, group: Formation, planID: formation, planVersion: 0, steps: []}
`,
		field: "status.datameshTransitions[0].planVersion", msg: "should be greater than or equal to 1",
	},
	{
		// The agent finds its members by node name: a name no node can have must be
		// refused where it is written, not discovered as a replica that never starts.
		name:   "rv status/member nodeName not a DNS subdomain",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    members: [{name: $NAME-0, type: Diskful, nodeName: Node_1, nodeID: 0}]
`,
		field: "status.datamesh.members[0].nodeName", msg: nodeNameRegex,
	},
	{
		name:   "rv status/shared secret key empty",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    sharedSecret: {secretName: meshvol-drbd, key: "", algorithm: sha256}
`,
		field: "status.datamesh.sharedSecret.key", msg: "should be at least 1 chars long",
	},
	{
		name:   "rv status/shared secret algorithm enum",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    sharedSecret: {secretName: meshvol-drbd, algorithm: crc32c}
`,
		field: "status.datamesh.sharedSecret.algorithm", msg: `Unsupported value: "crc32c": supported values: "sha256", "sha1", "md5"`,
	},
	{
		name:   "rv status/shared secret derived without the key's fingerprint",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    sharedSecret: {secretName: meshvol-drbd-key, key: key, algorithm: sha256, derivation: HMAC-SHA256}
`,
		field: "status.datamesh.sharedSecret", msg: "derivation and keyFingerprint go together",
	},
	{
		name:   "rv status/shared secret key fingerprint not 16 hex digits",
		before: rvOK,
		status: true,
		bad: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datamesh:
    sharedSecret: {secretName: meshvol-drbd-key, key: key, algorithm: sha256, derivation: HMAC-SHA256, keyFingerprint: A056D92A0EF9F0F5}
`,
		field: "status.datamesh.sharedSecret.keyFingerprint", msg: "should match '^[0-9a-f]{16}$'",
	},
	{
		name:   "rsp status/eligible nodeName not a DNS subdomain",
		before: rspLVMOK,
		status: true,
		bad: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
status:
  eligibleNodes: [{nodeName: "node 1", ready: true}]
`,
		field: "status.eligibleNodes[0].nodeName", msg: nodeNameRegex,
	},
	{
		name:   "rvr status/diskState enum",
		before: rvrOK,
		status: true,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status: {diskState: Healthy}
`,
		field: "status.diskState", msg: `Unsupported value: "Healthy"`,
	},
	{
		name:   "rvr status/resync percent above 100",
		before: rvrOK,
		status: true,
		bad: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status:
  peers:
  - {name: peer, connectionState: Connected, resync: {percentDone: 101, outOfSyncBytes: 0}}
`,
		field: "status.peers[0].resync.percentDone", msg: "should be less than or equal to 100",
	},
}

// TestValidationRefuses applies every bad object of the table and checks that the
// apiserver refuses it with the expected field and message.
func TestValidationRefuses(t *testing.T) {
	if len(badCases) < 15 {
		t.Fatalf("the table has %d bad objects; the API needs at least 15 to be covered", len(badCases))
	}
	seen := map[string]bool{}
	for _, tc := range badCases {
		if seen[tc.name] {
			t.Fatalf("duplicate case name %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			name := testenv.Name(t)
			if tc.before != "" {
				mustApply(t, fromYAML(t, tc.before, name), managerUser)
			}
			bad := fromYAML(t, tc.bad, name)
			var err error
			switch {
			case tc.status:
				err = applyStatus(ctx(t), bad, managerController)
			case tc.create:
				cleanup(t, bad)
				err = env.Client.Create(ctx(t), bad)
			default:
				cleanup(t, bad) // in case the rule does not hold and the object is created
				err = apply(ctx(t), bad, managerUser)
			}
			if problem := invalidCause(err, tc.field, tc.msg); problem != "" {
				t.Errorf("%s\nobject:%s", problem, tc.bad)
			}
		})
	}
}

// A goodCase is a legal object, or a legal change (from before to after), next to a
// rule that forbids a similar one: it proves the rule is no wider than it should be (an
// immutability rule that also blocks the first set is as broken as one that blocks
// nothing, and a layout rule must admit the layouts at its edge).
type goodCase struct {
	name          string
	before, after string
}

var goodCases = []goodCase{
	{
		name: "rsc/ftt 0 gmdr 0 (1D)",
		after: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 0, guaranteedMinimumDataRedundancy: 0}
`,
	},
	{
		name: "rsc/ftt 1 gmdr 0 (2D+1TB), ftt one above gmdr",
		after: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 0}
`,
	},
	{
		name: "rsc/ftt 2 gmdr 1 (4D+1TB)",
		after: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 2, guaranteedMinimumDataRedundancy: 1}
`,
	},
	{
		name: "rsc/ftt 2 gmdr 2 (5D)",
		after: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 2, guaranteedMinimumDataRedundancy: 2}
`,
	},
	{
		// An empty list is no zones: templating tools render an unset list as [].
		name: "rsc/empty zones with topology Ignored",
		after: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: None, topology: Ignored, zones: []}
`,
	},
	{
		name: "rv/manualConfiguration with empty zones and topology Ignored",
		after: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec:
  size: 1Gi
  configurationMode: Manual
  manualConfiguration: {storagePool: pool-a, failuresToTolerate: 0, guaranteedMinimumDataRedundancy: 0, zones: []}
`,
	},
	{
		// YAML reads an unquoted number as an integer, and the schema admits one
		// (int-or-string, like every Kubernetes quantity).
		name: "rv/size in bytes as a YAML integer",
		after: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 1073741824, replicatedStorageClassName: rsc-3d}
`,
	},
	{
		name:   "rv/size grows, given in bytes as a YAML integer",
		before: rvOK,
		after: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 21474836480, replicatedStorageClassName: rsc-3d}
`,
	},
	{
		name: "rv/name of exactly 63 characters",
		after: `
kind: ReplicatedVolume
metadata: {name: pvc-0123456789abcdef0123456789abcdef0123456789abcdef0123456789a}
spec: {size: 1Gi, replicatedStorageClassName: rsc-3d}
`,
	},
	{
		name:  "rvr/not placed yet",
		after: rvrUnplaced,
	},
	{
		name:   "rv/size grows",
		before: rvOK,
		after: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 20Gi, replicatedStorageClassName: rsc-3d}
`,
	},
	{
		name:   "rv/size respelled with the same value",
		before: rvOK,
		after: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: "10737418240", replicatedStorageClassName: rsc-3d}
`,
	},
	{
		name:   "rv/maxAttachments raised for a live migration",
		before: rvOK,
		after: `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d, maxAttachments: 2}
`,
	},
	{
		name:   "rvr/nodeName set for the first time by placement",
		before: rvrUnplaced,
		after: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-3
  type: Diskful
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
	},
	{
		name:   "rvr/type changes from Diskful to Access",
		before: rvrOK,
		after: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec: {replicatedVolumeName: pvc-1, nodeName: node-1, type: Access}
`,
	},
	{
		// Its member is still Diskful until the retype detaches the disk; the agent
		// needs the storage until it has freed the backing volume.
		name:   "rvr/retyped from Diskful to TieBreaker, storage kept",
		before: rvrOK,
		after: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
spec:
  replicatedVolumeName: pvc-1
  nodeName: node-1
  type: TieBreaker
  storage: {pool: pool-a, volumeGroup: vg-data}
`,
	},
	{
		name:   "rva/the same spec applied again",
		before: rvaOK,
		after:  rvaOK,
	},
	{
		name:   "rsc/protection and access change, pool kept",
		before: rscOK,
		after: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec:
  storagePool: pool-a
  replication: ConsistencyAndAvailability
  topology: TransZonal
  zones: [zone-a, zone-b, zone-c]
  volumeAccess: Local
`,
	},
	{
		name:   "rsp/a node's volume group added",
		before: rspLVMOK,
		after: `
kind: ReplicatedStoragePool
metadata: {name: $NAME}
spec:
  type: LVM
  volumeGroups:
  - {nodeName: node-1, name: vg-data}
  - {nodeName: node-2, name: vg-data}
`,
	},
}

// TestValidationAllows applies the legal objects and updates of goodCases.
func TestValidationAllows(t *testing.T) {
	for _, tc := range goodCases {
		t.Run(tc.name, func(t *testing.T) {
			name := testenv.Name(t)
			if tc.before != "" {
				mustApply(t, fromYAML(t, tc.before, name), managerUser)
			}
			after := fromYAML(t, tc.after, name)
			cleanup(t, after)
			if err := apply(ctx(t), after, managerUser); err != nil {
				t.Errorf("legal object refused: %v\nbefore:%s\nafter:%s", err, tc.before, tc.after)
			}
		})
	}
}
