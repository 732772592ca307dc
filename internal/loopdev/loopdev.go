// Package loopdev lists attached loop devices with their backing files, as
// the kernel shows them in /sys/block/loopN/loop/backing_file: what the
// in-process clusters (drbdsim, localcluster) look for when they check that
// a teardown left no loop device over their files.
package loopdev

import (
	"os"
	"path/filepath"
	"strings"
)

// Loop is one attached loop device.
type Loop struct {
	Dev     string // /dev/loopN
	Backing string // the backing file's path
	// Deleted: the backing file was removed while attached (the kernel
	// appends " (deleted)" to the path, which Backing leaves out).
	Deleted bool
}

// List returns every attached loop device. A device detached while it is
// being read is left out.
func List() []Loop {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []Loop
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		path := strings.TrimSuffix(string(b), "\n")
		trimmed := strings.TrimSuffix(path, " (deleted)")
		out = append(out, Loop{
			Dev:     "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f))),
			Backing: trimmed,
			Deleted: trimmed != path,
		})
	}
	return out
}

// Under returns the loop devices whose backing file is below dir.
func Under(dir string) []Loop {
	var out []Loop
	for _, l := range List() {
		if strings.HasPrefix(l.Backing, dir+"/") {
			out = append(out, l)
		}
	}
	return out
}
