package lvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Runner runs one command and returns what it wrote. A command that ran and
// exited non-zero, or was killed, returns a *CommandError; stdout and stderr
// are returned in every case, because lvm2 explains its failures on both.
//
// The real implementation is ExecRunner; tests replace it with a replayer of
// recorded lvm2 output that checks every argv it is given.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) (stdout, stderr []byte, err error)
}

// CommandError describes a command that failed.
type CommandError struct {
	Argv []string
	// ExitCode is the command's exit status, or -1 when it did not exit on its
	// own (killed after the context ended, or could not be started).
	ExitCode int
	Stderr   string
	// Err is the cause: *exec.ExitError, context.DeadlineExceeded or
	// context.Canceled for a killed command, exec.ErrNotFound, ...
	Err error
}

func (e *CommandError) Error() string {
	cmd := strings.Join(e.Argv, " ")
	msg := strings.TrimSpace(e.Stderr)
	switch {
	case e.ExitCode >= 0 && msg != "":
		return fmt.Sprintf("%s: exit %d: %s", cmd, e.ExitCode, msg)
	case e.ExitCode >= 0:
		return fmt.Sprintf("%s: exit %d", cmd, e.ExitCode)
	case msg != "":
		return fmt.Sprintf("%s: %v (stderr so far: %s)", cmd, e.Err, msg)
	default:
		return fmt.Sprintf("%s: %v", cmd, e.Err)
	}
}

func (e *CommandError) Unwrap() error { return e.Err }

// ExecRunner runs commands with os/exec.
type ExecRunner struct {
	// Env is added to the agent's environment for every command.
	Env []string
	// KillGrace bounds how long Run waits for output pipes after the process
	// was killed (a grandchild may hold them open). Zero means 2s.
	KillGrace time.Duration
}

// NewExecRunner returns the runner the provider uses in production.
//
// LC_ALL=C: error classification matches lvm2's English texts (the recorded
// build has no NLS, but a distribution build may).
// LVM_SUPPRESS_FD_WARNINGS=1: lvm2 writes "File descriptor N leaked" to stderr
// for any inherited fd (capture 21f). Go opens everything close-on-exec so this
// should not happen, but an fd from cgo or a debugger must not turn into noise
// in an error message.
func NewExecRunner() *ExecRunner {
	return &ExecRunner{Env: []string{"LC_ALL=C", "LVM_SUPPRESS_FD_WARNINGS=1"}}
}

// Run starts name with args and waits for it or for ctx. When ctx ends the
// whole process group is killed: lvm2 can fork helpers (thin_check), and a
// hung helper must not outlive the command we gave up on.
func (r *ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, []byte, error) {
	argv := append([]string{name}, args...)
	if err := ctx.Err(); err != nil {
		return nil, nil, &CommandError{Argv: argv, ExitCode: -1, Err: err}
	}
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// No stdin: lvm2 prompts take their default answer "n" when stdin is not a
	// terminal (captures 30, 30b), so a forgotten -y fails instead of hanging.
	cmd.Stdin = nil
	cmd.Env = append(os.Environ(), r.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// Negative pid: the process group created by Setpgid.
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = r.KillGrace
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = 2 * time.Second
	}
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), stderr.Bytes(), nil
	}
	ce := &CommandError{Argv: argv, ExitCode: -1, Stderr: stderr.String(), Err: err}
	if ctxErr := ctx.Err(); ctxErr != nil {
		// Killed by us: report the deadline, not "signal: killed".
		ce.Err = fmt.Errorf("%w (killed: %v)", ctxErr, err)
		return stdout.Bytes(), stderr.Bytes(), ce
	}
	var xe *exec.ExitError
	if errors.As(err, &xe) && xe.Exited() {
		ce.ExitCode = xe.ExitCode()
	}
	return stdout.Bytes(), stderr.Bytes(), ce
}
