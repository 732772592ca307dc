package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// git runs git in dir and returns its trimmed output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

func commitFile(t *testing.T, dir, content string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "f")
	git(t, dir, "commit", "-q", "-m", content)
	return git(t, dir, "rev-parse", "HEAD")
}

// The upgrade test starts from where a branch left main, or from HEAD's
// parent on main itself; ExportRevision writes that commit's files and names
// the commit for BuildImage's stamp.
func TestPreviousRevisionAndExport(t *testing.T) {
	ctx := context.Background()
	repo := t.TempDir()
	git(t, repo, "init", "-q", "-b", "main")
	first := commitFile(t, repo, "first")
	second := commitFile(t, repo, "second")
	if got, err := PreviousRevision(ctx, repo); err != nil || got != first {
		t.Fatalf("on main at %s: PreviousRevision = %s, %v; want its parent %s", second, got, err, first)
	}
	git(t, repo, "checkout", "-q", "-b", "topic", first)
	commitFile(t, repo, "topic 1")
	commitFile(t, repo, "topic 2")
	if got, err := PreviousRevision(ctx, repo); err != nil || got != first {
		t.Fatalf("on a branch off %s: PreviousRevision = %s, %v; want the merge base", first, got, err)
	}
	out := t.TempDir()
	if err := ExportRevision(ctx, repo, first, out); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "f")); err != nil || string(b) != "first" {
		t.Fatalf("exported f = %q, %v; want the first commit's", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(out, exportedCommitFile)); err != nil || !strings.HasPrefix(first, strings.TrimSpace(string(b))) || len(strings.TrimSpace(string(b))) < 7 {
		t.Fatalf("%s = %q, %v; want a short id of %s", exportedCommitFile, b, err, first)
	}
	if _, err := PreviousRevision(ctx, t.TempDir()); err == nil {
		t.Fatal("PreviousRevision outside a git checkout: no error")
	}
}
