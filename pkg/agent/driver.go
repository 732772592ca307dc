package agent

import (
	"context"
	"io"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// deadlineDriver gives every driver call a deadline, so that a hung command
// returns drbd.ErrTimeout and becomes a condition instead of a stuck worker.
// create-md and resize get slow, the rest timeout: their time grows with the
// device (create-md writes the whole bitmap area of a new disk, a grow writes
// the new area's bitmap), as pkg/drbd's ExecDriver allows them its
// SlowTimeout. Events is the one long-running call: the Observer owns its
// lifetime.
type deadlineDriver struct {
	d       drbd.Driver
	timeout time.Duration
	slow    time.Duration
}

var _ drbd.Driver = deadlineDriver{}

// withDeadline runs f with a context that ends after timeout; the one place the
// deadline is set, for the calls that return a value.
func withDeadline[T any](ctx context.Context, timeout time.Duration, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx)
}

// run is withDeadline for the calls that return only an error.
func (t deadlineDriver) run(ctx context.Context, f func(context.Context) error) error {
	return runWithin(ctx, t.timeout, f)
}

// runSlow is run with the slow commands' deadline.
func (t deadlineDriver) runSlow(ctx context.Context, f func(context.Context) error) error {
	return runWithin(ctx, t.slow, f)
}

func runWithin(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	_, err := withDeadline(ctx, timeout, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	return err
}

func (t deadlineDriver) WriteConfig(ctx context.Context, r *drbd.Resource) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.WriteConfig(ctx, r) })
}

func (t deadlineDriver) RemoveConfig(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.RemoveConfig(ctx, name) })
}

func (t deadlineDriver) HasMetadata(ctx context.Context, name string) (bool, error) {
	return withDeadline(ctx, t.timeout, func(ctx context.Context) (bool, error) { return t.d.HasMetadata(ctx, name) })
}

func (t deadlineDriver) CreateMetadata(ctx context.Context, name string, maxPeers int) error {
	return t.runSlow(ctx, func(ctx context.Context) error { return t.d.CreateMetadata(ctx, name, maxPeers) })
}

func (t deadlineDriver) Up(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Up(ctx, name) })
}

func (t deadlineDriver) Adjust(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Adjust(ctx, name) })
}

func (t deadlineDriver) Down(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Down(ctx, name) })
}

func (t deadlineDriver) Primary(ctx context.Context, name string, force drbd.ForceReason) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Primary(ctx, name, force) })
}

func (t deadlineDriver) Secondary(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Secondary(ctx, name) })
}

func (t deadlineDriver) NewCurrentUUIDClearBitmap(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.NewCurrentUUIDClearBitmap(ctx, name) })
}

func (t deadlineDriver) Resize(ctx context.Context, name string) error {
	return t.runSlow(ctx, func(ctx context.Context) error { return t.d.Resize(ctx, name) })
}

func (t deadlineDriver) SuspendIO(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.SuspendIO(ctx, name) })
}

func (t deadlineDriver) ResumeIO(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.ResumeIO(ctx, name) })
}

func (t deadlineDriver) FailIOWithoutQuorum(ctx context.Context, name string) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.FailIOWithoutQuorum(ctx, name) })
}

func (t deadlineDriver) RecomputeQuorum(ctx context.Context, name string, q drbd.Quorum) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.RecomputeQuorum(ctx, name, q) })
}

func (t deadlineDriver) ForgetPeer(ctx context.Context, name string, peerNodeID int) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.ForgetPeer(ctx, name, peerNodeID) })
}

// Reconnect's two commands (disconnect, connect) share one deadline.
func (t deadlineDriver) Reconnect(ctx context.Context, name string, peerNodeID int, force drbd.ForceReason) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Reconnect(ctx, name, peerNodeID, force) })
}

func (t deadlineDriver) Verify(ctx context.Context, name string, peerNodeID int) error {
	return t.run(ctx, func(ctx context.Context) error { return t.d.Verify(ctx, name, peerNodeID) })
}

func (t deadlineDriver) Status(ctx context.Context, name string) ([]drbd.StatusResource, error) {
	return withDeadline(ctx, t.timeout, func(ctx context.Context) ([]drbd.StatusResource, error) { return t.d.Status(ctx, name) })
}

func (t deadlineDriver) Show(ctx context.Context, name string) ([]drbd.ShowResource, error) {
	return withDeadline(ctx, t.timeout, func(ctx context.Context) ([]drbd.ShowResource, error) { return t.d.Show(ctx, name) })
}

func (t deadlineDriver) Events(ctx context.Context) (io.ReadCloser, error) { return t.d.Events(ctx) }

func (t deadlineDriver) DevicePath(name string) string { return t.d.DevicePath(name) }
