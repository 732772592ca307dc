// Package goproc runs an in-process component (an agent, a controller, a gRPC
// server) in a goroutine that can be stopped and waited for, the way the
// in-process clusters (internal/localcluster, internal/sandbox) stop and restart them.
package goproc

import (
	"context"
	"errors"
)

// Proc is a goroutine that runs until its context is cancelled.
type Proc struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start runs run in a goroutine with a context derived from parent.
func Start(parent context.Context, run func(context.Context) error) *Proc {
	ctx, cancel := context.WithCancel(parent)
	p := &Proc{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = run(ctx)
	}()
	return p
}

// Stop cancels the context, waits for run to return and returns its error;
// context.Canceled, the ordinary answer to being stopped, is nil. A nil Proc
// (never started) stops at once.
func (p *Proc) Stop() error {
	if p == nil {
		return nil
	}
	p.cancel()
	<-p.done
	if errors.Is(p.err, context.Canceled) {
		return nil
	}
	return p.err
}

// Cancel cancels the context without waiting for run to return; Done
// says when it has (a caller that must not wait forever, a teardown that
// bounds the wait).
func (p *Proc) Cancel() { p.cancel() }

// Done is closed once run has returned.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether run has returned (on its own, or after Stop).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is what run returned, once it has (nil before, and for a nil Proc).
func (p *Proc) Err() error {
	if p == nil || !p.Exited() {
		return nil
	}
	return p.err
}
