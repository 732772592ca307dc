package drbdsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/loopdev"
	"github.com/meshvol/meshvol/internal/mountinfo"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// requireDevices fails the test, saying what is missing, unless it can
// create loop devices, FUSE mounts and ext4 filesystems. These tests are
// part of `make test` and must not pass by skipping.
func requireDevices(t testing.TB) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (loop devices, mount(2) and FUSE mounts need it; run the tests as root)")
	}
	for _, bin := range []string{"losetup", "mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin+" (apt-get install util-linux mount e2fsprogs)")
		}
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		missing = append(missing, "/dev/loop-control (modprobe loop)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		missing = append(missing, "/dev/fuse (modprobe fuse)")
	}
	if len(missing) > 0 {
		t.Fatalf("drbdsim's block device tests need: %s", strings.Join(missing, "; "))
	}
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// deviceRig is newRig with LoopDevices. Its cleanup closes the cluster's
// devices and checks that nothing is left: no mount under the test's
// directory, no loop device over the FUSE mount, no FUSE mount.
func deviceRig(t *testing.T, opts func(*Options), mutate func(node string, o *drbd.OptionSet)) *rig {
	t.Helper()
	requireDevices(t)
	rg := newRig(t, mutate)
	rg.c.opts.LoopDevices = true
	if opts != nil {
		opts(&rg.c.opts)
	}
	t.Cleanup(func() {
		err := rg.c.Close()
		if rg.c.DeviceAborted() == nil && err != nil {
			t.Errorf("Close: %v", err)
		}
		if left := leftovers(rg.dir); len(left) > 0 {
			t.Errorf("left behind after Close: %s", strings.Join(left, "; "))
		}
	})
	return rg
}

// formedWithDevices is formed with LoopDevices and deviceRig's cleanup.
func formedWithDevices(t *testing.T) *rig {
	t.Helper()
	rg := deviceRig(t, nil, nil)
	rg.upAll()
	rg.must(rg.c.Node("node1").NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
	return rg
}

// leftovers lists the mounts under dir and the loop devices over a file
// under dir.
func leftovers(dir string) []string {
	var out []string
	ms, _ := mountinfo.Read()
	for _, p := range mountinfo.Under(ms, dir) {
		out = append(out, "mount "+p)
	}
	for _, loop := range loopsUnder(dir) {
		out = append(out, "loop device "+loop)
	}
	return out
}

// mount mounts dev on a new directory under the rig's and unmounts it at
// cleanup (before the cluster closes, so Close finds nothing to do).
func (rg *rig) mount(dev, name string) string {
	rg.t.Helper()
	mnt := filepath.Join(rg.dir, name)
	rg.must(os.MkdirAll(mnt, 0o755))
	run(rg.t, "mount", dev, mnt)
	rg.t.Cleanup(func() {
		if len(mountsAt(mnt)) > 0 {
			_ = unix.Unmount(mnt, 0)
		}
	})
	return mnt
}

// backingFile is the file under the loop device a Primary's device path
// links to: what a test checks later to see the device detached. Not the
// device's number: once detached, another process on the machine may
// attach that number to a file of its own.
func (rg *rig) backingFile(dev string) string {
	rg.t.Helper()
	loop, err := filepath.EvalSymlinks(dev)
	rg.must(err)
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(loop), "loop", "backing_file"))
	rg.must(err)
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
}

// loopsOver lists the loop devices attached to file.
func loopsOver(file string) []string {
	var out []string
	for _, l := range loopdev.List() {
		if l.Backing == file {
			out = append(out, l.Dev)
		}
	}
	return out
}

func mountsAt(mnt string) []string {
	var out []string
	ms, _ := mountinfo.Read()
	for _, m := range ms {
		if m.MountPoint == mnt {
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// mkfs makes ext4 without lazy initialisation, so that ext4 does not keep
// writing in the background after mount.
func mkfs(t testing.TB, dev string) {
	t.Helper()
	run(t, "mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev)
}

// formedPrimary forms r0 and promotes node.
func (rg *rig) formedPrimary(node string) *Node {
	rg.t.Helper()
	rg.upAll()
	rg.must(rg.c.Node("node1").NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
	n := rg.c.Node(node)
	rg.must(n.Primary(rg.ctx, "r0", drbd.NoForce))
	if _, err := os.Stat(n.DevicePath("r0")); err != nil {
		rg.t.Fatalf("%s is Primary but its device: %v", node, err)
	}
	return n
}

// writeFsync writes data to path and fsyncs it; the error of either.
func writeFsync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// The oracle holds for writes made through a filesystem: a file written
// and fsynced on the Primary is on the peer when the Primary crashes, and
// the promoted peer mounts the filesystem and reads it back intact.
func TestDeviceFsyncedFileSurvivesPrimaryCrash(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	mkfs(t, n1.DevicePath("r0"))
	mnt1 := rg.mount(n1.DevicePath("r0"), "mnt1")
	payload := bytes.Repeat([]byte("acknowledged "), 50000)
	rg.must(writeFsync(filepath.Join(mnt1, "db"), payload))
	rg.must(writeFsync(filepath.Join(mnt1, "small"), []byte("one block")))

	n1.Crash()
	rg.noLostWrites()
	// The dead node's filesystem fails from now on, like a disk of a dead
	// machine.
	if err := writeFsync(filepath.Join(mnt1, "after-crash"), []byte("x")); err == nil {
		t.Fatal("a write and fsync on the crashed Primary's filesystem succeeded")
	}
	rg.must(unix.Unmount(mnt1, 0))

	n2 := rg.c.Node("node2")
	rg.must(n2.Primary(rg.ctx, "r0", drbd.NoForce))
	mnt2 := rg.mount(n2.DevicePath("r0"), "mnt2")
	for name, want := range map[string][]byte{"db": payload, "small": []byte("one block")} {
		got, err := os.ReadFile(filepath.Join(mnt2, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("promoted node2 reads %s: %d bytes (%v), want the %d fsynced on node1", name, len(got), err, len(want))
		}
	}
	// The filesystem on the survivor is clean enough to keep writing.
	rg.must(writeFsync(filepath.Join(mnt2, "on-node2"), []byte("after failover")))
	rg.noLostWrites()
	if div, msgs := rg.c.Diverged("r0"); div {
		t.Fatalf("diverged: %v", msgs)
	}
}

// Every write through the device is on both replicas when it completes,
// mkfs's discards and zero-ranges included: after mkfs, files and an fsync,
// the two backing files hold the same bytes, before any demotion.
func TestDeviceReplicasEqualAfterMkfs(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	// Garbage first, so that a discard or zero-out that reached only one
	// replica would leave the replicas different.
	junk := bytes.Repeat([]byte{0xa5}, 1<<20)
	for off := int64(0); off < 16<<20; off += int64(len(junk)) {
		rg.must(n1.Write(rg.ctx, "r0", off, junk))
	}
	mkfs(t, dev)
	mnt := rg.mount(dev, "mnt")
	rg.must(writeFsync(filepath.Join(mnt, "f"), bytes.Repeat([]byte("z"), 3<<20)))
	rg.noLostWrites()
	size := rg.c.nodes["node1"].mds[filepath.Join(rg.dir, "node1.img")].sizeBytes
	b1, err := os.ReadFile(filepath.Join(rg.dir, "node1.img"))
	rg.must(err)
	b2, err := os.ReadFile(filepath.Join(rg.dir, "node2.img"))
	rg.must(err)
	if i := firstDiff(b1[:size], b2[:size]); i >= 0 {
		t.Fatalf("replicas differ at offset %d while node1 is Primary and mounted", i)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// A discard through the device (fallocate punch-hole on the block device,
// which arrives in the handler as fallocate) zeroes the range on every
// replica.
func TestDeviceDiscardReplicated(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	rg.must(n1.Write(rg.ctx, "r0", 0, bytes.Repeat([]byte{0xff}, 1<<20)))
	f, err := os.OpenFile(n1.DevicePath("r0"), os.O_RDWR, 0)
	rg.must(err)
	defer f.Close()
	rg.must(unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 64<<10, 256<<10))
	rg.must(unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, 512<<10, 64<<10))
	for _, node := range []string{"node1", "node2"} {
		b, err := os.ReadFile(filepath.Join(rg.dir, node+".img"))
		rg.must(err)
		for _, r := range [][2]int{{64 << 10, 320 << 10}, {512 << 10, 576 << 10}} {
			if !bytes.Equal(b[r[0]:r[1]], make([]byte, r[1]-r[0])) {
				t.Fatalf("%s: [%d, %d) not zeroed", node, r[0], r[1])
			}
		}
		if b[0] != 0xff || b[320<<10] != 0xff || b[576<<10] != 0xff {
			t.Fatalf("%s: data outside the zeroed ranges changed", node)
		}
	}
	rg.noLostWrites()
}

// directIO is a 4 KiB-aligned buffer for O_DIRECT.
func directIO(size int) []byte {
	b := make([]byte, size+4096)
	off := int(4096 - uintptr(unsafe.Pointer(&b[0]))%4096)
	return b[off : off+size]
}

// Without quorum (on-no-quorum io-error), writes and flushes through the
// device fail with EIO — at write(2) with O_DIRECT, at fsync through a
// filesystem — and so do reads (DRBD 9.2.18 fails every request of a device
// without quorum under io-error: drbd_submit_bio, cached_err_io); writes
// succeed again once quorum is back. (The raw checks come before ext4's failures: those leave a
// writeback error on the block device that the next O_DIRECT request
// reports once, on real DRBD too.)
func TestDeviceNoQuorumEIO(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	mkfs(t, dev)
	mnt := rg.mount(dev, "mnt")
	rg.must(writeFsync(filepath.Join(mnt, "before"), []byte("quorate")))

	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	rg.must(err)
	defer f.Close()
	buf := directIO(4096)
	copy(buf, "raw")
	last := rg.c.nodes["node1"].mds[filepath.Join(rg.dir, "node1.img")].sizeBytes - 4096

	rg.c.Partition("node1")
	rg.wantQuorum("node1", false)
	if _, err := f.WriteAt(buf, last); !errors.Is(err, syscall.EIO) {
		t.Fatalf("O_DIRECT write without quorum: %v, want EIO", err)
	}
	if _, err := f.ReadAt(buf, last); !errors.Is(err, syscall.EIO) {
		t.Fatalf("O_DIRECT read without quorum: %v, want EIO", err)
	}
	rg.healed()
	rg.wantQuorum("node1", true)
	copy(buf, "healed")
	if _, err := f.WriteAt(buf, last); err != nil {
		t.Fatalf("O_DIRECT write after quorum returned: %v", err)
	}
	rg.noLostWrites()

	rg.c.Partition("node1")
	if err := writeFsync(filepath.Join(mnt, "during"), []byte("lost")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write+fsync on ext4 without quorum: %v, want EIO", err)
	}
	rg.noLostWrites()
}

// suspendedWrite forms a suspend-io volume with node1 Primary, cuts node1
// off and starts a dd write of "suspended" into block 2 of its device; it
// checks the write blocks and returns dd's outcome to come.
func suspendedWrite(t *testing.T) (*rig, <-chan error) {
	t.Helper()
	rg := deviceRig(t, nil, func(_ string, o *drbd.OptionSet) { o.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO) })
	n1 := rg.formedPrimary("node1")
	rg.c.Partition("node1")
	done := ddWrite(t, n1.DevicePath("r0"), 2, "suspended")
	select {
	case err := <-done:
		t.Fatalf("write without quorum returned (%v) instead of blocking", err)
	case <-time.After(300 * time.Millisecond):
	}
	return rg, done
}

// With on-no-quorum suspend-io a write through the device blocks while
// quorum is lost and completes, replicated, once it returns.
func TestDeviceSuspendIOBlocksUntilQuorum(t *testing.T) {
	rg, done := suspendedWrite(t)
	rg.healed()
	select {
	case err := <-done:
		rg.must(err)
	case <-time.After(10 * time.Second):
		t.Fatal("suspended write still blocked 10 s after quorum returned")
	}
	if got := rg.backing("node2", 8192, 9); string(got) != "suspended" {
		t.Fatalf("node2 holds %q at 8192 after the suspended write completed", got)
	}
	rg.noLostWrites()
}

// A write through the device suspended without quorum fails with EIO once
// the running resource is switched to on-no-quorum io-error (what the agent
// does to a stale Primary whose member was removed, docs/controller.md
// "--delete-lost-pods"); the write never reached a peer, the device is no
// longer held by it and demotes.
func TestDeviceSuspendedWriteFailsOnIOError(t *testing.T) {
	rg, done := suspendedWrite(t)
	n1 := rg.c.Node("node1")
	rg.must(n1.FailIOWithoutQuorum(rg.ctx, "r0"))
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "Input/output error") {
			t.Fatalf("the suspended write returned %v after on-no-quorum io-error, want EIO", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the suspended write still blocked 10 s after on-no-quorum io-error")
	}
	if got := rg.backing("node2", 8192, 9); string(got) == "suspended" {
		t.Fatal("node2 holds the write that failed")
	}
	rg.must(n1.Secondary(rg.ctx, "r0"))
	rg.noLostWrites()
}

// backing reads n bytes at off of node's backing disk, where a Secondary's
// data is read on real DRBD too (its DRBD device does not open; internal
// metadata sits at the end, so the offsets are the device's).
func (rg *rig) backing(node string, off int64, n int) []byte {
	rg.t.Helper()
	f, err := os.Open(filepath.Join(rg.dir, node+".img"))
	rg.must(err)
	defer f.Close()
	buf := make([]byte, n)
	_, err = f.ReadAt(buf, off)
	rg.must(err)
	return buf
}

// ddWrite writes text into 4 KiB block blk of dev with O_DIRECT from a dd
// process and reports dd's result on the channel. A writer that blocks in
// the kernel must not be a thread of this process: if the test died with
// it waiting for this process's own FUSE handlers, the process could never
// exit (its threads in D state, the FUSE connection never aborted).
func ddWrite(t *testing.T, dev string, blk int, text string) <-chan error {
	t.Helper()
	src := filepath.Join(t.TempDir(), "block")
	data := make([]byte, 4096)
	copy(data, text)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("dd", "if="+src, "of="+dev, "bs=4096", "count=1", fmt.Sprintf("seek=%d", blk),
		"oflag=direct", "conv=notrunc", "status=none")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("dd: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		done <- err
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return done
}

// healed heals the network and lets the nodes reconnect (DRBD retries
// a connection every connect-int, 10 s by default).
func (rg *rig) healed() {
	rg.c.Heal()
	rg.c.Advance(15 * time.Second)
}

// A suspended write whose device goes away (here: Close, as a failed
// test's cleanup or a sandbox's shutdown does) fails with EIO instead of
// staying suspended, so nothing is left holding the loop device, the FUSE
// mount, or a thread in D state.
func TestDeviceSuspendedWriteFailsWhenDeviceGoes(t *testing.T) {
	rg, done := suspendedWrite(t)
	closed := make(chan error, 1)
	go func() { closed <- rg.c.Close() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "Input/output error") {
			t.Fatalf("suspended write after Close: %v, want EIO", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("suspended write still blocked 10 s after Close")
	}
	select {
	case err := <-closed:
		rg.must(err)
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return 15 s after the suspended write failed")
	}
}

// A diskless Primary reads and writes through its peers: what it writes is
// on both diskful replicas, what they hold is what it reads.
func TestDeviceDisklessPrimary(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	rg.must(n1.Write(rg.ctx, "r0", 1<<20, []byte("written before node3 promoted")))
	rg.must(n1.Secondary(rg.ctx, "r0"))
	n3 := rg.c.Node("node3")
	rg.must(n3.Primary(rg.ctx, "r0", drbd.NoForce))
	f, err := os.OpenFile(n3.DevicePath("r0"), os.O_RDWR|syscall.O_DIRECT, 0)
	rg.must(err)
	defer f.Close()
	buf := directIO(4096)
	if _, err := f.ReadAt(buf, 1<<20); err != nil || !bytes.HasPrefix(buf, []byte("written before node3 promoted")) {
		t.Fatalf("diskless node3 reads %q (%v)", buf[:29], err)
	}
	copy(buf, "from diskless node3")
	_, err = f.WriteAt(buf, 2<<20)
	rg.must(err)
	for _, node := range []string{"node1", "node2"} {
		b, err := os.ReadFile(filepath.Join(rg.dir, node+".img"))
		rg.must(err)
		if !bytes.HasPrefix(b[2<<20:], []byte("from diskless node3")) {
			t.Fatalf("%s lacks node3's write", node)
		}
	}
	rg.noLostWrites()
}

// Data the simulator changes underneath a live device (here a write on the
// same node through Node.Write; a resync does the same) is what the next
// O_DIRECT read of the device returns: the loop device does not read
// through the FUSE file's page cache.
func TestDeviceReadsSeeChangesUnderneath(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	f, err := os.OpenFile(n1.DevicePath("r0"), os.O_RDWR|syscall.O_DIRECT, 0)
	rg.must(err)
	defer f.Close()
	buf := directIO(4096)
	for i, want := range []string{"first version", "second version"} {
		rg.must(n1.Write(rg.ctx, "r0", 40960, []byte(want)))
		if _, err := f.ReadAt(buf, 40960); err != nil || !bytes.HasPrefix(buf, []byte(want)) {
			t.Fatalf("read %d: %q (%v), want %q", i, buf[:len(want)], err, want)
		}
	}
}

// A mounted device refuses demotion (-12); unmounted, it demotes and the
// device goes away.
func TestDeviceInUseRefusesDemote(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	backing := rg.backingFile(dev)
	mkfs(t, dev)
	mnt := rg.mount(dev, "mnt")
	if err := n1.Secondary(rg.ctx, "r0"); !errors.Is(err, drbd.ErrDeviceInUse) {
		t.Fatalf("demote while mounted: %v", err)
	}
	rg.must(unix.Unmount(mnt, 0))
	rg.must(n1.Secondary(rg.ctx, "r0"))
	if _, err := os.Lstat(dev); !os.IsNotExist(err) {
		t.Fatalf("device path after demotion: %v", err)
	}
	if loops := loopsOver(backing); len(loops) > 0 {
		t.Fatalf("%s still attached to %s after demotion", strings.Join(loops, ", "), backing)
	}
}

// A read-only opener does not stop a demotion (DRBD 9.2.18): the device
// stays the reader's and keeps serving its reads from the now Secondary
// replica; once the reader closes it, the loop device is gone and Down
// succeeds.
func TestDeviceReaderKeepsReadingAfterDemotion(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	rg.must(n1.Write(rg.ctx, "r0", 0, []byte("before demotion")))
	backing := rg.backingFile(n1.DevicePath("r0"))
	f, err := os.OpenFile(n1.DevicePath("r0"), os.O_RDONLY|syscall.O_DIRECT, 0)
	rg.must(err)
	defer f.Close()
	rg.must(n1.Secondary(rg.ctx, "r0"))
	buf := directIO(4096)
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.HasPrefix(buf, []byte("before demotion")) {
		t.Fatalf("read by the reader after demotion: %q (%v)", buf[:15], err)
	}
	rg.must(f.Close())
	rg.must(n1.Down(rg.ctx, "r0"))
	if loops := loopsOver(backing); len(loops) > 0 {
		t.Fatalf("%s still attached to %s after the reader closed it and down", strings.Join(loops, ", "), backing)
	}
}

// Resize of a Primary grows its device; an ext4 on it grows with resize2fs
// (CSI NodeExpandVolume) and the new space is replicated.
func TestDeviceGrowsWithResize(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	mkfs(t, dev)
	mnt := rg.mount(dev, "mnt")
	old := rg.c.nodes["node1"].mds[filepath.Join(rg.dir, "node1.img")].sizeBytes
	// One backing volume grown: the connected resource's size is the
	// smallest replica's, so the resize grows nothing.
	rg.must(os.Truncate(filepath.Join(rg.dir, "node1.img"), 256<<20))
	rg.must(n1.Resize(rg.ctx, "r0"))
	if got := blockdevSize(t, dev); got != old {
		t.Fatalf("device size after a resize with node2's backing still small: %d, want %d", got, old)
	}
	// Both grown: node2's resize grows node1's Primary device as well.
	rg.must(os.Truncate(filepath.Join(rg.dir, "node2.img"), 256<<20))
	rg.must(rg.c.Node("node2").Resize(rg.ctx, "r0"))
	grown := rg.c.nodes["node1"].mds[filepath.Join(rg.dir, "node1.img")].sizeBytes
	if got := blockdevSize(t, dev); got != grown || grown <= old {
		t.Fatalf("device size after resize %d, want %d (was %d)", got, grown, old)
	}
	if other := rg.c.nodes["node2"].mds[filepath.Join(rg.dir, "node2.img")].sizeBytes; other != grown {
		t.Fatalf("node2's replica has %d bytes after the resize, node1's %d", other, grown)
	}
	// Offline: online growth needs CAP_SYS_RESOURCE, which containers
	// (this test's machine among them) often lack.
	rg.must(unix.Unmount(mnt, 0))
	run(t, "e2fsck", "-f", "-p", dev)
	run(t, "resize2fs", dev)
	run(t, "mount", dev, mnt)
	var st unix.Statfs_t
	rg.must(unix.Statfs(mnt, &st))
	if total := int64(st.Blocks) * st.Bsize; total <= old {
		t.Fatalf("ext4 after resize2fs: %d bytes, not more than the old device's %d", total, old)
	}
	rg.must(writeFsync(filepath.Join(mnt, "big"), bytes.Repeat([]byte("g"), 150<<20)))
	rg.noLostWrites()
}

// A diskless Primary's device grows with its diskful peers: the last
// diskful replica's resize grows it, and the new end reads what a diskful
// peer holds there.
func TestDeviceDisklessGrowsWithResize(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	rg.upAll()
	rg.must(rg.c.Node("node1").NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
	n3 := rg.c.Node("node3")
	rg.must(n3.Primary(rg.ctx, "r0", drbd.NoForce))
	dev := n3.DevicePath("r0")
	old := blockdevSize(t, dev)
	for _, node := range []string{"node1", "node2"} {
		rg.must(os.Truncate(filepath.Join(rg.dir, node+".img"), 256<<20))
		rg.must(rg.c.Node(node).Resize(rg.ctx, "r0"))
	}
	grown := rg.c.nodes["node1"].mds[filepath.Join(rg.dir, "node1.img")].sizeBytes
	if got := blockdevSize(t, dev); got != grown || grown <= old {
		t.Fatalf("diskless Primary's device: %d bytes after the resize, want %d (was %d)", got, grown, old)
	}
	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	rg.must(err)
	defer f.Close()
	buf := directIO(4096)
	copy(buf, "at the new end")
	_, err = f.WriteAt(buf, grown-4096)
	rg.must(err)
	if got := rg.backing("node2", grown-4096, 14); string(got) != "at the new end" {
		t.Fatalf("node2 reads %q at the new end", got)
	}
	rg.noLostWrites()
}

func blockdevSize(t *testing.T, dev string) int64 {
	t.Helper()
	out, err := exec.Command("blockdev", "--getsize64", dev).Output()
	if err != nil {
		t.Fatalf("blockdev --getsize64 %s: %v", dev, err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Close leaves nothing behind even when filesystems are still mounted on
// the devices — bind-mounted, and on a crashed Primary — as a sandbox
// shutting down finds them (the cleanup's leftovers check).
func TestDeviceCloseCleansUp(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	mkfs(t, dev)
	mnt := filepath.Join(rg.dir, "staged")
	bind := filepath.Join(rg.dir, "published")
	rg.must(os.MkdirAll(mnt, 0o755))
	rg.must(os.MkdirAll(bind, 0o755))
	run(t, "mount", dev, mnt)
	run(t, "mount", "--bind", mnt, bind)
	rg.must(writeFsync(filepath.Join(bind, "f"), []byte("data")))
	n1.Crash() // the mounts stay, the loop device waits for them
	rg.must(rg.c.Close())
	if left := leftovers(rg.dir); len(left) > 0 {
		t.Fatalf("after Close: %s", strings.Join(left, "; "))
	}
}

// The watchdog turns a deadlock — a handler that can never get the cluster
// lock — into EIO for the writer and an aborted FUSE connection, instead of
// processes stuck in D state.
func TestDeviceWatchdogAbortsStuckConnection(t *testing.T) {
	rg := deviceRig(t, func(o *Options) { o.DeviceWatchdog = 500 * time.Millisecond }, nil)
	n1 := rg.formedPrimary("node1")
	f, err := os.OpenFile(n1.DevicePath("r0"), os.O_RDWR|syscall.O_DIRECT, 0)
	rg.must(err)
	defer f.Close()
	buf := directIO(4096)
	done := make(chan error, 1)
	rg.c.mu.Lock() // what a command stuck in the kernel on this device would hold
	go func() { _, err := f.WriteAt(buf, 0); done <- err }()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(20 * time.Second):
		rg.c.mu.Unlock()
		t.Fatal("write still blocked 20 s after the watchdog should have aborted the connection")
	}
	rg.c.mu.Unlock()
	if werr == nil {
		t.Fatal("the write completed although its handler could not run")
	}
	if err := rg.c.DeviceAborted(); err == nil || !strings.Contains(err.Error(), "watchdog") {
		t.Fatalf("DeviceAborted: %v", err)
	}
	_ = f.Close()
	if err := rg.c.Close(); err == nil || !strings.Contains(err.Error(), "watchdog") {
		t.Fatalf("Close after the abort: %v, want the watchdog's error", err)
	}
}

// BenchmarkDeviceFsync4K is a 4 KiB write and fdatasync of a file on ext4
// on the replicated device (two diskful replicas, protocol C);
// BenchmarkLoopTmpfsFsync4K the same on a plain loop device over a file on
// tmpfs, the cost without replication.
func BenchmarkDeviceFsync4K(b *testing.B) {
	benchFsync(b, replicatedDevice(b))
}

func BenchmarkLoopTmpfsFsync4K(b *testing.B) {
	benchFsync(b, tmpfsLoop(b))
}

// BenchmarkDeviceSeqWrite is sequential 1 MiB O_DIRECT writes to the
// replicated device; BenchmarkLoopTmpfsSeqWrite the same on a loop device
// over tmpfs.
func BenchmarkDeviceSeqWrite(b *testing.B) {
	benchSeq(b, replicatedDevice(b))
}

func BenchmarkLoopTmpfsSeqWrite(b *testing.B) {
	benchSeq(b, tmpfsLoop(b))
}

func replicatedDevice(b *testing.B) string {
	requireDevices(b)
	rg := newRig(b, nil)
	rg.c.opts.LoopDevices = true
	b.Cleanup(func() {
		if err := rg.c.Close(); err != nil {
			b.Error(err)
		}
	})
	return rg.formedPrimary("node1").DevicePath("r0")
}

func tmpfsLoop(b *testing.B) string {
	requireDevices(b)
	dir, err := os.MkdirTemp("/dev/shm", "drbdsim-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(img, 128<<20); err != nil {
		b.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", img).CombinedOutput()
	if err != nil {
		b.Fatalf("losetup: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	b.Cleanup(func() { _ = exec.Command("losetup", "-d", loop).Run() })
	return loop
}

func benchFsync(b *testing.B, dev string) {
	mkfs(b, dev)
	mnt, err := os.MkdirTemp("", "drbdsim-bench-mnt-")
	if err != nil {
		b.Fatal(err)
	}
	run(b, "mount", dev, mnt)
	b.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			b.Error(err)
		}
		_ = os.Remove(mnt)
	})
	f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	data := bytes.Repeat([]byte{1}, 4096)
	b.SetBytes(4096)
	for i := 0; b.Loop(); i++ {
		if _, err := f.WriteAt(data, int64(i%1024)*4096); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
	}
}

func benchSeq(b *testing.B, dev string) {
	f, err := os.OpenFile(dev, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := directIO(1 << 20)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	span := int64(64)
	for i := int64(0); b.Loop(); i++ {
		if _, err := f.WriteAt(buf, (i%span)*int64(len(buf))); err != nil {
			b.Fatal(fmt.Errorf("write %d: %w", i, err))
		}
	}
}

// Writes change statistics, not state: they print no events2 line (DRBD
// prints statistics with the next state change). A filesystem on the
// device would otherwise flood every events2 reader, the agent's first.
func TestWritesPrintNoEvents(t *testing.T) {
	rg, n1 := formedWithPrimary(t)
	rc, err := n1.EventsWith(rg.ctx, false)
	rg.must(err)
	for i := range 50 {
		rg.must(n1.Write(rg.ctx, "r0", int64(i)*4096, bytes.Repeat([]byte{byte(i)}, 4096)))
	}
	n1.Crash() // ends the stream
	b, err := io.ReadAll(rc)
	rg.must(err)
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] != "exists" {
			t.Fatalf("events2 line after writes that changed only statistics: %q", l)
		}
	}
}

// staleChildEnv names the directory in which the test binary, started by
// TestDeviceStaleMountsCleanedUp, mounts a filesystem on a device and
// dies without Close.
const staleChildEnv = "DRBDSIM_STALE_CHILD_DIR"

// A process that dies without Close leaves its FUSE mount dead, loop
// devices over it and filesystems on them; the next cluster on the same
// Options.Dir removes them and works.
func TestDeviceStaleMountsCleanedUp(t *testing.T) {
	requireDevices(t)
	if dir := os.Getenv(staleChildEnv); dir != "" {
		rg := rigIn(t, dir)
		n1 := rg.formedPrimary("node1")
		mkfs(t, n1.DevicePath("r0"))
		mnt := filepath.Join(dir, "mnt")
		rg.must(os.MkdirAll(mnt, 0o755))
		run(t, "mount", n1.DevicePath("r0"), mnt)
		rg.must(writeFsync(filepath.Join(mnt, "f"), []byte("left behind")))
		os.Exit(0) // no Close, no cleanup: a crash
	}
	dir := t.TempDir()
	t.Cleanup(func() { _ = cleanStale(filepath.Join(dir, "fuse")) }) // if the assertions below fail
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeviceStaleMountsCleanedUp$")
	cmd.Env = append(os.Environ(), staleChildEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if left := leftovers(dir); len(left) < 3 {
		t.Fatalf("the dead child left %v, want its FUSE mount, a loop device and the ext4 mount", left)
	}
	rg := rigIn(t, dir)
	n1 := rg.formedPrimary("node1")
	mkfs(t, n1.DevicePath("r0"))
	mnt := rg.mount(n1.DevicePath("r0"), "mnt")
	rg.must(writeFsync(filepath.Join(mnt, "f"), []byte("after the stale devices were removed")))
}

// rigIn is deviceRig in a given directory.
func rigIn(t *testing.T, dir string) *rig {
	t.Helper()
	rg := &rig{t: t, c: NewCluster(Options{Dir: dir, Seed: 1, LoopDevices: true}), dir: dir, ctx: context.Background()}
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
		if left := leftovers(dir); len(left) > 0 {
			t.Errorf("left behind after Close: %s", strings.Join(left, "; "))
		}
	})
	return rg
}
