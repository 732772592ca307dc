// Package captures holds the one copy of the real DRBD 9 output recorded
// on three machines (testdata/README.md says what was run, where and when;
// the files are the tools' output, unchanged). The parser
// tests of pkg/drbd, the drbdsim tests and the contract suite all read it
// from here, so they compare against the same bytes.
//
// Names are slash-separated paths inside the tree, such as "proc-drbd.txt"
// or "01-up-inconsistent/node3.show-json.json". Every regular file opened
// through this package is remembered, so that a test binary can say how
// much of the tree it really used (Coverage).
package captures

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

//go:embed testdata
var embedded embed.FS

// tree is embedded with the "testdata/" prefix stripped, so that names are
// the ones README.md uses.
var tree = func() fs.FS {
	sub, err := fs.Sub(embedded, "testdata")
	if err != nil {
		panic(err) // only if the embed directive above names another directory
	}
	return sub
}()

var (
	mu   sync.Mutex
	read = map[string]bool{}
)

// trackingFS records each regular file opened; directories are walked
// without counting as read.
type trackingFS struct{}

func (trackingFS) Open(name string) (fs.File, error) {
	f, err := tree.Open(name)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err == nil && !st.IsDir() {
		mu.Lock()
		read[name] = true
		mu.Unlock()
	}
	return f, nil
}

// FS is the capture tree. Reads through it count towards Coverage.
func FS() fs.FS { return trackingFS{} }

// Read returns the bytes of one capture and fails the test if there is no
// such file.
func Read(t testing.TB, name string) []byte {
	t.Helper()
	b, err := fs.ReadFile(FS(), name)
	if err != nil {
		t.Fatalf("capture %s: %v", name, err)
	}
	return b
}

// Lines returns the non-empty lines of one capture.
func Lines(t testing.TB, name string) []string {
	t.Helper()
	var out []string
	for _, l := range strings.Split(string(Read(t, name)), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// Has reports whether the tree holds name. It does not count as a read:
// tests use it to skip a node or stage that was not recorded.
func Has(name string) bool {
	st, err := fs.Stat(tree, name)
	return err == nil && !st.IsDir()
}

// Files returns the names of every capture whose base name contains substr
// (such as "events2" or "status-json"), sorted. It fails the test when
// there is none, so that a renamed file cannot turn a replay into a test
// of nothing.
func Files(t testing.TB, substr string) []string {
	t.Helper()
	var out []string
	err := fs.WalkDir(tree, ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(path.Base(p), substr) {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no capture files matching %q", substr)
	}
	slices.Sort(out)
	return out
}

// Path writes a copy of one capture into a temporary directory of the test
// and returns its path, for what reads a file by name rather than bytes: a
// program run by the test (drbdadm -c, a stand-in drbdsetup), or a driver
// option such as ExecConfig.ProcDRBD. The copy keeps the base name.
func Path(t testing.TB, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), path.Base(name))
	if err := os.WriteFile(p, Read(t, name), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Coverage reports how many of the tree's files this process has read,
// and which it has not. README.md is provenance, not a capture, and is not
// counted.
func Coverage() (n, total int, unread []string) {
	mu.Lock()
	defer mu.Unlock()
	_ = fs.WalkDir(tree, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "README.md" {
			return err
		}
		total++
		if read[p] {
			n++
		} else {
			unread = append(unread, p)
		}
		return nil
	})
	return n, total, unread
}

// Report is Coverage as one line for a test binary's TestMain. It names the
// unread files when there are few: for a suite meant to read nearly all of
// the tree, they are the ones to look at.
func Report(suite string) string {
	n, total, unread := Coverage()
	s := fmt.Sprintf("%s: %d of %d DRBD capture files read", suite, n, total)
	if len(unread) > 0 && len(unread) <= 5 {
		s += "; not read: " + strings.Join(unread, " ")
	}
	return s
}

// Main runs m's tests and then prints Report(suite); it returns the exit
// code. For a TestMain with nothing else to do:
//
//	func TestMain(m *testing.M) { os.Exit(captures.Main(m, "drbdsim")) }
func Main(m *testing.M, suite string) int {
	code := m.Run()
	fmt.Println(Report(suite))
	return code
}
