package csi

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errTimedOut is what waitFor returns when the wait's deadline passed; callers turn it
// into DeadlineExceeded saying what they last saw.
var errTimedOut = errors.New("timed out waiting")

// DefaultMaxWait bounds a wait when the CO sent no deadline: the spec lets a plugin
// block, but a call that never returns holds the volume's in-flight guard forever.
const DefaultMaxWait = 5 * time.Minute

// pollInterval is how often a wait re-reads the informer cache. Reads from the cache
// cost the apiserver nothing, so this only trades CPU against latency.
const pollInterval = 50 * time.Millisecond

// waitFor calls cond until it reports done or fails, or ctx (bounded by
// DefaultMaxWait) ends; then it returns errTimedOut.
func waitFor(ctx context.Context, cond func() (bool, error)) error {
	if d, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultMaxWait)
		defer cancel()
	} else {
		// Stop a little before the caller's deadline, so that the answer saying what
		// the volume waits for reaches the CO instead of its own "deadline exceeded":
		// a tenth of the time left, between 100ms (a loaded node needs that much to
		// answer) and 1s, and never more than half of it.
		left := time.Until(d)
		margin := min(max(left/10, 100*time.Millisecond), time.Second, left/2)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-margin))
		defer cancel()
	}
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		done, err := cond()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return errTimedOut
		case <-t.C:
		}
	}
}

// waitRPC is waitFor as an RPC answers it: a wait whose deadline passed becomes
// DeadlineExceeded with the message stillWaiting builds from what cond last saw, so
// that the CO's retry log says what the volume waits for.
func waitRPC(ctx context.Context, cond func() (bool, error), stillWaiting func() string) error {
	err := waitFor(ctx, cond)
	if errors.Is(err, errTimedOut) {
		return status.Error(codes.DeadlineExceeded, stillWaiting())
	}
	return err
}
