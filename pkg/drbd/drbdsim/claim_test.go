package drbdsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/backingclaim"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/storage"
	"github.com/meshvol/meshvol/pkg/storage/file"
)

// claimedBy tells whether another holder claims the plain file at path, by
// trying to claim it through a lock file description of this test's own, as
// the file pool does (internal/backingclaim).
func claimedBy(t *testing.T, path string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	lock, err := backingclaim.Open(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	err = backingclaim.Take(lock, st.Ino)
	if err != nil && !errors.Is(err, backingclaim.ErrClaimed) {
		t.Fatal(err)
	}
	return err != nil
}

// An attached backing disk that is a plain file is claimed, as DRBD claims its
// backing device: claimed while attached, free again once the resource is down.
// A file pool of plain files tests that claim before it removes a volume.
func TestAttachClaimsPlainBackingFile(t *testing.T) {
	rg := newRig(t, nil)
	rg.upAll()
	backing := filepath.Join(rg.dir, "node1.img")
	if !claimedBy(t, backing) {
		t.Fatal("node1's attached backing file is not claimed")
	}
	rg.must(rg.c.Node("node1").Down(rg.ctx, "r0"))
	if claimedBy(t, backing) {
		t.Fatal("node1's backing file is still claimed after down")
	}
}

// soloResource is a resource with no peers whose disk is backing.
func soloResource(name, node string, minor int, backing string) *drbd.Resource {
	r := &drbd.Resource{Name: name, Minor: minor, Options: drbd.Resolve(drbd.DefaultOptions(), drbd.OptionSet{}),
		Self: drbd.Host{Name: node, NodeID: 0, Address: drbd.Address{IP: netip.MustParseAddr("10.99.0.1"), Port: 7000 + minor}}}
	if backing != "" {
		r.Disk = &drbd.Disk{BackingDevice: backing, MetaDisk: drbd.MetaDiskInternal}
	}
	return r
}

// openFiles counts this process's open file descriptors, and those of them
// that are open on files under dir.
func openFiles(t *testing.T, dir string) (all, under int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(target, dir+"/") {
			under++
		}
	}
	return len(ents), under
}

// plainVolume creates a volume of a pool of plain files, with DRBD metadata
// for a resource of that name on node, and returns its file.
func plainVolume(t *testing.T, ctx context.Context, pool *file.Pool, n *Node, name string, minor int) string {
	t.Helper()
	v, err := pool.Create(ctx, storage.CreateRequest{Replica: name, SizeBytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.WriteConfig(ctx, soloResource(name, n.Name(), minor, v.DevicePath)); err != nil {
		t.Fatal(err)
	}
	if err := n.CreateMetadata(ctx, name, 1); err != nil {
		t.Fatal(err)
	}
	return v.DevicePath
}

// An attached replica holds no file descriptor of its own: a node holds one
// per directory it has backing files attached in (the claims' lock file,
// claim.go), however many replicas it runs, so a process can simulate more
// replicas than it may open files (docs/scale.md, "Seventh pass: 10,000 3D
// volumes held"). Its data is still its backing file: a write lands in it, a
// read returns it. A crash closes the node's lock files.
func TestAttachedReplicasHoldNoDescriptor(t *testing.T) {
	ctx := context.Background()
	c := NewCluster(Options{Dir: t.TempDir(), Seed: 1})
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const perNode = 200
	nodes := []*Node{c.Node("node1"), c.Node("node2")}
	var v7 string // node1's v7
	for _, n := range nodes {
		dir := filepath.Join(root, n.Name())
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		pool, err := file.NewFiles(context.Background(), dir)
		if err != nil {
			t.Fatal(err)
		}
		for j := range perNode {
			path := plainVolume(t, ctx, pool, n, fmt.Sprintf("v%d", j), j)
			if n == nodes[0] && j == 7 {
				v7 = path
			}
		}
	}
	before, held := openFiles(t, root)
	if held != 0 {
		t.Fatalf("%d files under the pools open before any attach", held)
	}
	for _, n := range nodes {
		for j := range perNode {
			if err := n.Up(ctx, fmt.Sprintf("v%d", j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Other tests' clusters may close files meanwhile (their finalizers), never open one.
	after, held := openFiles(t, root)
	if held != len(nodes) || after > before+len(nodes) {
		t.Fatalf("%d replicas attached: %d files open under the pools, %d in all (%d before); want one lock file per node and directory",
			len(nodes)*perNode, held, after, before)
	}
	if !claimedBy(t, v7) {
		t.Fatal("an attached replica's file is not claimed")
	}

	n1 := nodes[0]
	if err := n1.Primary(ctx, "v7", "test: a lone replica without a peer"); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("meshvol!"), 512)
	if err := n1.Write(ctx, "v7", 8192, data); err != nil {
		t.Fatal(err)
	}
	got, err := n1.Read(ctx, "v7", 8192, len(data))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("Read after Write = %d bytes, %v; want what was written", len(got), err)
	}
	raw := make([]byte, len(data))
	f, err := os.Open(v7)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(raw, 8192); err != nil || !bytes.Equal(raw, data) {
		t.Fatalf("the backing file does not hold the write (%v)", err)
	}
	if _, held := openFiles(t, root); held != len(nodes)+1 { // and f
		t.Fatalf("%d files open under the pools after IO, want %d: the simulator kept a backing file open", held, len(nodes)+1)
	}

	for _, n := range nodes {
		n.Crash()
	}
	if _, held := openFiles(t, root); held != 1 { // f
		t.Fatalf("%d files open under the pools after every node crashed, want only the test's own", held)
	}
	if claimedBy(t, v7) {
		t.Fatal("a crashed node's replica's file is still claimed")
	}
}

// The file pool's Delete is refused while a simulated DRBD has the volume
// attached, and allowed once it is detached (down, or an adjust to diskless)
// or its node crashed; a second attach of a claimed file by another resource
// of the same node is refused as DRBD refuses a claimed backing device.
func TestPoolDeleteFollowsTheClaim(t *testing.T) {
	ctx := context.Background()
	c := NewCluster(Options{Dir: t.TempDir(), Seed: 1})
	n1 := c.Node("node1")
	pool, err := file.NewFiles(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	inUse := func(name string) {
		t.Helper()
		if err := pool.Delete(ctx, name); !errors.Is(err, storage.ErrInUse) {
			t.Fatalf("Delete %s while attached = %v, want %v", name, err, storage.ErrInUse)
		}
	}
	deleted := func(name, path string) {
		t.Helper()
		if err := pool.Delete(ctx, name); err != nil {
			t.Fatalf("Delete %s after its claim ended: %v", name, err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still there after Delete: %v", name, err)
		}
	}
	claimed := func(err error) {
		t.Helper()
		var ce *drbd.CommandError
		if !errors.As(err, &ce) || !bytes.Contains([]byte(ce.Stderr), []byte("(114) Lower device is already claimed")) {
			t.Fatalf("attach of a claimed file = %v, want DRBD's (114)", err)
		}
	}

	a := plainVolume(t, ctx, pool, n1, "a", 1)
	b := plainVolume(t, ctx, pool, n1, "b", 2)
	cv := plainVolume(t, ctx, pool, n1, "c", 3)
	for _, name := range []string{"a", "b", "c"} {
		if err := n1.Up(ctx, name); err != nil {
			t.Fatal(err)
		}
		inUse(name)
	}

	// Another resource of the same node on a's file: its claims share one
	// lock file description, which the kernel does not set against each
	// other (another node's is another description, as claimedBy's is).
	if err := n1.WriteConfig(ctx, soloResource("a2", "node1", 4, a)); err != nil {
		t.Fatal(err)
	}
	claimed(n1.Up(ctx, "a2"))
	inUse("a") // the refusal took no claim away
	if !claimedBy(t, a) {
		t.Fatal("a is not claimed after a2's refused attach")
	}

	if err := n1.Down(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	deleted("a", a)

	if err := n1.WriteConfig(ctx, soloResource("c", "node1", 3, "")); err != nil {
		t.Fatal(err)
	}
	if err := n1.Adjust(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	inUse("b") // c's detach is c's alone
	deleted("c", cv)

	n1.Crash()
	deleted("b", b)
}
