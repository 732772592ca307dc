package drbdsim

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// A mount namespace made while the devices are up holds a copy of the FUSE
// mount, as a kubecluster node's (unshare --mount) does on a machine whose /
// is private: Close's unmount removes only this namespace's mount, and the
// kernel keeps the connection for the copy. Close still ends the server, at
// once, and leaves nothing behind in this namespace.
func TestDeviceCloseWhileAnotherNamespaceHoldsTheMount(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	rg.formedPrimary("node1")
	holder := mountNamespaceHolder(t)
	began := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- rg.c.Close() }()
	select {
	case err := <-closed:
		rg.must(err)
	case <-time.After(20 * time.Second):
		t.Fatalf("Close still runs 20 s after it began while %s holds a copy of the FUSE mount", holder)
	}
	t.Logf("Close took %s", time.Since(began).Round(time.Millisecond))
}

// mountNamespaceHolder starts a process in a mount namespace of its own
// (private: no unmount here reaches its copies of this namespace's mounts)
// and returns once the namespace exists; the process ends at cleanup.
func mountNamespaceHolder(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--", "sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	what := fmt.Sprintf("unshare --mount (pid %d)", cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", cmd.Process.Pid)); err == nil && ns != self {
			return what
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no mount namespace of its own after 10 s", what)
		}
	}
}

// A device torn down (Close, as a test's cleanup or a sandbox's shutdown does)
// while suspend-io holds a write and a slow link delays another's
// acknowledgment: the held write fails with EIO, the delayed one completes (its
// data is on both replicas), and Close returns, leaving no loop device, mount or
// FUSE server behind (deviceRig's cleanup checks).
func TestDeviceTeardownWithSuspendedAndDelayedIO(t *testing.T) {
	const delay = 3 * time.Second
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	rg.c.SetLinkDelay("node1", "node2", delay)
	began := time.Now()
	delayed := ddWrite(t, dev, 1, "delayed")
	for string(rg.backing("node2", 4096, 7)) != "delayed" {
		if time.Since(began) > 10*time.Second {
			t.Fatal("node2 never received the delayed write")
		}
		time.Sleep(10 * time.Millisecond)
	}
	rg.must(n1.SuspendIO(rg.ctx, "r0"))
	held := ddWrite(t, dev, 2, "held")
	select {
	case err := <-held:
		t.Fatalf("a write went through suspend-io: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	closed := make(chan error, 1)
	go func() { closed <- rg.c.Close() }()
	select {
	case err := <-held:
		if err == nil || !strings.Contains(err.Error(), "Input/output error") {
			t.Fatalf("write held by suspend-io after Close: %v, want EIO", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("write held by suspend-io still blocked 10 s after Close")
	}
	select {
	case err := <-delayed:
		rg.must(err)
	case <-time.After(delay + 10*time.Second):
		t.Fatalf("delayed write still blocked %s after it began", time.Since(began).Round(time.Second))
	}
	select {
	case err := <-closed:
		rg.must(err)
	case <-time.After(delay + 15*time.Second):
		t.Fatal("Close still runs")
	}
}

// A filesystem whose dirty data cannot be written (its device's IO suspended by
// suspend-io) does not hold Close: from Close on, the suspended requests fail with
// EIO, so the unmount that has to write the data ends, and nothing is left behind.
// The writer of the data runs outside this process, as ddWrite says why.
func TestDeviceTeardownWithSuspendedFilesystem(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	mkfs(t, dev)
	mnt := rg.mount(dev, "staged")
	// Dirty pages, not written back: the unmount has to write them.
	run(t, "dd", "if=/dev/urandom", "of="+filepath.Join(mnt, "dirty"), "bs=64k", "count=4", "status=none")
	rg.must(n1.SuspendIO(rg.ctx, "r0"))
	closed := make(chan error, 1)
	go func() { closed <- rg.c.Close() }()
	select {
	case err := <-closed:
		rg.must(err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close still runs 30 s after it began on a filesystem whose IO is suspended")
	}
}

// A demotion detaches its loop device without holding the cluster lock.
// losetup -d takes the kernel's lock for every loop device, which a losetup
// over another loop device holds while it waits for that device's flush (the
// kubelet maps a block volume so, over /dev/drbdN): if that flush needs the
// cluster lock, as every device request does, a losetup -d under the lock
// waits for itself until the watchdog fails every device. Here the other
// device is another cluster's whose IO is suspended, so the kernel's lock stays
// taken until the test resumes it: meanwhile the demoting cluster still
// answers, and the demotion completes, its device detached, once the kernel's
// lock is free.
func TestDeviceDemotionDetachesOutsideTheClusterLock(t *testing.T) {
	held := deviceRig(t, nil, nil)
	hn := held.formedPrimary("node1")
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	backing := rg.backingFile(n1.DevicePath("r0"))

	held.must(hn.SuspendIO(held.ctx, "r0"))
	// The kubelet's block-volume mapping: a loop device over the device.
	losetup := exec.Command("losetup", "-f", "--show", hn.DevicePath("r0"))
	var out strings.Builder
	losetup.Stdout = &out
	held.must(losetup.Start())
	mapped := make(chan error, 1)
	go func() { mapped <- losetup.Wait() }()
	t.Cleanup(func() {
		_ = held.c.Node("node1").ResumeIO(held.ctx, "r0")
		<-mapped
		if loop := strings.TrimSpace(out.String()); loop != "" {
			_ = exec.Command("losetup", "-d", loop).Run()
		}
	})
	select {
	case err := <-mapped:
		t.Fatalf("losetup over a device whose IO is suspended returned (%v, %q) instead of waiting for its flush", err, out.String())
	case <-time.After(500 * time.Millisecond):
	}

	demoted := make(chan error, 1)
	go func() { demoted <- n1.Secondary(rg.ctx, "r0") }()
	select {
	case err := <-demoted:
		// The kernel let the detach through at once: nothing to wait for.
		rg.must(err)
	case <-time.After(time.Second):
		answered := make(chan struct{})
		go func() {
			_, _ = rg.c.Node("node2").StatusJSON(rg.ctx, "r0")
			close(answered)
		}()
		select {
		case <-answered:
		case <-time.After(10 * time.Second):
			t.Fatal("the cluster does not answer while a demotion waits for the kernel's loop lock: the detach holds the cluster lock")
		}
		held.must(hn.ResumeIO(held.ctx, "r0"))
		select {
		case err := <-demoted:
			rg.must(err)
		case <-time.After(20 * time.Second):
			t.Fatal("the demotion did not return 20 s after the kernel's loop lock was free")
		}
	}
	if loops := loopsOver(backing); len(loops) > 0 {
		t.Fatalf("%s still attached to %s after demotion", strings.Join(loops, ", "), backing)
	}
}

// TestDevicePromotionSetsUpOutsideTheClusterLock: a promotion's losetup runs
// without the cluster lock (setupDevice). While it waits — the hook stands in
// for a kernel that makes losetup wait, as one did for minutes on a loaded
// machine — the cluster answers, a second promotion of the same resource
// waits for the first and shares its outcome, and a demotion meanwhile
// leaves no loop device behind.
func TestDevicePromotionSetsUpOutsideTheClusterLock(t *testing.T) {
	// promoting starts node1's promotion of a formed r0 and returns once its
	// losetup is about to run; closing release lets it run.
	promoting := func(t *testing.T) (rg *rig, release chan struct{}, promoted chan error) {
		rg = deviceRig(t, nil, nil)
		rg.upAll()
		rg.must(rg.c.Node("node1").NewCurrentUUIDClearBitmap(rg.ctx, "r0"))
		entered := make(chan struct{}, 1)
		release = make(chan struct{})
		rg.c.setupHook = func() { entered <- struct{}{}; <-release }
		promoted = make(chan error, 1)
		go func() { promoted <- rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce) }()
		select {
		case <-entered:
		case err := <-promoted:
			t.Fatalf("the promotion returned (%v) without setting its device up", err)
		case <-time.After(20 * time.Second):
			t.Fatal("the promotion did not reach its device setup within 20 s")
		}
		return rg, release, promoted
	}
	wait := func(t *testing.T, what string, ch chan error) error {
		t.Helper()
		select {
		case err := <-ch:
			return err
		case <-time.After(20 * time.Second):
			t.Fatalf("%s did not return within 20 s", what)
			return nil
		}
	}

	t.Run("promoted", func(t *testing.T) {
		rg, release, promoted := promoting(t)
		answered := make(chan error, 1)
		go func() {
			_, err := rg.c.Node("node2").StatusJSON(rg.ctx, "r0")
			answered <- err
		}()
		select {
		case err := <-answered:
			rg.must(err)
		case <-time.After(10 * time.Second):
			close(release)
			t.Fatal("the cluster does not answer while a promotion's losetup waits: the setup holds the cluster lock")
		}
		second := make(chan error, 1)
		go func() { second <- rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce) }()
		select {
		case err := <-second:
			close(release)
			t.Fatalf("a second promotion returned (%v) while the first still set the device up", err)
		case <-time.After(500 * time.Millisecond):
		}
		close(release)
		rg.must(wait(t, "the promotion", promoted))
		rg.must(wait(t, "the second promotion", second))
		dev := rg.c.Node("node1").DevicePath("r0")
		data := bytes.Repeat([]byte{0x5a}, 4096)
		rg.must(writeFsync(dev, data))
		got := make([]byte, len(data))
		f, err := os.Open(dev)
		rg.must(err)
		defer f.Close()
		_, err = io.ReadFull(f, got)
		rg.must(err)
		if !bytes.Equal(got, data) {
			t.Fatal("the device set up outside the lock does not read back what was written to it")
		}
	})

	t.Run("demoted meanwhile", func(t *testing.T) {
		rg, release, promoted := promoting(t)
		rg.must(rg.c.Node("node1").Secondary(rg.ctx, "r0"))
		close(release)
		if err := wait(t, "the promotion", promoted); err == nil {
			t.Fatal("the promotion succeeded although a demotion tore its device down while losetup ran")
		}
		if loops := loopsUnder(rg.dir); len(loops) > 0 {
			t.Fatalf("%s left attached after the demotion during setup", strings.Join(loops, ", "))
		}
		rg.c.setupHook = nil
		rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", drbd.NoForce))
		if _, err := os.Stat(rg.c.Node("node1").DevicePath("r0")); err != nil {
			t.Fatalf("promoted again, but its device: %v", err)
		}
	})
}
