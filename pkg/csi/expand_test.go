package csi

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// grownBlocks predicts what resize2fs makes of an ext4 on a grown device, the
// tail of a too-small last block group dropped: checked against resize2fs
// itself on image files, around the sizes where mke2fs drops a tail (a fresh
// file system on 513 MiB is 512 MiB), so that NodeStage neither runs e2fsck -f
// at every stage for nothing nor misses a growth.
func TestExtGrownBlocks(t *testing.T) {
	ctx := context.Background()
	img := filepath.Join(t.TempDir(), "fs.img")
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	const mib = 1 << 20
	for _, tc := range []struct{ from, to int64 }{
		{64, 64}, {64, 65}, {64, 72}, {64, 96}, {200, 264}, {513, 513}, {513, 514}, {513, 515}, {513, 516},
		{512, 513}, {512, 520}, {1024, 1025}, {1024, 1030}, {1024, 1100}, {2048, 2049}, {2048, 2060}, {4096, 5000},
	} {
		_ = os.Remove(img)
		run("truncate", "-s", itoa(tc.from*mib), img)
		run("mkfs.ext4", "-q", "-F", img)
		run("truncate", "-s", itoa(tc.to*mib), img)
		g, err := extGeometryOf(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		pred := g.grownBlocks(tc.to * mib)
		run("e2fsck", "-f", "-p", img)
		run("resize2fs", img)
		after, err := extGeometryOf(ctx, img)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d → %d MiB: %d blocks, predicted %d, resize2fs %d", tc.from, tc.to, g.blocks, pred, after.blocks)
		if (pred > g.blocks) != (after.blocks > g.blocks) || pred > after.blocks {
			t.Errorf("%d → %d MiB: %d blocks; predicted %d, resize2fs made %d", tc.from, tc.to, g.blocks, pred, after.blocks)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
