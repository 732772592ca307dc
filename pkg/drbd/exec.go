package drbd

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// Executor runs external programs. ExecDriver talks to drbd-utils only
// through it, so tests can replace the machine with a script that checks
// every argv and replays recorded output.
type Executor interface {
	// Run runs argv to completion with env added to the environment and
	// returns what it printed and its exit code. err is non-nil only when
	// the program could not be started or was stopped because ctx ended; a
	// non-zero exit is reported through Result.ExitCode.
	Run(ctx context.Context, argv []string, env []string) (Result, error)
	// Stream starts argv and returns its stdout. Closing the reader (or
	// ending ctx) kills the program.
	Stream(ctx context.Context, argv []string, env []string) (io.ReadCloser, error)
}

// Result is the outcome of a finished command.
type Result struct {
	Stdout   []byte
	Stderr   []byte
	ExitCode int
}

// OSExecutor runs programs on this machine.
type OSExecutor struct {
	// KillGrace is how long to wait for output pipes after the program was
	// killed (a grandchild holding the pipe must not hang us). Default 2s.
	KillGrace time.Duration
}

var _ Executor = OSExecutor{}

func (e OSExecutor) command(ctx context.Context, argv []string, env []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(cmd.Environ(), env...)
	// drbdadm runs drbdsetup/drbdmeta as children. Killing only drbdadm
	// would leave a hung drbdsetup behind, so each command gets its own
	// process group and the whole group is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = e.KillGrace
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = 2 * time.Second
	}
	return cmd
}

func (e OSExecutor) Run(ctx context.Context, argv []string, env []string) (Result, error) {
	if len(argv) == 0 {
		return Result{ExitCode: -1}, errors.New("empty command line")
	}
	cmd := e.command(ctx, argv, env)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Stdin = nil // /dev/null: drbdmeta must never wait for a "yes"
	err := cmd.Run()
	res := Result{Stdout: stdout.Bytes(), Stderr: stderr.Bytes(), ExitCode: -1}
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return res, err
	}
	return res, nil
}

func (e OSExecutor) Stream(ctx context.Context, argv []string, env []string) (io.ReadCloser, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty command line")
	}
	ctx, cancel := context.WithCancel(ctx)
	cmd := e.command(ctx, argv, env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	return &streamReader{r: out, argv: argv, cmd: cmd, cancel: cancel, stderr: &stderr}, nil
}

// streamReader is a running program's stdout; Close kills and reaps it.
// When the program ends by itself with a failure, the read that hits the
// end returns a *CommandError with its exit code and stderr instead of
// io.EOF, so whoever restarts the stream can say why it stopped (e.g.
// "Failed to modprobe drbd").
type streamReader struct {
	r      io.Reader
	argv   []string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stderr *bytes.Buffer
	waited bool
}

func (s *streamReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF && !s.waited {
		s.waited = true
		werr := s.cmd.Wait()
		s.cancel()
		if code := s.cmd.ProcessState.ExitCode(); werr != nil && code != 0 {
			stderr := cleanStderr(s.stderr.Bytes())
			c, kind := classify(stderr)
			return n, &CommandError{Args: s.argv, ExitCode: code, Stderr: stderr, StateCode: c, Kind: kind}
		}
	}
	return n, err
}

func (s *streamReader) Close() error {
	if s.waited {
		return nil
	}
	s.waited = true
	s.cancel()
	_ = s.cmd.Wait() // reaps; the kill makes the exit status uninteresting
	return nil
}
