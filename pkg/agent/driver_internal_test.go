package agent

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// create-md and resize run under the slow deadline, every other command under
// the command deadline: a grow of a large device is not killed at the 30 s an
// adjust gets, as pkg/drbd's ExecDriver allows it its SlowTimeout too. Each
// command hangs (drbdsim's fault) until its deadline ends it.
func TestDeadlineDriverGivesCreateMDAndResizeTheSlowDeadline(t *testing.T) {
	n := drbdsim.NewCluster(drbdsim.Options{Dir: t.TempDir()}).Node("a")
	for _, cmd := range []string{"adjust", "create-md", "resize"} {
		n.InjectFault(cmd, drbdsim.Fault{Hang: true})
	}
	const timeout, slow = 50 * time.Millisecond, 600 * time.Millisecond
	d := deadlineDriver{d: n, timeout: timeout, slow: slow}
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		call     func() error
		min, max time.Duration
	}{
		{"adjust", func() error { return d.Adjust(ctx, "r") }, timeout, slow},
		{"create-md", func() error { return d.CreateMetadata(ctx, "r", 7) }, slow, time.Minute},
		{"resize", func() error { return d.Resize(ctx, "r") }, slow, time.Minute},
	} {
		start := time.Now()
		err := c.call()
		took := time.Since(start)
		if !errors.Is(err, drbd.ErrTimeout) {
			t.Errorf("%s: %v, want drbd.ErrTimeout", c.name, err)
		}
		if took < c.min || took >= c.max {
			t.Errorf("%s: ended after %s, want at least %s and less than %s", c.name, took, c.min, c.max)
		}
	}
}
