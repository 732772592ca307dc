package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/storage"
)

// The pool reads every loop device of the machine once, when its first Pool of a
// directory is made (the index, each entry checked by its device's own status); no
// operation after that scans again, so none costs more with more loop devices on the
// machine (an agent's node may hold thousands).
func TestOperationsDoNotScanEveryLoopDevice(t *testing.T) {
	p := newPool(t)
	mustCreate(t, p, "r1", 4*mib)
	scans := loopScans.Load()
	again, err := New(context.Background(), p.dir) // the agent makes a new Pool when the pool's definition changes
	if err != nil {
		t.Fatal(err)
	}
	ops := []struct {
		name string
		do   func() error
	}{
		{"Create", func() error {
			_, err := p.Create(ctx, storage.CreateRequest{Replica: "r2", SizeBytes: 4 * mib})
			return err
		}},
		{"Create again (idempotent)", func() error {
			_, err := again.Create(ctx, storage.CreateRequest{Replica: "r2", SizeBytes: 4 * mib})
			return err
		}},
		{"Get", func() error { _, err := p.Get(ctx, "r1"); return err }},
		{"Resize", func() error { _, err := p.Resize(ctx, "r1", 8*mib); return err }},
		{"List", func() error { _, err := p.List(ctx); return err }},
		{"Names", func() error { _, err := p.Names(ctx); return err }},
		{"Capacity", func() error { _, err := p.Capacity(ctx); return err }},
		{"Delete", func() error { return p.Delete(ctx, "r2") }},
		{"Get of a deleted volume", func() error {
			if _, err := p.Get(ctx, "r2"); err == nil {
				return fmt.Errorf("r2 is still there")
			}
			return nil
		}},
	}
	for _, op := range ops {
		if err := op.do(); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if n := loopScans.Load(); n != scans {
			t.Fatalf("%s read every loop device of the machine (%d scans since the pool was made)", op.name, n-scans)
		}
	}
	// The index is right, by the machine's truth: r1 has its device, r2 none.
	v, err := p.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok, err := findLoop(p.path("r1")); err != nil || !ok || d.path != v.DevicePath {
		t.Fatalf("r1: pool says %s, the machine %v (bound %v, %v)", v.DevicePath, d.path, ok, err)
	}
	if _, ok, _ := findLoop(p.path("r2")); ok {
		t.Fatal("r2's loop device is still bound after Delete")
	}
}

// A pool's first open waits for another open's scan of the loop devices, and scans
// them itself, only while its context lives: an agent stopping on SIGTERM must not wait
// for the pools its Lease and collector were opening, seconds each on a loaded machine
// with thousands of loop devices (docs/operating.md, "Stopping an agent").
func TestNewGivesUpWhenItsContextEnds(t *testing.T) {
	dir := t.TempDir()
	poolDirsLock <- struct{}{} // another open is scanning
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := New(ctx, dir)
	<-poolDirsLock
	if !errors.Is(err, storage.ErrTimeout) {
		t.Fatalf("New while another open scans, its context ending: %v, want %v", err, storage.ErrTimeout)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("New returned %s after its context ended, want at once", waited)
	}

	// A scan under way stops at the next loop device once the context has ended.
	attached, err := newPool(t).Create(context.Background(), storage.CreateRequest{Replica: "r1", SizeBytes: 4 * mib})
	if err != nil {
		t.Fatal(err)
	}
	ended, end := context.WithCancel(context.Background())
	end()
	if devs, err := backingFiles(ended); !errors.Is(err, context.Canceled) || devs != nil {
		t.Fatalf("a scan with its context ended: %d devices, %v; want none and %v", len(devs), err, context.Canceled)
	}
	devs, err := backingFiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range devs {
		found = found || d.path == attached.DevicePath
	}
	if !found {
		t.Fatalf("a scan with a live context does not find %s among %v", attached.DevicePath, devs)
	}

	// Nothing of the open given up is kept: the next New of the directory indexes it.
	if _, err := New(context.Background(), dir); err != nil {
		t.Fatalf("New after one gave up: %v", err)
	}
}

// attachOthers binds n loop devices to files of a directory that is no pool's, as
// other programs' (and other pools') devices are on a node, and detaches them when
// the benchmark ends.
func attachOthers(b *testing.B, n int) {
	b.Helper()
	dir := b.TempDir()
	b.Cleanup(func() {
		devs, err := backingFiles(context.Background())
		if err != nil {
			b.Errorf("cleanup: %v", err)
			return
		}
		for path, d := range devs {
			if filepath.Dir(path) == dir {
				if err := detach(d); err != nil {
					b.Errorf("cleanup: detach %s (%s): %v", d.path, path, err)
				}
			}
		}
	})
	for i := range n {
		path := filepath.Join(dir, fmt.Sprintf("other-%d", i))
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			b.Fatal(err)
		}
		if err := os.Truncate(path, mib); err != nil {
			b.Fatal(err)
		}
		if _, err := attach(path); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGetAmongLoopDevices is the cost of finding a volume's loop device (Get,
// what every agent reconcile of a replica asks) with 0 and 200 more loop devices bound
// on the machine (besides those it has): Get reads its own device's status only, one
// sysfs entry whatever the machine holds. The scan sub-benchmarks are what each call
// cost before the index (backingFiles: every bound loop device's sysfs entry, and a
// glob of every loop device of the machine), growing with the devices. ns/op depends on
// the machine's load; sysfs-reads/op does not.
func BenchmarkGetAmongLoopDevices(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("loop devices need root")
	}
	if _, err := os.Stat(loopControl); err != nil {
		b.Skipf("no %s: %v", loopControl, err)
	}
	others := 0
	for _, n := range []int{0, 200} {
		attachOthers(b, n-others)
		others = n
		dir := b.TempDir()
		p, err := New(context.Background(), dir)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Create(ctx, storage.CreateRequest{Replica: "bench", SizeBytes: 4 * mib}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			if err := p.Delete(ctx, "bench"); err != nil {
				b.Errorf("cleanup: %v", err)
			}
		})
		// sysfs-reads/op is the figure the machine's load does not change.
		b.Run(fmt.Sprintf("others=%d/Get", n), func(b *testing.B) {
			reads := sysfsReads.Load()
			for range b.N {
				if _, err := p.Get(ctx, "bench"); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(sysfsReads.Load()-reads)/float64(b.N), "sysfs-reads/op")
		})
		b.Run(fmt.Sprintf("others=%d/scan", n), func(b *testing.B) {
			reads := sysfsReads.Load()
			for range b.N {
				if _, err := backingFiles(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(sysfsReads.Load()-reads)/float64(b.N), "sysfs-reads/op")
		})
	}
}
