package drbd

// InternalMetadataBytes is the size of DRBD 9's internal metadata at the end of a
// backing device of backingBytes with maxPeers bitmap slots: a 4 KiB superblock, a
// 32 KiB activity log, and per peer slot one bit per 4 KiB of data, rounded up to
// 4 KiB. drbdsim uses the same rule, so capacity figures agree with the simulator.
// It counts the bitmap over the whole backing device, which slightly overestimates:
// callers use it to say what fits, where erring high is the safe side.
func InternalMetadataBytes(backingBytes int64, maxPeers int) int64 {
	if backingBytes <= 0 {
		return 0
	}
	kib := backingBytes / 1024
	bmBytes := (kib/4 + 7) / 8
	bmKiB := (bmBytes + 4095) / 4096 * 4
	return (36 + int64(maxPeers)*bmKiB) * 1024
}

// UsableBytes is how much data a backing device of backingBytes holds after DRBD's
// internal metadata for maxPeers slots, rounded down to 4 KiB; 0 if nothing fits.
func UsableBytes(backingBytes int64, maxPeers int) int64 {
	u := backingBytes - InternalMetadataBytes(backingBytes, maxPeers)
	if u <= 0 {
		return 0
	}
	return u &^ 4095
}

// BackingBytes is the smallest 4 KiB-aligned backing device whose UsableBytes are
// at least size: what a replica's backing volume must hold for a DRBD device of
// size bytes. The metadata grows with the backing device it sits on, so size plus
// the metadata of size is not enough when adding it crosses into one more bitmap
// page (just below every multiple of 128 MiB: a 1 GiB volume would get a device
// 28 KiB short of 1 GiB); the loop settles in at most a few rounds.
func BackingBytes(size int64, maxPeers int) int64 {
	if size <= 0 {
		return 0
	}
	size = (size + 4095) &^ 4095
	b := size
	for UsableBytes(b, maxPeers) < size {
		b = size + InternalMetadataBytes(b, maxPeers)
	}
	return b
}
