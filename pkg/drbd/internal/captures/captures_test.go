package captures

import (
	"io/fs"
	"os"
	"strings"
	"testing"
)

// The tree is the one README.md describes: every stage directory is there
// and names carry no "testdata/" prefix.
func TestTreeAsDescribed(t *testing.T) {
	readme := string(Read(t, "README.md"))
	for _, stage := range []string{"01-up-inconsistent", "03-primary-with-data", "04-failover-event-stream", "05-quorum-loss"} {
		if !strings.Contains(readme, stage) {
			t.Errorf("README.md does not describe %s", stage)
		}
		entries, err := fs.ReadDir(FS(), stage)
		if err != nil || len(entries) == 0 {
			t.Errorf("%s: %d files, %v", stage, len(entries), err)
		}
	}
	if !Has("r0.res") || Has("01-up-inconsistent") || Has("testdata/r0.res") || Has("no-such-file") {
		t.Error("Has: want true for a file only")
	}
}

func TestFilesAndLines(t *testing.T) {
	files := Files(t, "events2-timestamps")
	if len(files) != 4 || files[0] != "04-failover-event-stream/node1.events2-timestamps-statistics-stream.txt" {
		t.Fatalf("Files: %q", files)
	}
	ls := Lines(t, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt")
	raw := string(Read(t, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt"))
	if len(ls) != strings.Count(raw, "\n") || ls[0] == "" || strings.Contains(strings.Join(ls, ""), "\n") {
		t.Fatalf("Lines: %d lines for %d newlines", len(ls), strings.Count(raw, "\n"))
	}
}

// Path hands a program a byte-identical copy under the same base name.
func TestPathCopies(t *testing.T) {
	p := Path(t, "05-quorum-loss/node1.show.txt")
	if !strings.HasSuffix(p, "/node1.show.txt") {
		t.Fatalf("path %s", p)
	}
	got, err := os.ReadFile(p)
	if err != nil || string(got) != string(Read(t, "05-quorum-loss/node1.show.txt")) {
		t.Fatalf("copy differs: %v", err)
	}
}

// Coverage counts regular files read through the package, once each, and
// never README.md; Has does not count.
func TestCoverage(t *testing.T) {
	Has("node1.dmesg-drbd.txt")
	_, total, unread := Coverage()
	if total != 64 {
		t.Fatalf("total %d, want the 64 captures (README.md excluded)", total)
	}
	before := len(unread)
	for _, u := range unread {
		if u == "README.md" {
			t.Fatal("README.md counted")
		}
	}
	wasUnread := func(name string) bool {
		_, _, un := Coverage()
		for _, u := range un {
			if u == name {
				return true
			}
		}
		return false
	}
	if !wasUnread("node1.dmesg-drbd.txt") {
		t.Fatal("Has counted as a read")
	}
	Read(t, "node1.dmesg-drbd.txt")
	Read(t, "node1.dmesg-drbd.txt")
	if n, _, after := Coverage(); len(after) != before-1 || n != total-len(after) || wasUnread("node1.dmesg-drbd.txt") {
		t.Fatalf("after reading one file twice: %d read, %d unread (was %d)", n, len(after), before)
	}
}
