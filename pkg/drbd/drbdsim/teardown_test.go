package drbdsim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
