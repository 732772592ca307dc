package v1alpha1

// SnapshotUnsupported says why volumes of a pool of type t cannot be
// snapshotted, or "" if they can. The CSI controller refuses CreateSnapshot
// with it and the controller fails a snapshot object with it, so both say the
// same (docs/snapshots.md, "Pools").
func SnapshotUnsupported(t PoolType) string {
	switch t {
	case PoolTypeFile:
		return ""
	case PoolTypeLVM:
		return "which cannot snapshot (thick logical volumes): use a File pool"
	case PoolTypeLVMThin:
		return "whose snapshots cannot be restored yet (a volume created from a thin snapshot is not built): use a File pool"
	default:
		return "which meshvol does not know how to snapshot"
	}
}
