package file

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/backingclaim"
	"github.com/meshvol/meshvol/pkg/storage"
)

// A pool of plain files (NewFiles) gives each volume its file as its device and
// attaches no loop device; a volume whose file is claimed, as drbdsim claims the
// backing file it has attached, is in use: Delete refuses it and leaves the file.
func TestPlainFilesPool(t *testing.T) {
	dir := t.TempDir()
	p, err := NewFiles(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	v := mustCreate(t, p, "rvr-a", 3*mib+1)
	path := filepath.Join(p.dir, "rvr-a.img")
	if v.DevicePath != path || v.SizeBytes != 4*mib {
		t.Fatalf("Create = %+v, want the file %s as its device, %d bytes", v, path, 4*mib)
	}
	if os.Geteuid() == 0 {
		if _, bound, err := findLoop(path); err != nil || bound {
			t.Fatalf("a loop device is bound to %s (%v)", path, err)
		}
	}
	if g, err := p.Get(ctx, "rvr-a"); err != nil || g.DevicePath != path {
		t.Fatalf("Get = %+v, %v", g, err)
	}
	if r, err := p.Resize(ctx, "rvr-a", 6*mib); err != nil || r.SizeBytes != 6*mib || r.DevicePath != path {
		t.Fatalf("Resize = %+v, %v", r, err)
	}
	if vols, err := p.List(ctx); err != nil || len(vols) != 1 || vols[0].DevicePath != path {
		t.Fatalf("List = %+v, %v", vols, err)
	}

	// Claimed by another process, as drbdsimd's drbdsim claims the files
	// of an agent process's pool (internal/backingclaim).
	release := holdClaimElsewhere(t, path)
	wantKind(t, p.Delete(ctx, "rvr-a"), storage.ErrInUse)
	release()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("file removed while claimed: %v", err)
	}
	if err := p.Delete(ctx, "rvr-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file still there after Delete: %v", err)
	}

	// One directory is one kind of pool in a process.
	if _, err := New(context.Background(), dir); !errors.Is(err, storage.ErrFailedPrecondition) {
		t.Fatalf("New of a directory NewFiles made a pool of: %v, want %v", err, storage.ErrFailedPrecondition)
	}
}

// claimHolderEnv names the file a re-run of this test binary claims
// (TestMain), for a claim held by another process.
const claimHolderEnv = "MESHVOL_TEST_HOLD_CLAIM"

func TestMain(m *testing.M) {
	if path := os.Getenv(claimHolderEnv); path != "" {
		os.Exit(holdClaim(path))
	}
	os.Exit(m.Run())
}

// holdClaim claims path, says so on stdout and holds the claim until stdin
// closes.
func holdClaim(path string) int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	lock, err := backingclaim.Open(filepath.Dir(path))
	if err == nil {
		err = backingclaim.Take(lock, st.Ino)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("claimed")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// holdClaimElsewhere has another process claim path until release.
func holdClaimElsewhere(t *testing.T, path string) (release func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), claimHolderEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "claimed\n" {
		_ = stdin.Close()
		_ = cmd.Wait()
		t.Fatalf("the claiming process said %q (%v)", line, err)
	}
	return func() {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the claiming process: %v", err)
		}
	}
}
