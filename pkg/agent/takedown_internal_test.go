package agent

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// A take-down refused because the device is held open is tried again only
// after a wait that doubles from first to max, and meanwhile the refusal is
// given back unchanged (the same message, so a status reporting it is not
// written again); any other outcome forgets the resource.
func TestTakeDownGateBacksOff(t *testing.T) {
	now := time.Unix(0, 0)
	g := newTakeDownGate(500*time.Millisecond, 8*time.Second)
	g.now = func() time.Time { return now }
	held := fmt.Errorf("r0: State change failed: (-12) Device is held open by someone: %w", drbd.ErrDeviceInUse)

	if err := g.wait("r0"); err != nil {
		t.Fatalf("first attempt: %v, want none to wait for", err)
	}
	var waits []time.Duration
	for range 6 {
		err := g.done("r0", held)
		if !errors.Is(err, drbd.ErrDeviceInUse) || err.Error() != held.Error() {
			t.Fatalf("refusal given back as %v, want the refusal itself", err)
		}
		w := retryAfter(err, 0)
		waits = append(waits, w)
		now = now.Add(w - time.Millisecond)
		err = g.wait("r0")
		if !errors.Is(err, drbd.ErrDeviceInUse) || err.Error() != held.Error() || retryAfter(err, 0) != time.Millisecond {
			t.Fatalf("1 ms before the retry: %v (retry %s), want the refusal and 1ms", err, retryAfter(err, 0))
		}
		if err := g.wait("r1"); err != nil {
			t.Fatalf("another resource waits: %v", err)
		}
		now = now.Add(time.Millisecond)
		if err := g.wait("r0"); err != nil {
			t.Fatalf("at the retry: %v, want none to wait for", err)
		}
	}
	want := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second}
	if fmt.Sprint(waits) != fmt.Sprint(want) {
		t.Fatalf("waits %v, want %v", waits, want)
	}

	other := errors.New("drbdsetup timed out")
	if err := g.done("r0", other); err != other {
		t.Fatalf("another failure given back as %v", err)
	}
	if err := g.wait("r0"); err != nil {
		t.Fatalf("after another failure: %v, want no wait", err)
	}
	if err := g.done("r0", held); retryAfter(err, 0) != 500*time.Millisecond {
		t.Fatalf("a refusal after another failure waits %s, want the first wait again", retryAfter(err, 0))
	}
	if err := g.done("r0", nil); err != nil {
		t.Fatal(err)
	}
	if err := g.wait("r0"); err != nil {
		t.Fatalf("after a success: %v, want no wait", err)
	}
	if got := retryAfter(other, 3*time.Second); got != 3*time.Second {
		t.Fatalf("retryAfter of another error: %s, want the fallback", got)
	}
}
