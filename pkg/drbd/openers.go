package drbd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshvol/meshvol/internal/mountinfo"
)

// Opener is something that holds a block device open: a process with a
// file descriptor on it, a mount of it, or a device stacked on it.
type Opener struct {
	// PID and Command name a process (0 and "" for a mount or a holder).
	PID     int
	Command string
	// Write: opened for writing, or mounted read-write. DRBD refuses to
	// demote a device held for writing (-12); a read-only opener lets it
	// demote but not detach (see SafeDown).
	Write bool
	// What says how it holds the device: "fd 3", "mounted at /mnt",
	// "holder dm-3".
	What string
}

func (o Opener) String() string {
	mode := "read-only"
	if o.Write {
		mode = "read-write"
	}
	if o.PID != 0 {
		return fmt.Sprintf("%s (pid %d) %s %s", o.Command, o.PID, o.What, mode)
	}
	return fmt.Sprintf("%s %s", o.What, mode)
}

// procRoot is /proc; a test may point it elsewhere.
var procRoot = "/proc"

// DeviceOpeners lists who holds the block device at path open: processes
// with a descriptor on it (from /proc/<pid>/fd, their access mode from
// fdinfo), mounts of it (from this process's mountinfo) and devices stacked
// on it (sysfs holders). A path that does not exist has no openers.
//
// It sees the processes of this PID namespace and the mounts of this mount
// namespace: the node agent runs with the host's (hostPID, the host's
// /proc mounted), or it would miss openers in other containers. A process
// whose descriptors cannot be read (it exited meanwhile, or we lack the
// permission) is skipped; the kernel has the last word anyway (a `down`
// that still fails is recovered by SafeDown).
func DeviceOpeners(path string) ([]Opener, error) {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(real, &st); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("device openers of %s: %w", path, err)
	}
	isBlock := st.Mode&syscall.S_IFMT == syscall.S_IFBLK
	same := func(o *syscall.Stat_t) bool {
		if isBlock {
			return o.Mode&syscall.S_IFMT == syscall.S_IFBLK && o.Rdev == st.Rdev
		}
		return o.Dev == st.Dev && o.Ino == st.Ino
	}
	out, err := fdOpeners(same)
	if err != nil {
		return nil, err
	}
	if !isBlock {
		return out, nil
	}
	major, minor := unixMajor(st.Rdev), unixMinor(st.Rdev)
	mounts, err := mountOpeners(major, minor)
	if err != nil {
		return nil, err
	}
	out = append(out, mounts...)
	holders, _ := os.ReadDir(fmt.Sprintf("/sys/dev/block/%d:%d/holders", major, minor))
	for _, h := range holders {
		out = append(out, Opener{Write: true, What: "holder " + h.Name()})
	}
	return out, nil
}

func fdOpeners(same func(*syscall.Stat_t) bool) ([]Opener, error) {
	procs, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("device openers: %w", err)
	}
	var out []Opener
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := filepath.Join(procRoot, p.Name(), "fd")
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue // gone, or not ours to read
		}
		for _, fd := range fds {
			var fst syscall.Stat_t
			if syscall.Stat(filepath.Join(fdDir, fd.Name()), &fst) != nil || !same(&fst) {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join(procRoot, p.Name(), "comm"))
			out = append(out, Opener{
				PID:     pid,
				Command: strings.TrimSpace(string(comm)),
				Write:   fdWritable(filepath.Join(procRoot, p.Name(), "fdinfo", fd.Name())),
				What:    "fd " + fd.Name(),
			})
		}
	}
	return out, nil
}

// fdWritable reads the open flags from fdinfo ("flags:\t0100002", octal).
// Unreadable flags count as writable: the safe side.
func fdWritable(fdinfo string) bool {
	data, err := os.ReadFile(fdinfo)
	if err != nil {
		return true
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			f, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			if err != nil {
				return true
			}
			return f&syscall.O_ACCMODE != syscall.O_RDONLY
		}
	}
	return true
}

// mountOpeners lists the mounts of device major:minor from this process's
// mountinfo (a filesystem's st_dev is its device's number).
func mountOpeners(major, minor uint32) ([]Opener, error) {
	ms, err := mountinfo.ReadFile(filepath.Join(procRoot, "self", "mountinfo"))
	if err != nil {
		return nil, fmt.Errorf("device openers: %w", err)
	}
	var out []Opener
	for _, m := range ms {
		if uint32(m.Major) == major && uint32(m.Minor) == minor {
			out = append(out, Opener{Write: slices.Contains(m.MountOptions, "rw"), What: "mounted at " + m.MountPoint})
		}
	}
	return out, nil
}

// unixMajor and unixMinor decode a Linux dev_t (glibc's gnu_dev_major/minor).
func unixMajor(dev uint64) uint32 {
	return uint32((dev>>8)&0xfff) | uint32((dev>>32)&^0xfff)
}

func unixMinor(dev uint64) uint32 {
	return uint32(dev&0xff) | uint32((dev>>12)&^0xff)
}
