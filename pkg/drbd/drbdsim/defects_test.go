package drbdsim

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/drbd"
)

func withVerifyAlg(_ string, o *drbd.OptionSet) { o.Net.VerifyAlg = drbd.Ptr("crc32c") }

// Online verify end to end: refused without a verify-alg as on DRBD
// 9.2.18 (-14); with one, VerifyS/VerifyT while it runs, the corrupted
// block found and reported out of sync, and resynced at the next
// handshake so that both replicas end identical.
func TestVerifyEndToEnd(t *testing.T) {
	rg := formed(t, nil)
	err := rg.c.Node("node1").Verify(rg.ctx, "r0", 1)
	var ce *drbd.CommandError
	if !errors.Is(err, drbd.ErrStateChangeRefused) || !errors.As(err, &ce) || ce.StateCode != -14 ||
		!strings.Contains(err.Error(), "Need a verify algorithm to start online verify") {
		t.Fatalf("verify without verify-alg: %v", err)
	}

	rg = formed(t, withVerifyAlg)
	show, err := rg.c.Node("node1").Show(rg.ctx, "r0")
	rg.must(err)
	if got := show[0].Connections[0].Net["verify-alg"]; got != "crc32c" {
		t.Fatalf("show: verify-alg %q", got)
	}
	n1 := rg.c.Node("node1")
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	rg.must(rg.write("node1", 0, 1<<20))
	// Bit rot on node2, below DRBD: a block no write explains.
	const bad = 37
	f, err := os.OpenFile(filepath.Join(rg.dir, "node2.img"), os.O_RDWR, 0)
	rg.must(err)
	_, err = f.WriteAt(bytes.Repeat([]byte{0xee}, 512), bad*blockSize+1024)
	f.Close()
	rg.must(err)

	rc, err := n1.EventsWith(rg.ctx, false)
	rg.must(err)
	var mu sync.Mutex
	var events strings.Builder
	go func() {
		sc := bufio.NewScanner(rc)
		for sc.Scan() {
			mu.Lock()
			events.WriteString(sc.Text() + "\n")
			mu.Unlock()
		}
	}()
	defer rc.Close()
	rg.must(n1.Verify(rg.ctx, "r0", 1))
	if st := rg.state("node2"); st.Connections[0].PeerDevices[0].ReplicationState != "VerifyT" {
		t.Fatalf("node2 while verifying: %v", st.Connections[0].PeerDevices[0].ReplicationState)
	}
	rg.c.Advance(3 * time.Second) // 128 MiB at 100 MiB/s
	st := rg.state("node1")
	pd := st.Connections[0].PeerDevices[0]
	if pd.ReplicationState != "Established" || pd.OutOfSync != 4 {
		t.Fatalf("node1 after verify: %s, %d KiB out of sync, want Established and 4", pd.ReplicationState, pd.OutOfSync)
	}
	// Verify does not repair; the next handshake does.
	rg.c.Cut("node1", "node2")
	rg.c.Connect("node1", "node2")
	rg.c.Advance(15 * time.Second)
	if pd := rg.state("node1").Connections[0].PeerDevices[0]; pd.ReplicationState != "Established" || pd.OutOfSync != 0 {
		t.Fatalf("node1 after reconnect: %+v", pd)
	}
	b1, _ := os.ReadFile(filepath.Join(rg.dir, "node1.img"))
	b2, _ := os.ReadFile(filepath.Join(rg.dir, "node2.img"))
	if !bytes.Equal(b1[bad*blockSize:(bad+1)*blockSize], b2[bad*blockSize:(bad+1)*blockSize]) {
		t.Fatal("the block verify found differs after the resync")
	}
	want := []string{"replication:VerifyS", "replication:Established", "replication:WFBitMapS", "replication:SyncSource", "replication:Established"}
	var seen string
	for range 100 {
		mu.Lock()
		seen = events.String()
		mu.Unlock()
		if inOrder(seen, want) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !inOrder(seen, want) {
		t.Fatalf("node1's events2 lack %q in order:\n%s", want, seen)
	}
	rg.noLostWrites()
}

// A verify-alg that differs between two nodes keeps them apart, as DRBD
// drops a connection whose peer has another one.
func TestVerifyAlgMismatchKeepsPeersApart(t *testing.T) {
	rg := newRig(t, func(node string, o *drbd.OptionSet) {
		if node == "node2" {
			o.Net.VerifyAlg = drbd.Ptr("sha256")
		}
	})
	rg.upAll()
	rg.c.Advance(time.Second)
	if cs := rg.state("node1").Connections[0].ConnectionState; cs == "Connected" {
		t.Fatalf("node1-node2 connected with different verify-algs")
	}
	if cs := rg.state("node1").Connections[1].ConnectionState; cs != "Connected" {
		t.Fatalf("node1-node3 (same verify-alg) %s", cs)
	}
}

// Without a configuration file, up and primary fail as drbdadm does
// (exit 20, "Can not open '…res'"), classified ErrUnknownResource like
// ExecDriver.
func TestNoConfigFileIsUnknownResource(t *testing.T) {
	rg := newRig(t, nil)
	n := rg.c.Node("node1")
	for name, err := range map[string]error{
		"up":      n.Up(rg.ctx, "nosuch"),
		"adjust":  n.Adjust(rg.ctx, "nosuch"),
		"primary": n.Primary(rg.ctx, "nosuch", drbd.NoForce),
	} {
		if !errors.Is(err, drbd.ErrUnknownResource) {
			t.Errorf("%s without configuration: %v", name, err)
		}
	}
	var ce *drbd.CommandError
	if err := n.Up(rg.ctx, "nosuch"); !errors.As(err, &ce) || ce.ExitCode != 20 || !strings.Contains(ce.Stderr, "Can not open '") {
		t.Errorf("up without configuration: %v", err)
	}
}

// heldPrimary forms r0 with devices, makes node1 Primary and opens its
// device read-only (closed at the test's end, before the cluster).
func heldPrimary(t *testing.T) (*rig, *Node, *os.File) {
	t.Helper()
	rg := formedWithDevices(t)
	n1 := rg.c.Node("node1")
	rg.must(n1.Primary(rg.ctx, "r0", drbd.NoForce))
	dev, err := os.Open(n1.DevicePath("r0"))
	rg.must(err)
	t.Cleanup(func() { dev.Close() })
	return rg, n1, dev
}

// down of a Primary whose device is open read-only does what DRBD 9.2.18
// did (down-ro-real.txt): demotes, drops every connection, then fails to
// detach (-2, exit 17, the opener named), classified ErrDeviceInUse; the
// node is left Secondary, UpToDate, without connections or quorum, its
// peers see it Connecting; adjust restores it. SafeDown refuses before
// touching anything while the device is held and takes it down once free.
func TestDownReadOnlyOpenerIsPartial(t *testing.T) {
	rg, n1, dev := heldPrimary(t)

	err := drbd.SafeDown(rg.ctx, n1, "r0", nil)
	var held *drbd.HeldOpenError
	if !errors.Is(err, drbd.ErrDeviceInUse) || !errors.As(err, &held) || held.Openers[0].PID != os.Getpid() || held.Openers[0].Write {
		t.Fatalf("SafeDown with a reader: %v", err)
	}
	if st := rg.state("node1"); st.Role != "Primary" || len(st.Connections) != 2 || st.Connections[0].ConnectionState != "Connected" {
		t.Fatalf("SafeDown touched DRBD before refusing: %v", st)
	}

	err = n1.Down(rg.ctx, "r0")
	var ce *drbd.CommandError
	if !errors.Is(err, drbd.ErrDeviceInUse) || !errors.As(err, &ce) || ce.StateCode != -2 || ce.ExitCode != 17 ||
		!strings.Contains(ce.Stderr, "drbd0 opened by ") {
		t.Fatalf("down with a reader: %v", err)
	}
	st := rg.state("node1")
	if st.Role != "Secondary" || len(st.Connections) != 0 || st.Devices[0].DiskState != "UpToDate" || st.Devices[0].Quorum {
		t.Fatalf("node1 after the half-done down: role %s, %d connections, %+v", st.Role, len(st.Connections), st.Devices[0])
	}
	if c := rg.state("node2").Connections[0]; c.ConnectionState != "Connecting" {
		t.Fatalf("node2 sees node1 %s, want Connecting", c.ConnectionState)
	}
	// A second down is refused the same way while the reader stays.
	if err := n1.Down(rg.ctx, "r0"); !errors.Is(err, drbd.ErrDeviceInUse) {
		t.Fatalf("second down with a reader: %v", err)
	}
	rg.must(n1.Adjust(rg.ctx, "r0"))
	rg.c.Advance(100 * time.Millisecond)
	st = rg.state("node1")
	if len(st.Connections) != 2 || st.Connections[0].ConnectionState != "Connected" || !st.Devices[0].Quorum {
		t.Fatalf("node1 after adjust: %v", st)
	}
	dev.Close()
	rg.must(drbd.SafeDown(rg.ctx, n1, "r0", nil))
	if _, err := n1.Status(rg.ctx, "r0"); !errors.Is(err, drbd.ErrUnknownResource) {
		t.Fatalf("after SafeDown: %v", err)
	}
	rg.noLostWrites()
}

// SafeDown repairs a down that fails half-way for a reason its opener
// check could not see (here: the check is told nothing holds the device).
func TestSafeDownRecoversWithAdjust(t *testing.T) {
	rg, n1, _ := heldPrimary(t)
	blind := func(string) ([]drbd.Opener, error) { return nil, nil }
	err := drbd.SafeDown(rg.ctx, n1, "r0", blind)
	if !errors.Is(err, drbd.ErrDeviceInUse) || !strings.Contains(err.Error(), "adjust restored") {
		t.Fatalf("SafeDown: %v", err)
	}
	rg.c.Advance(100 * time.Millisecond)
	if st := rg.state("node1"); len(st.Connections) != 2 || st.Connections[0].ConnectionState != "Connected" || !st.Devices[0].Quorum {
		t.Fatalf("node1 after SafeDown's adjust: %v", st)
	}
}

// SafeDown names a mount of the device as its opener, read-only or
// read-write as mounted, with the mount point as the user wrote it (the
// space is \040 in mountinfo).
func TestSafeDownNamesTheMount(t *testing.T) {
	rg := deviceRig(t, nil, nil)
	n1 := rg.formedPrimary("node1")
	dev := n1.DevicePath("r0")
	mkfs(t, dev)
	mnt := filepath.Join(rg.dir, "a mount")
	rg.must(os.MkdirAll(mnt, 0o755))
	for _, tc := range []struct {
		opts  string
		write bool
	}{{"ro", false}, {"rw", true}} {
		run(t, "mount", "-o", tc.opts, dev, mnt)
		err := drbd.SafeDown(rg.ctx, n1, "r0", nil)
		rg.must(unix.Unmount(mnt, 0))
		var held *drbd.HeldOpenError
		if !errors.Is(err, drbd.ErrDeviceInUse) || !errors.As(err, &held) {
			t.Fatalf("SafeDown with a %s mount: %v", tc.opts, err)
		}
		if want := (drbd.Opener{Write: tc.write, What: "mounted at " + mnt}); len(held.Openers) != 1 || held.Openers[0] != want {
			t.Fatalf("SafeDown with a %s mount named %v, want %v", tc.opts, held.Openers, want)
		}
	}
	rg.must(drbd.SafeDown(rg.ctx, n1, "r0", nil))
}

// inOrder reports whether every string of want occurs in s, in order.
func inOrder(s string, want []string) bool {
	for _, w := range want {
		i := strings.Index(s, w)
		if i < 0 {
			return false
		}
		s = s[i+len(w):]
	}
	return true
}

// A link that comes back is used at the next connect attempt: connect-int
// (DRBD's default 10 s) after the failed one, while a node that comes up
// connects at once; SetConnectInt shortens it.
func TestReconnectAtNextConnectAttempt(t *testing.T) {
	rg := formed(t, nil)
	rg.must(rg.c.Node("node3").Down(rg.ctx, "r0"))
	rg.c.Cut("node1", "node2") // both sides try at once, fail, next try in 10 s
	rg.c.Advance(3 * time.Second)
	rg.c.Connect("node1", "node2")
	rg.must(rg.c.Node("node3").Up(rg.ctx, "r0"))
	if cs := rg.state("node3").Connections[0].ConnectionState; cs != "Connected" {
		t.Fatalf("node3 coming up: %s, want Connected at once", cs)
	}
	rg.c.Advance(6900 * time.Millisecond)
	if cs := rg.state("node1").Connections[0].ConnectionState; cs != "Connecting" {
		t.Fatalf("node1 → node2 9.9 s after the failed attempt: %s, want Connecting", cs)
	}
	rg.c.Advance(200 * time.Millisecond)
	if cs := rg.state("node1").Connections[0].ConnectionState; cs != "Connected" {
		t.Fatalf("node1 → node2 after connect-int: %s", cs)
	}
	rg.c.SetConnectInt(time.Second)
	rg.c.Cut("node1", "node2")
	rg.c.Connect("node1", "node2")
	rg.c.Advance(1100 * time.Millisecond)
	if cs := rg.state("node1").Connections[0].ConnectionState; cs != "Connected" {
		t.Fatalf("with connect-int 1 s: %s", cs)
	}
}
