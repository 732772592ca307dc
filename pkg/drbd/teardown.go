package drbd

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// HeldOpenError is SafeDown's refusal: the device is held open, so `down`
// was not run. errors.Is(err, ErrDeviceInUse) holds.
type HeldOpenError struct {
	Resource string
	Device   string
	Openers  []Opener
}

func (e *HeldOpenError) Error() string {
	var who []string
	for _, o := range e.Openers {
		who = append(who, o.String())
	}
	return fmt.Sprintf("%s: down %s refused before running it: %s is held open by %s", ErrDeviceInUse, e.Resource, e.Device, strings.Join(who, ", "))
}

func (e *HeldOpenError) Is(target error) bool { return target == ErrDeviceInUse }

// OpenersFunc lists who holds a device open (DeviceOpeners by default).
type OpenersFunc func(device string) ([]Opener, error)

// SafeDown is how the node agent takes a resource down.
//
// `drbdadm down` is not atomic: on DRBD 9.2.18 a Primary whose device is
// open read-only demotes, disconnects from every peer and only then fails
// to detach ("(-2) Need access to UpToDate data … drbd0 opened by …",
// exit 17), leaving a Secondary with no connections and no quorum that the
// peers see as gone (captures: down-ro-real.txt). So SafeDown
//
//  1. refuses (HeldOpenError, errors.Is ErrDeviceInUse) without touching
//     DRBD when anything holds the device: a process, a mount, a stacked
//     device (openers, DeviceOpeners when nil);
//  2. runs Down;
//  3. when Down fails and the resource is still there, runs Adjust, which
//     brings back what the half-done down removed (connections, the disk);
//     the Down error is returned either way, wrapped, so errors.Is still
//     tells ErrDeviceInUse from the rest. Adjust does not promote: a
//     Primary that was demoted on the way stays Secondary until the caller
//     promotes it again.
//
// A Down that fails but leaves no resource behind reached its goal
// (e.g. killed by its timeout after the kernel finished): SafeDown returns
// nil then.
func SafeDown(ctx context.Context, d Driver, name string, openers OpenersFunc) error {
	if openers == nil {
		openers = DeviceOpeners
	}
	dev := d.DevicePath(name)
	held, err := openers(dev)
	if err != nil {
		return fmt.Errorf("down %s: cannot tell whether %s is held open: %w", name, dev, err)
	}
	if len(held) > 0 {
		return &HeldOpenError{Resource: name, Device: dev, Openers: held}
	}
	derr := d.Down(ctx, name)
	if derr == nil {
		return nil
	}
	if _, serr := d.Status(ctx, name); errors.Is(serr, ErrUnknownResource) {
		return nil
	}
	if aerr := d.Adjust(ctx, name); aerr != nil {
		return fmt.Errorf("down %s failed and adjust could not restore what it had already torn down: %w", name, errors.Join(derr, aerr))
	}
	return fmt.Errorf("down %s failed; adjust restored its connections and disk (it is Secondary now if it was Primary): %w", name, derr)
}
