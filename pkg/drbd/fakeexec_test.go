package drbd

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fakeExec is a scripted machine: each step names the exact argv it expects
// and the output to replay. A call that does not match the next step fails
// the test. Steps marked real run the actual program (drbdadm parsing a
// rendered file), so the driver's checks are exercised for real.
type fakeExec struct {
	t     *testing.T
	mu    sync.Mutex
	steps []fakeStep
	next  int
}

type fakeStep struct {
	argv []string
	// match replaces argv when part of it is not known in advance (the
	// temp file name WriteConfig picks).
	match   func(argv []string) bool
	env     []string
	res     Result
	hang    bool // block until ctx ends, like a drbdsetup stuck in the kernel
	real    bool // run it with OSExecutor
	stream  string
	onStart func(argv []string)
}

func newFakeExec(t *testing.T, steps ...fakeStep) *fakeExec {
	f := &fakeExec{t: t, steps: steps}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.next != len(f.steps) {
			t.Errorf("fake exec: %d of %d expected commands were not run; next: %q", len(f.steps)-f.next, len(f.steps), f.steps[f.next].argv)
		}
	})
	return f
}

func (f *fakeExec) take(argv, env []string) (fakeStep, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.next >= len(f.steps) {
		f.t.Errorf("fake exec: unexpected command %q", argv)
		return fakeStep{}, fmt.Errorf("unexpected command %q", argv)
	}
	s := f.steps[f.next]
	f.next++
	ok := slices.Equal(s.argv, argv)
	if s.match != nil {
		ok = s.match(argv)
	}
	if !ok {
		f.t.Errorf("fake exec: command #%d\n got %q\nwant %q", f.next, argv, s.argv)
		return fakeStep{}, fmt.Errorf("unexpected command %q", argv)
	}
	if !slices.Equal(s.env, env) {
		f.t.Errorf("fake exec: command %q env %q, want %q", argv, env, s.env)
	}
	if s.onStart != nil {
		s.onStart(argv)
	}
	return s, nil
}

func (f *fakeExec) Run(ctx context.Context, argv, env []string) (Result, error) {
	s, err := f.take(argv, env)
	if err != nil {
		return Result{ExitCode: -1}, err
	}
	switch {
	case s.hang:
		<-ctx.Done()
		return Result{ExitCode: -1}, ctx.Err()
	case s.real:
		return OSExecutor{}.Run(ctx, argv, env)
	}
	return s.res, nil
}

func (f *fakeExec) Stream(ctx context.Context, argv, env []string) (io.ReadCloser, error) {
	s, err := f.take(argv, env)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(strings.NewReader(s.stream)), nil
}

// realDrbdadmDump matches WriteConfig's check of its temp file and runs the
// real drbdadm on it.
func realDrbdadmDump(dir, name string, env []string) fakeStep {
	return fakeStep{
		match: func(argv []string) bool {
			return len(argv) == 5 && argv[0] == "drbdadm" && argv[1] == "-c" &&
				filepath.Dir(argv[2]) == dir && strings.HasPrefix(filepath.Base(argv[2]), "."+name+".res.tmp-") &&
				argv[3] == "dump" && argv[4] == name
		},
		env:  env,
		real: true,
	}
}
