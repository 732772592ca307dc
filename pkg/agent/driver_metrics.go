package agent

import (
	"context"
	"io"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// timedDriver records every DRBD command's duration and failure
// (meshvol_agent_drbd_command_*, metrics.go) under the name of the driver call,
// spelled as the drbdadm or drbdsetup command it runs where there is one. It sits under deadlineDriver, so a command that times out
// counts as a failure with the time it was given.
type timedDriver struct{ d drbd.Driver }

var _ drbd.Driver = timedDriver{}

// timed runs one command and records it.
func timed[T any](command string, f func() (T, error)) (T, error) {
	start := time.Now()
	v, err := f()
	observeCommand(command, start, err)
	return v, err
}

func (t timedDriver) run(command string, f func() error) error {
	_, err := timed(command, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

func (t timedDriver) WriteConfig(ctx context.Context, r *drbd.Resource) error {
	return t.run("write-config", func() error { return t.d.WriteConfig(ctx, r) })
}

func (t timedDriver) RemoveConfig(ctx context.Context, name string) error {
	return t.run("remove-config", func() error { return t.d.RemoveConfig(ctx, name) })
}

func (t timedDriver) HasMetadata(ctx context.Context, name string) (bool, error) {
	return timed("has-metadata", func() (bool, error) { return t.d.HasMetadata(ctx, name) })
}

func (t timedDriver) CreateMetadata(ctx context.Context, name string, maxPeers int) error {
	return t.run("create-md", func() error { return t.d.CreateMetadata(ctx, name, maxPeers) })
}

func (t timedDriver) Up(ctx context.Context, name string) error {
	return t.run("up", func() error { return t.d.Up(ctx, name) })
}

func (t timedDriver) Adjust(ctx context.Context, name string) error {
	return t.run("adjust", func() error { return t.d.Adjust(ctx, name) })
}

func (t timedDriver) Down(ctx context.Context, name string) error {
	return t.run("down", func() error { return t.d.Down(ctx, name) })
}

func (t timedDriver) Primary(ctx context.Context, name string, force drbd.ForceReason) error {
	return t.run("primary", func() error { return t.d.Primary(ctx, name, force) })
}

func (t timedDriver) Secondary(ctx context.Context, name string) error {
	return t.run("secondary", func() error { return t.d.Secondary(ctx, name) })
}

func (t timedDriver) NewCurrentUUIDClearBitmap(ctx context.Context, name string) error {
	return t.run("new-current-uuid", func() error { return t.d.NewCurrentUUIDClearBitmap(ctx, name) })
}

func (t timedDriver) Resize(ctx context.Context, name string) error {
	return t.run("resize", func() error { return t.d.Resize(ctx, name) })
}

func (t timedDriver) SuspendIO(ctx context.Context, name string) error {
	return t.run("suspend-io", func() error { return t.d.SuspendIO(ctx, name) })
}

func (t timedDriver) ResumeIO(ctx context.Context, name string) error {
	return t.run("resume-io", func() error { return t.d.ResumeIO(ctx, name) })
}

func (t timedDriver) FailIOWithoutQuorum(ctx context.Context, name string) error {
	return t.run("resource-options", func() error { return t.d.FailIOWithoutQuorum(ctx, name) })
}

func (t timedDriver) RecomputeQuorum(ctx context.Context, name string, q drbd.Quorum) error {
	return t.run("resource-options", func() error { return t.d.RecomputeQuorum(ctx, name, q) })
}

func (t timedDriver) ForgetPeer(ctx context.Context, name string, peerNodeID int) error {
	return t.run("forget-peer", func() error { return t.d.ForgetPeer(ctx, name, peerNodeID) })
}

func (t timedDriver) Reconnect(ctx context.Context, name string, peerNodeID int, force drbd.ForceReason) error {
	return t.run("reconnect", func() error { return t.d.Reconnect(ctx, name, peerNodeID, force) })
}

func (t timedDriver) Verify(ctx context.Context, name string, peerNodeID int) error {
	return t.run("verify", func() error { return t.d.Verify(ctx, name, peerNodeID) })
}

func (t timedDriver) Status(ctx context.Context, name string) ([]drbd.StatusResource, error) {
	return timed("status", func() ([]drbd.StatusResource, error) { return t.d.Status(ctx, name) })
}

func (t timedDriver) Show(ctx context.Context, name string) ([]drbd.ShowResource, error) {
	return timed("show", func() ([]drbd.ShowResource, error) { return t.d.Show(ctx, name) })
}

// Events is the long-running events2 stream, not a command: not timed.
func (t timedDriver) Events(ctx context.Context) (io.ReadCloser, error) { return t.d.Events(ctx) }

func (t timedDriver) DevicePath(name string) string { return t.d.DevicePath(name) }
