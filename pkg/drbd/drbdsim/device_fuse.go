package drbdsim

import (
	"context"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// deviceFS is the FUSE filesystem behind the Primaries' loop devices: a
// flat directory with one file per live device, "drbd<minor>@<node>". Each
// data request runs through the simulated DRBD under the cluster lock,
// which also orders the replicated writes (go-fuse runs handlers
// concurrently). Requests for a device that is no longer its resource's
// (demoted, down, crashed) fail with EIO.
type deviceFS struct {
	fuse.RawFileSystem
	c *Cluster
	d *devices
}

func (fs *deviceFS) String() string { return "drbdsim" }

func (fs *deviceFS) lookupIno(ino uint64) *device {
	fs.d.mu.Lock()
	defer fs.d.mu.Unlock()
	return fs.d.byIno[ino]
}

func (fs *deviceFS) fileAttr(dev *device, a *fuse.Attr) {
	a.Ino = dev.ino
	size := dev.size.Load()
	a.Size = uint64(size)
	a.Blocks = uint64(size) / 512
	a.Mode = syscall.S_IFREG | 0o600
	a.Nlink = 1
	a.Blksize = blockSize
}

func (fs *deviceFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if h.NodeId != rootIno {
		return fuse.ENOENT
	}
	fs.d.mu.Lock()
	dev := fs.d.byName[name]
	fs.d.mu.Unlock()
	if dev == nil {
		return fuse.ENOENT
	}
	// No entry or attribute caching: a name is reused by the next
	// promotion's device, and lookups are rare (losetup opens the file once).
	out.NodeId = dev.ino
	out.Generation = dev.ino
	fs.fileAttr(dev, &out.Attr)
	return fuse.OK
}

func (fs *deviceFS) Forget(uint64, uint64) {}

func (fs *deviceFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if in.NodeId == rootIno {
		out.Ino = rootIno
		out.Mode = syscall.S_IFDIR | 0o755
		out.Nlink = 2
		return fuse.OK
	}
	dev := fs.lookupIno(in.NodeId)
	if dev == nil {
		return fuse.ENOENT
	}
	fs.fileAttr(dev, &out.Attr)
	return fuse.OK
}

func (fs *deviceFS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if fs.lookupIno(in.NodeId) == nil {
		return fuse.ENOENT
	}
	return fuse.OK
}

func (fs *deviceFS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, _ *fuse.OpenOut) fuse.Status {
	if in.NodeId != rootIno {
		return fuse.ENOTDIR
	}
	return fuse.OK
}

// ReadDir lists the live devices (for a person looking at the mount).
func (fs *deviceFS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if in.Offset > 0 {
		return fuse.OK
	}
	fs.d.mu.Lock()
	defer fs.d.mu.Unlock()
	for _, name := range sortedKeys(fs.d.byName) {
		if !out.AddDirEntry(fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: fs.d.byName[name].ino}) {
			break
		}
	}
	return fuse.OK
}

func (fs *deviceFS) ReleaseDir(*fuse.ReleaseIn) {}

func (fs *deviceFS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	out.Bsize = blockSize
	out.NameLen = 255
	return fuse.OK
}

// Flush comes on close(2) of the file, not from the block layer (a cache
// flush arrives as FSYNC): nothing is buffered, so there is nothing to do.
func (fs *deviceFS) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status { return fuse.OK }

func (fs *deviceFS) Release(<-chan struct{}, *fuse.ReleaseIn) {}

// request runs one data request of dev under the cluster lock, with the
// watchdog watching the wait for it — or, while losetup sets the device up
// (device.settingUp), setupFn without the lock.
func (fs *deviceFS) request(unique, ino uint64, fn, setupFn func(*device) error) fuse.Status {
	dev := fs.lookupIno(ino)
	if dev == nil {
		return fuse.EIO
	}
	if dev.settingUp.Load() {
		return errStatus(setupFn(dev))
	}
	fs.d.lockFor(fs.c, unique)
	err := fn(dev)
	fs.c.mu.Unlock()
	return errStatus(err)
}

func (fs *deviceFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	var m int
	st := fs.request(in.Unique, in.NodeId, func(dev *device) error {
		n := dev.n
		if n.crashed {
			return ioErr("read", dev.res, int64(in.Offset), "node crashed")
		}
		r := n.res[dev.res]
		if r == nil || (r.dev != dev && r.heldDev != dev) {
			return ioErr("read", dev.res, int64(in.Offset), "the device is gone (demoted, down or crashed)")
		}
		var err error
		m, err = r.readLocked(int64(in.Offset), buf[:min(int(in.Size), len(buf))])
		return err
	}, func(dev *device) error {
		off := int64(in.Offset)
		size := dev.size.Load()
		if off >= size {
			return nil
		}
		f, err := dev.src.openData()
		if err != nil {
			return err
		}
		defer f.Close()
		m, err = f.ReadAt(buf[:min(int64(in.Size), int64(len(buf)), size-off)], off)
		if err == io.EOF {
			err = nil
		}
		return err
	})
	if !st.Ok() {
		return nil, st
	}
	return fuse.ReadResultData(buf[:m]), fuse.OK
}

func (fs *deviceFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	off := int64(in.Offset)
	st := fs.request(in.Unique, in.NodeId, func(dev *device) error {
		return dev.n.ioLocked(cancelCtx(cancel), "write", dev.res, off, dev, func(r *resource) error { return r.writeLocked(off, data) })
	}, refuseDuringSetup)
	if !st.Ok() {
		return 0, st
	}
	return uint32(len(data)), fuse.OK
}

// Fsync is the block layer's cache flush (ext4's journal commits, fsync
// of a file on it). Writes are replicated before they complete, so it only
// has to pass the same checks as a write: EIO without quorum or data.
func (fs *deviceFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return fs.request(in.Unique, in.NodeId, func(dev *device) error {
		return dev.n.ioLocked(cancelCtx(cancel), "flush", dev.res, 0, dev, (*resource).flushLocked)
	}, func(*device) error { return nil })
}

// Fallocate carries the block layer's discards (punch-hole, mode 0x3) and
// write-zeroes (zero-range, 0x11): they change data, so they are replicated
// like writes. Plain allocation changes nothing a reader sees.
func (fs *deviceFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	off, size := int64(in.Offset), int64(in.Length)
	mode := in.Mode &^ unix.FALLOC_FL_KEEP_SIZE
	var zero bool
	switch mode {
	case 0:
	case unix.FALLOC_FL_PUNCH_HOLE, unix.FALLOC_FL_ZERO_RANGE:
		zero = true
	default:
		return fuse.ENOTSUP
	}
	return fs.request(in.Unique, in.NodeId, func(dev *device) error {
		return dev.n.ioLocked(cancelCtx(cancel), "fallocate", dev.res, off, dev, func(r *resource) error {
			if !zero {
				return nil
			}
			return r.zeroLocked(off, size)
		})
	}, refuseDuringSetup)
}

// refuseDuringSetup: nothing writes to a loop device before losetup made it.
func refuseDuringSetup(dev *device) error {
	return ioErr("write", dev.res, 0, "the device is still being set up")
}

// errStatus turns the simulator's IO errors into the errno the kernel
// passes on (EIO, EROFS, or EIO for a suspended write whose request was
// interrupted).
func errStatus(err error) fuse.Status {
	if err == nil {
		return fuse.OK
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return fuse.Status(errno)
	}
	if errors.Is(err, context.Canceled) {
		return fuse.EINTR
	}
	return fuse.EIO
}

// cancelCtx is a FUSE request's cancel channel as a context: it ends when
// the kernel interrupts the request (a suspended write's process is
// killed).
type cancelCtx <-chan struct{}

func (c cancelCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c cancelCtx) Done() <-chan struct{}       { return c }
func (c cancelCtx) Value(any) any               { return nil }
func (c cancelCtx) Err() error {
	select {
	case <-c:
		return context.Canceled
	default:
		return nil
	}
}
