package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/backingclaim"
)

// Loop devices are driven with ioctls (golang.org/x/sys/unix) rather than by
// running losetup:
//   - LOOP_CONFIGURE (Linux 5.8) binds the file and sets the flags in one call,
//     so no other process can see a half-configured device, and a race for the
//     same free device fails cleanly with EBUSY, which we retry;
//   - the outcome is an errno, not text to parse, and there is no child
//     process that can hang;
//   - the sandbox image needs no util-linux version with -J/--json.
// This is what losetup itself does since util-linux 2.36.

const (
	loopControl = "/dev/loop-control"
	sysBlock    = "/sys/block"
	// configureAttempts bounds the retries when another process takes the
	// free device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE.
	configureAttempts = 16
)

// deletedSuffix is what the kernel appends to the name of a removed file.
const deletedSuffix = " (deleted)"

// loopDev is an attached loop device.
type loopDev struct {
	index int
	path  string // /dev/loopN
}

// loopScans counts backingFiles' scans of every loop device of the machine, and
// sysfsReads the loop devices' sysfs entries read (a scan's and boundTo's): what
// the tests and the benchmark hold the pool to, whatever the machine's load.
var loopScans, sysfsReads atomic.Int64

// backingFiles maps each attached loop device to its backing file path as the
// kernel shows it in /sys/block/loopN/loop/backing_file (present only while
// the device is bound). A deleted backing file shows as "<path> (deleted)". It
// looks at every loop device of the machine, so the pool calls it once, when
// its first Pool of a directory is made (index); loopScans counts the calls
// (tests hold the pool to that). It stops with ctx's error when ctx ends: a
// machine may have thousands of loop devices, bound or not.
func backingFiles(ctx context.Context) (map[string]loopDev, error) {
	loopScans.Add(1)
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, err
	}
	out := map[string]loopDev{}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		num, isLoop := strings.CutPrefix(e.Name(), "loop")
		n, err := strconv.Atoi(num)
		if !isLoop || err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err != nil {
			// Not bound, or detached meanwhile.
			continue
		}
		sysfsReads.Add(1)
		out[strings.TrimSuffix(string(data), "\n")] = loopDev{index: n, path: "/dev/" + e.Name()}
	}
	return out, nil
}

// boundTo tells whether the loop device d is bound to the file at path, by
// the device's own status: its backing file's name in sysfs (a removed file
// shows as "<path> (deleted)", so a file that reuses a removed one's inode
// number is not taken for it) and, by LOOP_GET_STATUS64, its device and inode
// number (so a same-named file that replaced ours is not either). A device
// that was detached, or whose node is gone, is not bound.
//
// Of the sysfs name only the file's own name counts, not its directory: the
// kernel prints the path as the reader's mount namespace reaches the file,
// and relative to the mount the file was opened through when the reader
// cannot reach that mount. An agent in a pod attaches through the pod's own
// mount of the pool; the agent of the next pod (a restart, `helm upgrade`)
// reads another directory there, and must still find the device DRBD holds.
func boundTo(d loopDev, path string) (bool, error) {
	sysfsReads.Add(1)
	name, err := os.ReadFile(fmt.Sprintf("%s/loop%d/loop/backing_file", sysBlock, d.index))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // not bound to any file
	}
	if err != nil {
		return false, err
	}
	shown := strings.TrimSuffix(string(name), "\n")
	if strings.HasSuffix(shown, deletedSuffix) || filepath.Base(shown) != filepath.Base(path) {
		return false, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, err
	}
	if err := ensureNode(d.index); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil // the device itself is gone
		}
		return false, err
	}
	fd, err := unix.Open(d.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if errors.Is(err, unix.ENXIO) {
		return false, nil // detached
	}
	if err != nil {
		return false, fmt.Errorf("LOOP_GET_STATUS64 %s: %w", d.path, err)
	}
	return info.Inode == st.Ino && info.Device == st.Dev, nil
}

// ensureNode creates /dev/loopN when it is missing. Containers without udev
// get only the nodes that existed when /dev was populated; LOOP_CTL_GET_FREE
// may hand out a higher number. The device number comes from sysfs.
func ensureNode(n int) error {
	path := fmt.Sprintf("/dev/loop%d", n)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	data, err := os.ReadFile(fmt.Sprintf("%s/loop%d/dev", sysBlock, n))
	if err != nil {
		return fmt.Errorf("loop device %d: %w", n, err)
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(data)), "%d:%d", &major, &minor); err != nil {
		return fmt.Errorf("loop device %d: dev %q: %w", n, data, err)
	}
	if err := unix.Mknod(path, unix.S_IFBLK|0o660, int(unix.Mkdev(major, minor))); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	return nil
}

// attach binds path to a free loop device. No LO_FLAGS_AUTOCLEAR: the device
// must outlive the agent process (DRBD keeps using it across agent restarts).
// No direct I/O: it needs an O_DIRECT-capable file system under the pool, and
// loop already turns flushes into fsync of the file, which is what DRBD's
// write ordering relies on.
func attach(path string) (loopDev, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return loopDev{}, err
	}
	defer f.Close()
	ctl, err := os.OpenFile(loopControl, os.O_RDWR, 0)
	if err != nil {
		return loopDev{}, err
	}
	defer ctl.Close()
	for attempt := 0; attempt < configureAttempts; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return loopDev{}, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		if err := ensureNode(n); err != nil {
			return loopDev{}, err
		}
		d := loopDev{index: n, path: fmt.Sprintf("/dev/loop%d", n)}
		dev, err := os.OpenFile(d.path, os.O_RDWR, 0)
		if err != nil {
			return loopDev{}, err
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		// File_name is informational (64 bytes); sysfs shows the full path.
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], path)
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		dev.Close()
		if errors.Is(err, unix.EBUSY) {
			continue // another process took loopN first
		}
		if err != nil {
			return loopDev{}, fmt.Errorf("LOOP_CONFIGURE %s: %w", d.path, err)
		}
		return d, nil
	}
	return loopDev{}, fmt.Errorf("no free loop device after %d attempts (lost every race for one)", configureAttempts)
}

// errBusy is returned by detach for a device that someone holds open.
var errBusy = errors.New("device is open")

// detach unbinds a loop device. It first opens the device with O_EXCL: that
// fails with EBUSY while DRBD has it attached or a file system is mounted on
// it, and then nothing is changed. A device that is merely open (no
// exclusive claim) gets the kernel's deferred detach (LOOP_CLR_FD sets
// autoclear and returns 0); detach waits for it briefly and reports errBusy if
// it has not happened, so the caller keeps the file and retries.
func detach(d loopDev) error {
	fd, err := unix.Open(d.path, unix.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%s is held exclusively (DRBD attached or mounted): %w", d.path, errBusy)
	}
	if err != nil {
		return err
	}
	err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
	unix.Close(fd)
	if errors.Is(err, unix.ENXIO) {
		return nil // not bound any more
	}
	if err != nil {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", d.path, err)
	}
	bf := fmt.Sprintf("%s/loop%d/loop/backing_file", sysBlock, d.index)
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(bf); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s is still bound after LOOP_CLR_FD: another process has it open, it detaches when that process closes it: %w", d.path, errBusy)
}

// setCapacity makes the loop device pick up its backing file's new size.
func setCapacity(d loopDev) error {
	fd, err := unix.Open(d.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("LOOP_SET_CAPACITY %s: %w", d.path, err)
	}
	return nil
}

// deviceSize reads a block device's size in bytes: lseek to the end of a
// block device returns its size (the same value as BLKGETSIZE64, without an
// unsafe pointer).
func deviceSize(path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	size, err := unix.Seek(fd, 0, io.SeekEnd)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", path, err)
	}
	return size, nil
}

// claim takes the claim of a volume file of a pool of plain files (NewFiles)
// that a simulated DRBD holds while the file is its attached backing disk
// (drbdsim), as the kernel's DRBD claims its backing device: a lock on the
// file's byte of the directory's lock file (internal/backingclaim), so a volume
// in use is not removed from under it. It returns an error wrapping errBusy
// when another holder has the claim, else the function that releases it.
func claim(path string) (func(), error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	lock, err := backingclaim.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	if err := backingclaim.Take(lock, st.Ino); err != nil {
		lock.Close()
		if errors.Is(err, backingclaim.ErrClaimed) {
			return nil, fmt.Errorf("%s is claimed: a simulated DRBD has it attached: %w", path, errBusy)
		}
		return nil, err
	}
	return func() { lock.Close() }, nil
}
