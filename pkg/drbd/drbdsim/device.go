package drbdsim

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/loopdev"
	"github.com/meshvol/meshvol/internal/mountinfo"
)

// The Primary's block device (doc.go, "Block device"): a loop device over a
// file that drbdsim itself serves through FUSE, so that every read, write,
// fallocate and fsync the kernel sends to the loop device arrives in a
// handler that runs it through the simulated DRBD (device_fuse.go).
//
// The one rule that keeps this from deadlocking: nothing in drbdsim touches
// a loop device's data or a filesystem mounted on it while it holds the
// cluster lock, nor waits in the kernel for anything that may itself wait
// for such IO, because the kernel completes that IO only once a handler —
// which needs that lock — has run. The one command run under the lock,
// losetup -c on a resize, takes only its own loop device's lock and does no
// IO on another device. A promotion's losetup runs without the lock
// (setupDevice says why). losetup -d is different:
// LOOP_CLR_FD takes the kernel's one lock for all loop devices (the
// loop_validate_mutex), which a LOOP_CONFIGURE whose backing file is itself
// a loop device holds while it sets that device up, and that setup can wait
// for IO on it: the kubelet maps a block volume with `losetup -f
// /dev/drbdN`, /dev/drbdN is another Primary's loop device, and its IO (a
// FUSE FSYNC) waits for the cluster lock. A demotion's losetup -d under the
// lock once waited so for an FSYNC that waited for the lock, until the
// watchdog failed every device (docs/conformance-results.md). So a teardown
// only notes its loop device under the lock, and Cluster.unlock detaches it
// once the lock is released; Cluster.Close unmounts without the lock. A
// watchdog aborts the FUSE connection when a handler waits for the lock
// longer than Options.DeviceWatchdog, so that a mistake here fails IO with
// EIO instead of hanging the test, the writer and the kernel's journal
// thread in D state.

// device is one Primary's block device: the FUSE file and the loop device
// over it. Its fields are fixed at setup; the resource it belongs to points
// at it (resource.dev) while it is live, which is what the handlers check
// under the cluster lock.
type device struct {
	n     *Node
	res   string
	ino   uint64 // inode number of the FUSE file
	name  string // file name in the FUSE mount
	loop  string // /dev/loopN
	link  string // the DevicePath symlink
	minor int
	// size in bytes: DRBD's usable size (grows with Resize). Read by the
	// lock-free GETATTR handler.
	size atomic.Int64
	// settingUp is set while Primary runs losetup (without the cluster
	// lock: setupDevice). The kernel flushes the file when it switches the
	// loop device to direct IO (an FSYNC inside LOOP_CONFIGURE) and reads
	// it to scan it; the handlers answer those without the lock until setup
	// ends. Nothing can have been written through the device yet, and
	// with one Primary nothing else writes src's data, so its file is read
	// as is (with allow-two-primaries, the other Primary's writes are read
	// as they land, as on DRBD).
	settingUp atomic.Bool
	// src is the backing device the setup's requests read from (an
	// UpToDate replica's, when the setup began), opened for each (claim.go).
	src *claim
}

// devices is a cluster's FUSE server and its device files.
type devices struct {
	// mu guards the fields below. It is never held while calling into the
	// cluster (which takes c.mu), and c.mu may be held while taking it.
	mu      sync.Mutex
	mnt     string
	srv     *fuse.Server
	connDir string // /sys/fs/fuse/connections/<N>, the abort switch
	byIno   map[uint64]*device
	byName  map[string]*device
	nextIno uint64
	waiting map[uint64]time.Time // FUSE request id -> since when it waits for c.mu
	aborted error                // set once the watchdog aborted the connection
	stopDog chan struct{}
	dogDone chan struct{}
	timeout time.Duration
	closed  bool
}

const rootIno = 1

// DefaultDeviceWatchdog is how long a device handler may wait for the
// cluster lock before the watchdog aborts the FUSE connection.
const DefaultDeviceWatchdog = 30 * time.Second

// fuseMount returns the cluster's FUSE server, mounting it on first use
// under Options.Dir/fuse. Called with c.mu held: mounting does no IO on a
// loop device.
func (c *Cluster) fuseMount() (*devices, error) {
	if c.devs != nil && c.devs.srv != nil {
		return c.devs, nil
	}
	if c.devs != nil && c.devs.closed {
		return nil, fmt.Errorf("drbdsim: the cluster's devices were closed (Cluster.Close)")
	}
	if c.opts.Dir == "" {
		return nil, fmt.Errorf("drbdsim: Options.Dir is required with LoopDevices")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return nil, fmt.Errorf("drbdsim: LoopDevices needs /dev/fuse (modprobe fuse): %w", err)
	}
	d := &devices{mnt: filepath.Join(c.opts.Dir, "fuse"), byIno: map[uint64]*device{}, byName: map[string]*device{},
		nextIno: rootIno + 1, waiting: map[uint64]time.Time{}, timeout: c.opts.DeviceWatchdog}
	if d.timeout == 0 {
		d.timeout = DefaultDeviceWatchdog
	}
	if err := cleanStale(d.mnt); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.mnt, 0o755); err != nil {
		return nil, err
	}
	// go-fuse opens /dev/fuse without O_CLOEXEC when it mounts by itself:
	// every child (losetup, mkfs, a test's dd) would inherit it and keep
	// the FUSE connection alive after this process died, and a child
	// blocked on the device would then wait for itself forever. Hold off
	// every fork until the descriptor is close-on-exec.
	syscall.ForkLock.RLock()
	srv, err := fuse.NewServer(&deviceFS{RawFileSystem: fuse.NewDefaultRawFileSystem(), c: c, d: d}, d.mnt, &fuse.MountOptions{
		// As root go-fuse calls mount(2) itself; there is no fusermount
		// to fall back to, and a silent fallback would hide the reason.
		DirectMountStrict: true,
		FsName:            "drbdsim",
		Name:              "drbdsim",
		// One handler call per MiB of a large write instead of per 128 KiB.
		MaxWrite: fuse.MAX_KERNEL_WRITE,
		// go-fuse never asks for the kernel's writeback cache
		// (CAP_WRITEBACK_CACHE), so the file is write-through: a write
		// returns only after the Write handler did.
	})
	if err == nil {
		err = closeOnExecFuseFDs()
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		if srv != nil {
			_ = srv.Unmount()
		}
		return nil, fmt.Errorf("drbdsim: mount the device filesystem on %s: %w", d.mnt, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		_ = srv.Unmount()
		return nil, fmt.Errorf("drbdsim: mount the device filesystem on %s: %w", d.mnt, err)
	}
	d.srv = srv
	var st unix.Stat_t
	if err := unix.Stat(d.mnt, &st); err == nil {
		d.connDir = fmt.Sprintf("/sys/fs/fuse/connections/%d", unix.Minor(st.Dev))
	}
	if d.timeout > 0 {
		d.stopDog, d.dogDone = make(chan struct{}), make(chan struct{})
		go d.watchdog()
	}
	c.devs = d
	return d, nil
}

// cleanStale removes what a process that served mnt left behind when it
// died without Close (a test binary killed at its timeout, a sandbox
// that crashed): filesystems on loop devices over its files, the loop
// devices, the dead FUSE mount. A mount there whose server still answers
// belongs to a live cluster using the same Options.Dir: an error.
func cleanStale(mnt string) error {
	if !isMountPoint(mnt) {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); !errors.Is(err, unix.ENOTCONN) {
		return fmt.Errorf("drbdsim: %s is the device filesystem of another live cluster (Options.Dir in use; stat: %v)", mnt, err)
	}
	var errs []error
	for _, loop := range loopsUnder(mnt) {
		for _, p := range slices.Backward(mountsOf(loop)) {
			// Nothing can be written back through a dead server; a lazy
			// unmount does not wait for it.
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("drbdsim: stale %s: unmount %s: %w", loop, p, err))
			}
		}
		_ = exec.Command("losetup", "-d", loop).Run()
		if !waitDetached(loop, mnt, 10*time.Second) {
			errs = append(errs, fmt.Errorf("drbdsim: stale %s over %s is still attached", loop, mnt))
		}
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		errs = append(errs, fmt.Errorf("drbdsim: unmount the stale %s: %w", mnt, err))
	}
	if len(errs) == 0 {
		log.Printf("drbdsim: removed the devices a dead process left on %s", mnt)
	}
	return errors.Join(errs...)
}

// isMountPoint reports whether path is a mount point (in mountinfo).
func isMountPoint(path string) bool {
	ms, err := mountinfo.Read()
	if err != nil {
		return false
	}
	return slices.ContainsFunc(ms, func(m mountinfo.Mount) bool { return m.MountPoint == path })
}

// closeOnExecFuseFDs marks every descriptor of this process on /dev/fuse
// close-on-exec (see fuseMount).
func closeOnExecFuseFDs() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || target != "/dev/fuse" {
			continue
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return fmt.Errorf("set close-on-exec on /dev/fuse (fd %d): %w", fd, err)
		}
	}
	return nil
}

// setupDevice gives a new Primary its block device: a FUSE file of DRBD's
// usable size and a loop device over it with direct IO, so that reads see
// what the simulator changes underneath (a resync) and nothing is cached
// twice. Called with c.mu held; it releases c.mu while losetup runs and
// holds it again when it returns.
//
// losetup runs without the lock because the kernel may make it wait for
// anything, IO on other devices included, whose handlers need the lock: a
// promotion's losetup once held the lock for over two minutes on a loaded
// machine, and the watchdog then failed every device of the cluster
// (docs/conformance-results.md). Meanwhile the resource is Primary with a
// device that is setting up (device.settingUp): its handlers answer without
// the lock, a second promotion waits for the first (Primary), and a
// demotion, Down or crash tears the device down as usual; the setup then
// finds it gone and detaches the loop device it made.
func (r *resource) setupDevice() error {
	c := r.n.c
	var src *resource
	for _, h := range c.holders(r) {
		if h.disk == DiskUpToDate {
			src = h
			break
		}
	}
	if src == nil {
		return fmt.Errorf("no UpToDate data for the device")
	}
	d, err := c.fuseMount()
	if err != nil {
		return err
	}
	d.mu.Lock()
	dev := &device{n: r.n, res: r.name, ino: d.nextIno, minor: r.cfg.Minor,
		name: "drbd" + strconv.Itoa(r.cfg.Minor) + "@" + r.n.name}
	dev.size.Store(src.md.sizeBytes)
	d.nextIno++
	dev.src = src.claim
	dev.settingUp.Store(true)
	d.byIno[dev.ino], d.byName[dev.name] = dev, dev
	d.mu.Unlock()
	r.dev = dev // the handlers serve it from here on
	file := filepath.Join(d.mnt, dev.name)
	size := dev.size.Load()

	hook := c.setupHook
	c.unlock()
	if hook != nil {
		hook()
	}
	loop, err := attachLoop(file)
	c.mu.Lock()

	dev.settingUp.Store(false)
	c.cond.Broadcast() // a promotion waiting for this one (Primary)
	if r.dev != dev || r.n.res[r.name] != r {
		// Demoted, taken down or crashed meanwhile: the teardown did not
		// know the loop device yet.
		if loop != "" {
			c.detach = append(c.detach, loop)
		}
		return fmt.Errorf("the device was torn down while losetup set it up")
	}
	if err != nil {
		r.teardownDevice()
		return err
	}
	dev.loop = loop
	if dev.size.Load() != size { // grown meanwhile (growDevice left it to us)
		if out, err := exec.Command("losetup", "-c", dev.loop).CombinedOutput(); err != nil {
			r.teardownDevice()
			return fmt.Errorf("losetup -c %s: %v: %s", dev.loop, err, strings.TrimSpace(string(out)))
		}
	}
	dev.link = c.devicePath(r.n.name, r.cfg.Minor)
	if err := os.MkdirAll(filepath.Dir(dev.link), 0o755); err != nil {
		r.teardownDevice()
		return err
	}
	_ = os.Remove(dev.link)
	if c.opts.DeviceNodes {
		var st unix.Stat_t
		if err := unix.Stat(dev.loop, &st); err != nil {
			r.teardownDevice()
			return fmt.Errorf("stat %s: %w", dev.loop, err)
		}
		if err := unix.Mknod(dev.link, unix.S_IFBLK|0o660, int(st.Rdev)); err != nil {
			r.teardownDevice()
			return fmt.Errorf("mknod %s: %w", dev.link, err)
		}
		return nil
	}
	if err := os.Symlink(dev.loop, dev.link); err != nil {
		r.teardownDevice()
		return err
	}
	return nil
}

// attachLoop makes a loop device over file with direct IO and returns its
// path. Without direct IO the loop driver reads through the FUSE file's
// page cache: a resync's changes would stay invisible to readers. No
// --sizelimit: the file has the device's size, and a resize only has to
// make the loop device re-read it (growDevice). On an error it detaches
// what losetup made and returns no device.
func attachLoop(file string) (string, error) {
	out, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", file).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("losetup %s: %v: %s", file, err, strings.TrimSpace(string(out)))
	}
	loop := strings.TrimSpace(string(out))
	if b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(loop), "loop", "dio")); err != nil || strings.TrimSpace(string(b)) != "1" {
		_ = exec.Command("losetup", "-d", loop).Run()
		return "", fmt.Errorf("losetup --direct-io=on %s: the loop device does not use direct IO (loop/dio %q, %v)", file, strings.TrimSpace(string(b)), err)
	}
	return loop, nil
}

// devicePath is DevicePath: <Options.DeviceDir(node)>/drbd<minor>.
func (c *Cluster) devicePath(node string, minor int) string {
	dir := filepath.Join(c.opts.Dir, "dev", node)
	if c.opts.DeviceDir != nil {
		dir = c.opts.DeviceDir(node)
	}
	return filepath.Join(dir, "drbd"+strconv.Itoa(minor))
}

// growDevice makes a Primary's device size bytes large after a resize
// (diskful or diskless: the size is the connected resource's): the FUSE
// file reports the new size, a stat makes the kernel fetch it (attributes
// are never cached), and losetup -c makes the loop device take it — no IO
// on the device, so the cluster lock may be held.
func (r *resource) growDevice(size int64) error {
	dev := r.dev
	if dev == nil || size <= dev.size.Load() {
		return nil
	}
	dev.size.Store(size)
	if dev.loop == "" {
		return nil // losetup still runs: setupDevice makes the loop device re-read the size
	}
	if _, err := os.Stat(filepath.Join(r.n.c.devs.mnt, dev.name)); err != nil {
		return err
	}
	if out, err := exec.Command("losetup", "-c", dev.loop).CombinedOutput(); err != nil {
		return fmt.Errorf("losetup -c %s: %v: %s", dev.loop, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// teardownDevice ends the resource's device: from now on its handlers fail
// with EIO, the DevicePath link goes, and the loop device is detached by
// Cluster.unlock once the lock is released (see the top of this file) — at
// once when nothing holds it, else (a filesystem still mounted, as after a
// crash) by the kernel when the last holder lets go. Called with c.mu held.
func (r *resource) teardownDevice() {
	dev := r.dev
	if dev == nil {
		return
	}
	r.dev = nil
	if r.heldDev != dev {
		r.n.c.forget(dev)
	}
	// A request suspended without quorum (suspend-io) waits on c.cond: wake
	// it, so that it fails with EIO now that its device is gone, instead of
	// holding its loop device, and the FUSE mount, forever.
	r.n.c.cond.Broadcast()
	if dev.link != "" {
		_ = os.Remove(dev.link)
	}
	if dev.loop != "" {
		r.n.c.detach = append(r.n.c.detach, dev.loop)
	}
}

// unlock releases the cluster lock, then detaches the loop devices that
// teardownDevice left to it (see the top of this file for why not under
// the lock). Every command that can tear a device down (Primary, Secondary,
// Down, Crash, Close) releases the lock through it, so the device is
// detached, or marked for auto-clear, when the command returns.
func (c *Cluster) unlock() {
	loops := c.detach
	c.detach = nil
	c.mu.Unlock()
	for _, loop := range loops {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			log.Printf("drbdsim: losetup -d %s: %v: %s", loop, err, strings.TrimSpace(string(out)))
		}
	}
}

// releaseHeld forgets the device a demotion left to a reader, once the
// reader closed it (or the node crashed, or the cluster closes): its
// requests fail with EIO from now on.
func (r *resource) releaseHeld(closed bool) {
	if r.heldDev == nil {
		return
	}
	// closed: the reader closed it. The kernel detaches an auto-clear loop
	// device in a work queue after the last close; wait for it, so that
	// the device is gone when Down returns (that needs no handler that
	// takes the lock).
	if closed && r.heldDev.loop != "" {
		waitDetached(r.heldDev.loop, r.n.c.devs.mnt, 5*time.Second)
	}
	r.n.c.forget(r.heldDev)
	r.heldDev = nil
}

// waitDetached waits until the loop device no longer has a backing file
// under dir (or the timeout passes) and reports whether it is detached.
func waitDetached(loop, dir string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if !slices.Contains(loopsUnder(dir), loop) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// forget removes dev from the FUSE directory: requests for it fail with EIO.
func (c *Cluster) forget(dev *device) {
	d := c.devs
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.byIno, dev.ino)
	if d.byName[dev.name] == dev {
		delete(d.byName, dev.name)
	}
}

// Close shuts down the cluster's block devices in the order that cannot
// hang: unmount every filesystem still mounted on a device (the node's
// kubelet would have), detach the loop devices, unmount the FUSE
// filesystem, stop its server. The cluster keeps running without devices;
// a later promotion with LoopDevices fails. Close without LoopDevices, or
// twice, does nothing. It returns the first thing that could not be
// cleaned up, and the watchdog's abort if there was one.
func (c *Cluster) Close() error {
	c.mu.Lock()
	d := c.devs
	if d == nil || d.closed {
		c.mu.Unlock()
		return nil
	}
	var devs []*device
	var loops []string // read under the lock: a setup in flight sets dev.loop
	for _, name := range c.nodeNames() {
		n := c.nodes[name]
		for _, res := range sortedKeys(n.res) {
			if r := n.res[res]; r.dev != nil {
				devs = append(devs, r.dev)
				if r.dev.loop != "" {
					loops = append(loops, r.dev.loop)
				}
				// Unmounting below sends the filesystem's last writes
				// through the handlers; they stay served until the
				// device is torn down.
			}
		}
	}
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	// Requests suspended (suspend-io, or without quorum) fail from now on:
	// the unmounts below would wait for them.
	c.cond.Broadcast()
	c.mu.Unlock()

	var errs []error
	// Without the lock: the filesystems' final writes go through the
	// handlers, which take it.
	for _, loop := range loops {
		if err := unmountAll(loop); err != nil {
			errs = append(errs, err)
		}
	}
	c.mu.Lock()
	for _, dev := range devs {
		if r := dev.n.res[dev.res]; r != nil && r.dev == dev {
			r.teardownDevice()
		}
	}
	for _, n := range c.nodes {
		for _, r := range n.res {
			r.releaseHeld(false)
		}
	}
	c.unlock()
	// Loop devices of crashed Primaries were detached with auto-clear;
	// they are gone once their filesystems were unmounted above. Any loop
	// device still over the FUSE mount keeps it busy: detach it too.
	held := false
	for _, loop := range loopsUnder(d.mnt) {
		if err := unmountAll(loop); err != nil {
			errs = append(errs, err)
		}
		// Detached now (losetup -d), or by the kernel's work queue once
		// the unmount above closed it (auto-clear): wait for either.
		_ = exec.Command("losetup", "-d", loop).Run()
		// The wait ends as soon as it is detached; the bound is for a
		// machine under heavy load, where the kernel's work queue lags.
		if !waitDetached(loop, d.mnt, 30*time.Second) {
			errs = append(errs, fmt.Errorf("drbdsim: %s is still attached to a file under %s (held open?)", loop, d.mnt))
			held = true
		}
	}
	if held {
		// Something nobody can close from here holds a loop device over the FUSE
		// mount (a filesystem unmounted lazily while its IO was suspended): its IO
		// fails with EIO once the connection is aborted below.
		log.Printf("drbdsim: a loop device still holds %s: aborting its FUSE connection", d.mnt)
	}
	if d.stopDog != nil {
		close(d.stopDog)
		<-d.dogDone
	}
	// The kernel ends the connection, and with it the server's read loops, only
	// when the last mount of it goes; a mount namespace made while it was mounted
	// (a kubecluster node's, unshare --mount, on a machine whose / is private)
	// holds a copy that no unmount here reaches, and the loops would wait for it
	// for ever. Nothing uses the devices any more: abort the connection. Without
	// fusectl the abort is a forced unmount, which also unmounts it here when no
	// loop device holds it.
	if err := d.abort(); err != nil {
		errs = append(errs, fmt.Errorf("drbdsim: aborting the FUSE connection of %s: %w", d.mnt, err))
	}
	if isMountPoint(d.mnt) {
		if err := unix.Unmount(d.mnt, 0); err != nil {
			errs = append(errs, fmt.Errorf("drbdsim: unmount %s: %w", d.mnt, err))
		}
	}
	stopped := make(chan struct{})
	go func() {
		d.srv.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(closeWait):
		errs = append(errs, fmt.Errorf("drbdsim: the FUSE server of %s still runs %s after its connection was aborted", d.mnt, closeWait))
	}
	d.mu.Lock()
	if d.aborted != nil {
		errs = append(errs, d.aborted)
	}
	d.mu.Unlock()
	return errors.Join(errs...)
}

// closeWait bounds how long Close waits for the FUSE server to stop.
const closeWait = time.Minute

// closing reports whether Close has begun: a device request no longer waits for
// suspended IO to resume.
func (d *devices) closing() bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// DeviceAborted returns why the watchdog aborted the FUSE connection (every
// device then fails IO with EIO), or nil.
func (c *Cluster) DeviceAborted() error {
	c.mu.Lock()
	d := c.devs
	c.mu.Unlock()
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.aborted
}

// lockFor takes c.mu for a FUSE request, registering the wait with the
// watchdog.
func (d *devices) lockFor(c *Cluster, unique uint64) {
	d.mu.Lock()
	d.waiting[unique] = time.Now()
	d.mu.Unlock()
	c.mu.Lock()
	d.mu.Lock()
	delete(d.waiting, unique)
	d.mu.Unlock()
}

// watchdog aborts the FUSE connection once a handler waited for the cluster
// lock longer than the timeout: the lock holder is then almost certainly
// waiting in the kernel for IO that needs that very handler. Aborting fails
// every outstanding and later request of the mount with an error (EIO
// through the loop device) and frees everything stuck in D state.
func (d *devices) watchdog() {
	defer close(d.dogDone)
	t := time.NewTicker(min(d.timeout/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-d.stopDog:
			return
		case now := <-t.C:
			d.mu.Lock()
			var oldest time.Time
			for _, since := range d.waiting {
				if oldest.IsZero() || since.Before(oldest) {
					oldest = since
				}
			}
			if oldest.IsZero() || now.Sub(oldest) < d.timeout || d.aborted != nil {
				d.mu.Unlock()
				continue
			}
			// Before the abort frees it: the goroutine that holds the
			// cluster lock, and what it waits for, is among these.
			stacks := make([]byte, 1<<20)
			stacks = stacks[:runtime.Stack(stacks, true)]
			err := d.abort()
			d.aborted = fmt.Errorf("drbdsim: device watchdog: a FUSE request waited %s for the cluster lock; aborted the FUSE connection of %s (every device now fails IO): %v",
				now.Sub(oldest).Round(time.Millisecond), d.mnt, err)
			log.Printf("%v; every goroutine before the abort:\n%s", d.aborted, stacks)
			d.mu.Unlock()
		}
	}
}

// abort aborts the FUSE connection: through fusectl when it is mounted,
// else with a forced unmount, whose first step in the kernel is the same
// abort (fuse_umount_begin), even when the mount is busy.
func (d *devices) abort() error {
	if d.connDir != "" {
		if err := os.WriteFile(filepath.Join(d.connDir, "abort"), []byte("1"), 0); err == nil {
			return nil
		}
	}
	err := unix.Unmount(d.mnt, unix.MNT_FORCE)
	if errors.Is(err, unix.EBUSY) {
		return nil // aborted, still mounted (the loop devices hold it)
	}
	return err
}

// unmountAll unmounts every mount of the block device dev (bind mounts
// too), the most recent first.
func unmountAll(dev string) error {
	var errs []error
	for _, p := range slices.Backward(mountsOf(dev)) {
		if err := unix.Unmount(p, 0); err != nil {
			errs = append(errs, fmt.Errorf("drbdsim: unmount %s (on %s): %w", p, dev, err))
		}
	}
	return errors.Join(errs...)
}

// mountsOf lists the mount points of the block device dev in mount order,
// matched by device number (mount(8) may have been given a symlink).
func mountsOf(dev string) []string {
	if dev == "" {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	ms, err := mountinfo.Read()
	if err != nil {
		return nil
	}
	var points []string
	for _, m := range ms {
		if uint32(m.Major) == unix.Major(st.Rdev) && uint32(m.Minor) == unix.Minor(st.Rdev) {
			points = append(points, m.MountPoint)
		}
	}
	return points
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	var out []string
	for _, l := range loopdev.Under(dir) {
		out = append(out, l.Dev)
	}
	return out
}
