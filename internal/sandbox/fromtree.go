package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/meshvol/meshvol/internal/drbdsimd"
	"github.com/meshvol/meshvol/internal/kubecluster"
)

// FromTree starts three nodes with meshvol installed as users install it
// (the chart, and the image `make image` builds) from the source tree at
// root: what the e2e suite and the failover benchmark run on. It builds the
// pause program and the drbd-utils stand-ins into dir, makes sure the image
// is this tree's build (rebuilding it when not: a stale image would test
// yesterday's meshvol), writes meshvol's log to dir/meshvol.log, keeps the
// cluster's state in dir/sb, and waits for another cluster on the machine to
// end. Progress gets a line per stage.
func FromTree(ctx context.Context, root, dir string, taintLostNodes bool, progress io.Writer) (*Sandbox, error) {
	pause, err := kubecluster.BuildPause(ctx, root, dir)
	if err != nil {
		return nil, err
	}
	standIns, err := drbdsimd.BuildStandIns(ctx, root, dir)
	if err != nil {
		return nil, err
	}
	image := filepath.Join(root, "bin", "image", "meshvol.oci.tar")
	if err := EnsureFreshImage(ctx, root, image, progress); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "meshvol.log"))
	if err != nil {
		return nil, err
	}
	sb, err := Start(ctx, Options{
		Dir:            filepath.Join(dir, "sb"),
		Image:          image,
		StandIns:       standIns,
		Nodes:          3,
		PauseBinary:    pause,
		WaitForLock:    true,
		TaintLostNodes: taintLostNodes,
		Progress:       progress,
		Log: funcr.New(func(prefix, args string) {
			fmt.Fprintln(logFile, time.Now().Format("15:04:05.000"), prefix, args)
		}, funcr.Options{Verbosity: 1}),
	})
	if err != nil {
		logFile.Close()
		return nil, err
	}
	sb.logFile = logFile
	return sb, nil
}

// EnsureFreshImage checks that the image archive holds this tree's meshvol
// (ImageFreshness) and rebuilds it with hack/image.sh when it does not, or
// when there is none; progress gets what was found and done.
func EnsureFreshImage(ctx context.Context, root, image string, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	why := "there is none"
	if _, err := os.Stat(image); err == nil {
		fresh, w, err := ImageFreshness(ctx, root, image)
		if err != nil {
			return err
		}
		if fresh {
			fmt.Fprintf(progress, "sandbox: image %s: %s\n", image, w)
			return nil
		}
		why = w
	}
	fmt.Fprintf(progress, "sandbox: image %s: %s; rebuilding it (hack/image.sh, `make image`)\n", image, why)
	took, err := RebuildImage(ctx, root, progress)
	if err != nil {
		return err
	}
	fresh, w, err := ImageFreshness(ctx, root, image)
	if err != nil {
		return err
	}
	if !fresh {
		return fmt.Errorf("the image rebuilt by hack/image.sh is still not this tree's build: %s", w)
	}
	fmt.Fprintf(progress, "sandbox: image rebuilt in %s: %s\n", took.Round(time.Second), w)
	return nil
}
