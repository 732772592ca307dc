package file

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/storage"
)

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// A snapshot holds the volume's bytes when it was taken; a volume restored from
// it holds them too, zeros past the source's data (where the origin's DRBD
// metadata was), and is as large as asked; deleting leaves nothing.
func TestSnapshotAndRestore(t *testing.T) {
	p := newPool(t)
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "pvc-a-n1", SizeBytes: 4 * mib})
	if err != nil {
		t.Fatal(err)
	}
	before := bytes.Repeat([]byte("snap"), 1024)
	writeAt(t, v.DevicePath, mib, before)
	writeAt(t, v.DevicePath, 4*mib-4096, bytes.Repeat([]byte{0xee}, 4096)) // "metadata"
	s, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-1.a1", Replica: "pvc-a-n1"})
	if err != nil {
		t.Fatal(err)
	}
	if s.SizeBytes != 4*mib || s.Replica != "pvc-a-n1" {
		t.Fatalf("snapshot %+v", s)
	}
	if again, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-1.a1", Replica: "pvc-a-n1"}); err != nil || again != s {
		t.Fatalf("repeated CreateSnapshot: %+v, %v", again, err)
	}
	_, err = p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: "snap-1.a1", Replica: "other"})
	wantKind(t, err, storage.ErrAlreadyExists)
	writeAt(t, v.DevicePath, mib, bytes.Repeat([]byte("late"), 1024))

	r, err := p.Create(ctx, storage.CreateRequest{Replica: "pvc-b-n1", SizeBytes: 6 * mib,
		Source: &storage.Source{Snapshot: "snap-1.a1", DataBytes: 3 * mib}})
	if err != nil {
		t.Fatal(err)
	}
	if r.SizeBytes != 6*mib {
		t.Fatalf("restored volume has %d bytes, want %d", r.SizeBytes, 6*mib)
	}
	if got := readAt(t, r.DevicePath, mib, len(before)); !bytes.Equal(got, before) {
		t.Fatalf("restored volume holds %q..., want the snapshot's %q...", got[:8], before[:8])
	}
	if got := readAt(t, r.DevicePath, 4*mib-4096, 4096); !bytes.Equal(got, make([]byte, 4096)) {
		t.Fatal("restored volume keeps bytes past the source's data")
	}
	list, err := p.ListSnapshots(ctx, "pvc-a-n1")
	if err != nil || len(list) != 1 || list[0].Name != "snap-1.a1" {
		t.Fatalf("ListSnapshots: %+v, %v", list, err)
	}
	if list, _ := p.ListSnapshots(ctx, "pvc-b-n1"); len(list) != 0 {
		t.Fatalf("ListSnapshots of another replica: %+v", list)
	}
	vols, err := p.List(ctx)
	if err != nil || len(vols) != 2 {
		t.Fatalf("List shows %d volumes (%v), want the two volumes and not the snapshot", len(vols), err)
	}
	_, err = p.Create(ctx, storage.CreateRequest{Replica: "pvc-c-n1", SizeBytes: 2 * mib,
		Source: &storage.Source{Snapshot: "snap-1.a1", DataBytes: 3 * mib}})
	wantKind(t, err, storage.ErrInvalidArgument)
	_, err = p.Create(ctx, storage.CreateRequest{Replica: "pvc-c-n1", SizeBytes: 4 * mib,
		Source: &storage.Source{Snapshot: "missing", DataBytes: mib}})
	wantKind(t, err, storage.ErrNotFound)

	for _, name := range []string{"snap-1.a1", "snap-1.a1", "missing"} {
		if err := p.DeleteSnapshot(ctx, name); err != nil {
			t.Fatalf("DeleteSnapshot %s: %v", name, err)
		}
	}
	for _, rep := range []string{"pvc-a-n1", "pvc-b-n1"} {
		if err := p.Delete(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	entries, _ := os.ReadDir(p.dir)
	if len(entries) != 0 {
		t.Fatalf("left in the pool: %v", entries)
	}
}

// A file that carries a snapshot's name but not its mark is never used or removed.
func TestSnapshotNotOwned(t *testing.T) {
	p := newPool(t)
	if err := os.WriteFile(p.snapshotPath("foreign"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	wantKind(t, p.DeleteSnapshot(ctx, "foreign"), storage.ErrNotOwned)
	if _, err := os.Stat(p.snapshotPath("foreign")); err != nil {
		t.Fatal("the foreign file is gone")
	}
	if list, _ := p.ListSnapshots(ctx, ""); len(list) != 0 {
		t.Fatalf("ListSnapshots lists a foreign file: %+v", list)
	}
}

// BenchmarkSnapshotRestore1GiB takes a snapshot of a 1 GiB volume whose every byte is
// written and restores a volume from it: the file pool's work in CreateSnapshot and
// in a restore (a reflink where the file system has it, else a copy of the data).
func BenchmarkSnapshotRestore1GiB(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("loop devices need root")
	}
	dir := b.TempDir()
	p, err := New(context.Background(), dir)
	if err != nil {
		b.Fatal(err)
	}
	const size = 1 << 30
	v, err := p.Create(ctx, storage.CreateRequest{Replica: "bench-src", SizeBytes: size})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		devs, _ := backingFiles(context.Background())
		for path, d := range devs {
			if filepath.Dir(path) == p.dir {
				_ = detach(d)
			}
		}
	}()
	f, err := os.OpenFile(v.DevicePath, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{0x5a}, 1<<20)
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk, off); err != nil {
			b.Fatal(err)
		}
	}
	f.Close()
	b.Logf("reflink on %s: %v", dir, p.Reflink())
	b.ResetTimer()
	for i := range b.N {
		name := fmt.Sprintf("bench-snap-%d", i)
		start := time.Now()
		if _, err := p.CreateSnapshot(ctx, storage.SnapshotRequest{Name: name, Replica: "bench-src"}); err != nil {
			b.Fatal(err)
		}
		snapTook := time.Since(start)
		start = time.Now()
		if _, err := p.Create(ctx, storage.CreateRequest{Replica: fmt.Sprintf("bench-restore-%d", i), SizeBytes: size,
			Source: &storage.Source{Snapshot: name, DataBytes: size - (1 << 20)}}); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(snapTook.Seconds(), "snapshot-s")
		b.ReportMetric(time.Since(start).Seconds(), "restore-s")
		b.StopTimer()
		_ = p.Delete(ctx, fmt.Sprintf("bench-restore-%d", i))
		_ = p.DeleteSnapshot(ctx, name)
		b.StartTimer()
	}
}
