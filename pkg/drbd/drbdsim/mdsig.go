package drbdsim

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
)

// DRBD keeps internal metadata at the end of the backing device; the
// simulator keeps it in memory, by device path. A path can be reused for
// another device — a loop device number is handed out again once its file
// was deleted — and the new device must then show no metadata, as a fresh
// disk does under real DRBD, or an agent would skip create-md and attach
// another volume's generation UUIDs and bitmaps to an empty disk. So
// create-md also writes a small signature (magic and the metadata's id) in
// the last 4 KiB of the device, inside the internal metadata area that data
// never reaches, and the metadata counts only while the device carries it.

var mdMagic = []byte("drbdsim-md\x00\x00")

const mdSigLen = 20 // magic (12) + id (8)

func (m *metadata) signature() []byte {
	b := make([]byte, mdSigLen)
	copy(b, mdMagic)
	binary.BigEndian.PutUint64(b[len(mdMagic):], m.id)
	return b
}

// sign writes the signature at the end of the backing device.
func (m *metadata) sign() error {
	f, err := os.OpenFile(m.backing, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil {
		return err
	}
	if size < blockSize {
		return fmt.Errorf("%s: %d bytes, too small for metadata", m.backing, size)
	}
	if _, err := f.WriteAt(m.signature(), size-blockSize); err != nil {
		return fmt.Errorf("writing metadata to %s: %w", m.backing, err)
	}
	return f.Sync()
}

// onDevice reports whether the device at m.backing carries m's signature.
func (m *metadata) onDevice() bool {
	f, err := os.Open(m.backing)
	if err != nil {
		return false
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil || size < blockSize {
		return false
	}
	b := make([]byte, mdSigLen)
	if _, err := f.ReadAt(b, size-blockSize); err != nil {
		return false
	}
	return bytes.Equal(b, m.signature())
}

// metadataOf returns the metadata of the device at path, or nil when the
// device there does not carry it (a new device at a reused path, or a
// device that was wiped); stale metadata is forgotten.
func (n *Node) metadataOf(path string) *metadata {
	md := n.mds[path]
	if md == nil {
		return nil
	}
	if !md.onDevice() {
		delete(n.mds, path)
		return nil
	}
	return md
}
