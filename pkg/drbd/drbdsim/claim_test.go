package drbdsim

import (
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// An attached backing disk that is a plain file is claimed, as DRBD claims its
// backing device: locked while attached, free again once the resource is down.
// A file pool of plain files reads that lock before it removes a volume.
func TestAttachClaimsPlainBackingFile(t *testing.T) {
	rg := newRig(t, nil)
	rg.upAll()
	backing := filepath.Join(rg.dir, "node1.img")
	locked := func() bool {
		t.Helper()
		fd, err := unix.Open(backing, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err != nil && !errors.Is(err, unix.EWOULDBLOCK) {
			t.Fatal(err)
		}
		return err != nil
	}
	if !locked() {
		t.Fatal("node1's attached backing file is not claimed")
	}
	rg.must(rg.c.Node("node1").Down(rg.ctx, "r0"))
	if locked() {
		t.Fatal("node1's backing file is still claimed after down")
	}
}
