package drbdsim

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// needLoop skips unless the test can create loop devices and mount.
func needLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loop devices need root")
	}
	for _, bin := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no /dev/loop-control")
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// mountedPrimary forms r0 with loop devices, promotes node1, makes ext4 on
// its device and mounts it on rg.dir/mnt.
func mountedPrimary(t *testing.T) (rg *rig, n1 *Node, mnt string) {
	t.Helper()
	needLoop(t)
	rg = newRig(t, nil)
	rg.c.opts.LoopDevices = true
	rg.upAll()
	n1 = rg.c.Node("node1")
	rg.must(n1.NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	dev := n1.DevicePath("r0")
	run(t, "mkfs.ext4", "-q", dev)
	mnt = filepath.Join(rg.dir, "mnt")
	rg.must(os.MkdirAll(mnt, 0o755))
	run(t, "mount", dev, mnt)
	return rg, n1, mnt
}

// mkfs and mount work on the Primary's device; the files written through
// it reach the peer at demotion; the diskless node3 then mounts the same
// filesystem through a scratch copy and its writes reach both replicas.
func TestLoopDeviceMkfsMountReplicates(t *testing.T) {
	rg, n1, mnt := mountedPrimary(t)
	n3 := rg.c.Node("node3")
	payload := bytes.Repeat([]byte("meshvol "), 100000)
	rg.must(os.WriteFile(filepath.Join(mnt, "data"), payload, 0o644))
	// Unmount first: demotion of a mounted device is refused, like DRBD
	// (-12; TestLoopDeviceInUseRefusesDemote).
	run(t, "umount", mnt)
	rg.must(n1.Secondary(rg.ctx, "r0"))
	rg.noLostWrites()
	if len(rg.c.acked["r0"]) == 0 {
		t.Fatal("no block of the filesystem was replicated")
	}
	// node3 (diskless) mounts what node1 wrote, via node2's and node1's data.
	rg.must(n3.Primary(rg.ctx, "r0", drbd.NoForce))
	run(t, "mount", n3.DevicePath("r0"), mnt)
	got, err := os.ReadFile(filepath.Join(mnt, "data"))
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("node3 reads back %d bytes (%v), want %d", len(got), err, len(payload))
	}
	rg.must(os.WriteFile(filepath.Join(mnt, "more"), []byte("from node3"), 0o644))
	run(t, "umount", mnt)
	rg.must(n3.Secondary(rg.ctx, "r0"))
	rg.noLostWrites()
	// Both replicas now hold identical data.
	b1, _ := os.ReadFile(filepath.Join(rg.dir, "node1.img"))
	b2, _ := os.ReadFile(filepath.Join(rg.dir, "node2.img"))
	size := rg.c.nodes["node1"].mds[filepath.Join(rg.dir, "node1.img")].sizeBytes
	if !bytes.Equal(b1[:size], b2[:size]) {
		t.Fatal("replicas differ after both demoted")
	}
}

// Demotion while the device is mounted is refused with -12.
func TestLoopDeviceInUseRefusesDemote(t *testing.T) {
	rg, n1, mnt := mountedPrimary(t)
	defer func() { _ = exec.Command("umount", mnt).Run(); _ = n1.Secondary(rg.ctx, "r0") }()
	if err := n1.Secondary(rg.ctx, "r0"); !errors.Is(err, drbd.ErrDeviceInUse) {
		t.Fatalf("demote while mounted: %v", err)
	}
}
