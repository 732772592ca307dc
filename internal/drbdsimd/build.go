package drbdsimd

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildStandIns builds the drbd-utils stand-in program (./drbdutils, static)
// of the repository at repoRoot into dir and returns its path.
func BuildStandIns(ctx context.Context, repoRoot, dir string) (string, error) {
	out := filepath.Join(dir, "drbdsim-utils")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./internal/drbdsimd/drbdutils")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("drbdsimd: building the drbd-utils stand-ins: %w\n%s", err, b)
	}
	return out, nil
}
