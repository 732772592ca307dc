package lvm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestExecRunnerExitCode(t *testing.T) {
	r := NewExecRunner()
	stdout, stderr, err := r.Run(context.Background(), "sh", "-c", `echo out; echo "  Volume group \"vgx\" not found" >&2; echo $LC_ALL >&2; exit 5`)
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != 5 {
		t.Fatalf("err = %v, want exit 5", err)
	}
	if string(stdout) != "out\n" || !strings.Contains(string(stderr), `"vgx" not found`) || !strings.Contains(ce.Stderr, "C\n") {
		t.Fatalf("stdout %q stderr %q", stdout, stderr)
	}
	if _, _, err := r.Run(context.Background(), "true"); err != nil {
		t.Fatal(err)
	}
	_, _, err = r.Run(context.Background(), "/nonexistent/lvcreate")
	if !errors.As(err, &ce) || ce.ExitCode != -1 {
		t.Fatalf("missing binary: %v", err)
	}
}

// A hung command is killed with its whole process group when the context
// ends, and reported as a deadline, not as "signal: killed".
func TestExecRunnerKillsHungCommandGroup(t *testing.T) {
	pidFile := t.TempDir() + "/child.pid"
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r := &ExecRunner{KillGrace: time.Second}
	// The child sleep inherits stdout: without the group kill, Wait would
	// hang on the pipe until the sleep ends.
	_, _, err := r.Run(ctx, "sh", "-c", `sleep 60 & echo $! > `+pidFile+`; wait`)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	var ce *CommandError
	if !errors.As(err, &ce) || ce.ExitCode != -1 {
		t.Fatalf("err = %#v", err)
	}
	data, rerr := os.ReadFile(pidFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	// Killed children of the group become zombies until reaped by init; poll
	// briefly for the process to be gone or a zombie.
	for i := 0; i < 100; i++ {
		if syscall.Kill(pid, 0) != nil || isZombie(pid) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = exec.Command("kill", "-9", strconv.Itoa(pid)).Run()
	t.Fatalf("grandchild %d survived the kill", pid)
}

func isZombie(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}
