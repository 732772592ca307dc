package drbdsim

import (
	"os"
	"path/filepath"
	"testing"
)

// Metadata belongs to the device, not its path: a new, empty device at the
// path of a deleted one (a loop device number handed out again) has none,
// so create-md runs again and the new volume never inherits the old one's
// generation UUIDs. Resize moves it with the end of the device.
func TestMetadataBelongsToTheDevice(t *testing.T) {
	rg := newRig(t, nil)
	n1 := rg.c.Node("node1")
	has, err := n1.HasMetadata(rg.ctx, "r0")
	rg.must(err)
	if !has {
		t.Fatal("no metadata after create-md")
	}
	cfg, err := n1.config("test", "r0")
	rg.must(err)
	path := cfg.Disk.BackingDevice
	info, err := os.Stat(path)
	rg.must(err)
	rg.must(os.Remove(path))
	f, err := os.Create(path)
	rg.must(err)
	rg.must(f.Truncate(info.Size()))
	rg.must(f.Close())
	if has, err = n1.HasMetadata(rg.ctx, "r0"); err != nil || has {
		t.Fatalf("a new device at %s shows metadata (%v, %v)", filepath.Base(path), has, err)
	}
	if err := n1.Up(rg.ctx, "r0"); err == nil {
		t.Fatal("up attached a device without metadata")
	}
	rg.must(n1.CreateMetadata(rg.ctx, "r0", 2))
	rg.must(n1.Up(rg.ctx, "r0"))
	rg.must(os.Truncate(path, info.Size()*2))
	rg.must(n1.Resize(rg.ctx, "r0"))
	if has, err = n1.HasMetadata(rg.ctx, "r0"); err != nil || !has {
		t.Fatalf("metadata lost by a resize (%v, %v)", has, err)
	}
}
