package mountinfo

import (
	"reflect"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/mnt/plain`:         `/mnt/plain`,
		`/mnt/a\040b`:        `/mnt/a b`,
		`/mnt/tab\011x\134y`: "/mnt/tab\tx\\y",
		`/mnt/not\09escape`:  `/mnt/not\09escape`,
		`/mnt/short\04`:      `/mnt/short\04`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadFileUnescapesAndUnderMatchesWholeNames(t *testing.T) {
	ms, err := ReadFile("testdata/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 7 {
		t.Fatalf("%d mounts, want 7", len(ms))
	}
	m := ms[3]
	if m.MountPoint != "/tmp/c/node a/mnt" || m.Major != 7 || m.Minor != 3 || m.FsType != "ext4" || m.Source != "/dev/loop3" {
		t.Errorf("line 4 = %+v", m)
	}
	if ms[5].Root != "/sub" || ms[6].Source != "my tmpfs" {
		t.Errorf("root %q, source %q", ms[5].Root, ms[6].Source)
	}
	if !reflect.DeepEqual(ms[4].MountOptions, []string{"ro", "relatime"}) {
		t.Errorf("options %q", ms[4].MountOptions)
	}
	// /tmp/c2 shares the prefix "/tmp/c" but is not under /tmp/c; the stacked
	// mount is listed twice.
	want := []string{"/tmp/c/node a/mnt", "/tmp/c/node a/mnt", "/tmp/c"}
	if got := Under(ms, "/tmp/c"); !reflect.DeepEqual(got, want) {
		t.Errorf("Under(/tmp/c) = %q, want %q", got, want)
	}
}

func TestReadSelf(t *testing.T) {
	ms, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	root := false
	for _, m := range ms {
		root = root || m.MountPoint == "/"
	}
	if !root {
		t.Errorf("no mount at / among %d mounts", len(ms))
	}
}
