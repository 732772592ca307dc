package v1alpha1

// DeviceSize is the size of the volume's DRBD devices as the datamesh asks for it:
// status.datamesh.size once the controller has published one, else spec.size (before
// the first revision). The agent sizes backing volumes and grows devices to it. While a
// volume grows, spec.size leads and the datamesh follows once the controller publishes
// the new size (docs/contract.md "The volume's datamesh").
func (rv *ReplicatedVolume) DeviceSize() int64 {
	if q := rv.Status.Datamesh.Size; q != nil && !q.IsZero() {
		return q.Value()
	}
	return rv.Spec.Size.Value()
}

// CapacityBytes is the size the CSI service reports for the volume: DeviceSize when it
// is at least spec.size (a device rounded up past the request), else spec.size, the size
// the volume was promised and is growing to.
func (rv *ReplicatedVolume) CapacityBytes() int64 {
	return max(rv.Spec.Size.Value(), rv.DeviceSize())
}
