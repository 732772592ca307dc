package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshvol/meshvol/internal/ociimage"
)

// imageBinary is where the image holds meshvol (hack/image.sh).
const imageBinary = "/usr/local/bin/meshvol"

// ImageFreshness says whether the meshvol image archive holds the meshvol
// this tree builds: ./cmd/meshvol built as hack/image.sh builds it (static,
// -trimpath, stripped) with the version and commit stamps the image's
// binary reports (`meshvol version`) has the same bytes as the image's
// /usr/local/bin/meshvol exactly when nothing it is built from changed
// since `make image` (Go builds are reproducible). The stamps are taken
// from the image, so a commit that changes no source of the binary leaves
// the image fresh. Why names the two digests either way.
func ImageFreshness(ctx context.Context, root, archive string) (fresh bool, why string, err error) {
	dir, err := os.MkdirTemp("", "meshvol-fresh-")
	if err != nil {
		return false, "", err
	}
	defer os.RemoveAll(dir)
	inImage := filepath.Join(dir, "meshvol-image")
	if err := ociimage.ExtractFile(archive, imageBinary, inImage); err != nil {
		return false, "", err
	}
	out, err := exec.CommandContext(ctx, inImage, "version").Output()
	if err != nil {
		return false, "", fmt.Errorf("sandbox: the image's %s version: %w", imageBinary, err)
	}
	// "meshvol <version> (commit <commit>, <go>, <platform>)"
	var version, commit string
	if f := strings.Fields(string(out)); len(f) >= 4 && f[2] == "(commit" {
		version, commit = f[1], strings.TrimSuffix(f[3], ",")
	} else {
		return false, "", fmt.Errorf("sandbox: the image's %s version printed %q", imageBinary, out)
	}
	bin := filepath.Join(dir, "meshvol")
	if err := buildMeshvol(ctx, root, version, commit, bin); err != nil {
		return false, "", err
	}
	built, err := fileSHA256(bin)
	if err != nil {
		return false, "", err
	}
	image, err := fileSHA256(inImage)
	if err != nil {
		return false, "", err
	}
	if built == image {
		return true, fmt.Sprintf("the image's %s (%s, commit %s) is this tree's build (sha256 %.12s)", imageBinary, version, commit, built), nil
	}
	return false, fmt.Sprintf("the image's %s (%s, commit %s, sha256 %.12s) is not this tree's build (sha256 %.12s with the same stamps)", imageBinary, version, commit, image, built), nil
}

// buildMeshvol builds ./cmd/meshvol of root into out as hack/image.sh
// builds the image's (static, -trimpath, stripped), stamped version and
// commit.
func buildMeshvol(ctx context.Context, root, version, commit, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X github.com/meshvol/meshvol/pkg/version.Version="+version+" -X github.com/meshvol/meshvol/pkg/version.Commit="+commit,
		"-o", out, "./cmd/meshvol")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("sandbox: building ./cmd/meshvol (%s): %w\n%s", version, err, b)
	}
	return nil
}

// RebuildImage runs hack/image.sh (root; the cached Debian root file
// system makes it a rebuild of the binary and the archive), its output to
// log, and returns how long it took.
func RebuildImage(ctx context.Context, root string, log io.Writer) (time.Duration, error) {
	began := time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "image.sh"))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return time.Since(began), fmt.Errorf("sandbox: hack/image.sh: %w", err)
	}
	return time.Since(began), nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// gitOutput is the trimmed output of git args in root, fallback when git
// fails or prints nothing.
func gitOutput(ctx context.Context, root, fallback string, args ...string) string {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		return fallback
	}
	return strings.TrimSpace(string(out))
}
