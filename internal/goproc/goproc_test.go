package goproc

import (
	"context"
	"errors"
	"testing"
)

func TestStopWaitsAndHidesCanceled(t *testing.T) {
	stopped := false
	p := Start(context.Background(), func(ctx context.Context) error {
		<-ctx.Done()
		stopped = true
		return ctx.Err()
	})
	if p.Exited() || p.Err() != nil {
		t.Fatalf("before Stop: Exited %v, Err %v", p.Exited(), p.Err())
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop: %v, want nil for context.Canceled", err)
	}
	if !stopped || !p.Exited() {
		t.Fatalf("after Stop: run returned %v, Exited %v", stopped, p.Exited())
	}
	var never *Proc
	if err := never.Stop(); err != nil {
		t.Fatalf("Stop of a nil Proc: %v", err)
	}
}

func TestStopReturnsRunsError(t *testing.T) {
	boom := errors.New("boom")
	p := Start(context.Background(), func(context.Context) error { return boom })
	<-p.done
	if !p.Exited() || !errors.Is(p.Err(), boom) {
		t.Fatalf("after run returned: Exited %v, Err %v", p.Exited(), p.Err())
	}
	if err := p.Stop(); !errors.Is(err, boom) {
		t.Fatalf("Stop: %v, want %v", err, boom)
	}
}
