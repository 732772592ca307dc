package loopdev

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A loop device over a file in a test directory is found under that
// directory and not under a sibling sharing its prefix; its file's removal
// shows as Deleted.
func TestUnderFindsAttachedLoop(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "img")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup (the tests run as root with loop devices): %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	has := func(ls []Loop, want Loop) bool { return slices.Contains(ls, want) }
	if ls := Under(dir); !has(ls, Loop{Dev: dev, Backing: file}) {
		t.Fatalf("Under(%s) = %+v, want %s over %s", dir, ls, dev, file)
	}
	if ls := Under(filepath.Join(dir, "im")); has(ls, Loop{Dev: dev, Backing: file}) {
		t.Fatalf("Under matched %s by a name prefix (im) instead of a directory: %+v", file, ls)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if ls := Under(dir); !has(ls, Loop{Dev: dev, Backing: file, Deleted: true}) {
		t.Fatalf("after removing the file, Under(%s) = %+v, want it Deleted", dir, ls)
	}
}
