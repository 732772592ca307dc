package drbdsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// A node with a /dev of its own (Options.DeviceDir, DeviceNodes) gets its
// Primary's device as a block device node there, the loop device under
// another name, which formats and mounts; a filesystem mounted on it in
// the node's mount namespace (Options.NodeMountInfo) holds it open as the
// kernel would count it, so the demotion is refused until it goes.
func TestDeviceNodesInTheNodesOwnDev(t *testing.T) {
	requireDevices(t)
	dir := t.TempDir()
	mountinfo := filepath.Join(dir, "node1.mountinfo")
	if err := os.WriteFile(mountinfo, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rg := &rig{t: t, dir: dir, ctx: context.Background(), c: NewCluster(Options{
		Dir: dir, Seed: 1, LoopDevices: true,
		DeviceDir:     func(node string) string { return filepath.Join(dir, "nodes", node, "dev") },
		DeviceNodes:   true,
		NodeMountInfo: func(node string) string { return filepath.Join(dir, node+".mountinfo") },
	})}
	contract.SparseBackingFiles(t, dir)
	for _, n := range []string{"node1", "node2", "node3"} {
		node := rg.c.Node(n)
		rg.must(node.WriteConfig(rg.ctx, r0(dir, n, nil)))
		if n != "node3" {
			rg.must(node.CreateMetadata(rg.ctx, "r0", 2))
		}
	}
	t.Cleanup(func() {
		if err := rg.c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	if want := filepath.Join(dir, "nodes", "node1", "dev", "drbd0"); dev != want {
		t.Fatalf("DevicePath %s, want %s", dev, want)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dev, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK || unix.Major(st.Rdev) != 7 {
		t.Fatalf("%s: mode %o, device %d:%d; want a block device node of a loop device", dev, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	mkfs(t, dev)
	mnt := rg.mount(dev, "mnt")
	rg.must(writeFsync(filepath.Join(mnt, "f"), []byte("through the node's own device node")))
	rg.must(unix.Unmount(mnt, 0))

	// Mounted in the node's namespace, which this process does not see.
	line := fmt.Sprintf("100 50 %d:%d / /var/lib/kubelet/plugins/x/globalmount rw,relatime shared:9 - ext4 /dev/drbd0 rw\n", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	rg.must(os.WriteFile(mountinfo, []byte(line), 0o644))
	if err := n1.Secondary(rg.ctx, "r0"); !errors.Is(err, drbd.ErrDeviceInUse) {
		t.Fatalf("Secondary while mounted on node1: %v, want ErrDeviceInUse", err)
	}
	rg.must(os.WriteFile(mountinfo, nil, 0o644))
	rg.must(n1.Secondary(rg.ctx, "r0"))
	if _, err := os.Lstat(dev); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after the demotion: %v, want it gone", dev, err)
	}
}
