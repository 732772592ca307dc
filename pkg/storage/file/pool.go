// Package file provides backing volumes as sparse files in a directory, each
// attached to a loop device. It is meant for development, tests and the
// sandbox, where there is no spare disk for LVM; it is real block storage all
// the same (mkfs, mount and DRBD work on it).
//
// A pool made by NewFiles attaches nothing: each volume's device is its file
// itself, which only a simulated DRBD can use (drbdsim opens its backing disks
// as files; the kernel's DRBD needs a block device). It lets one machine hold
// the thousands of replicas of an in-process cluster at scale (docs/scale.md),
// where a loop device each would be thousands of kernel devices.
//
// Layout: <dir>/<replica>.img, a sparse file whose extended attribute
// user.meshvol.owner holds the replica name; in a pool of plain files also
// <dir>/.drbd-claims, the lock file of the files' claims (NewFiles). The attribute is the ownership
// mark: a file without it, or with another value, is never used, resized,
// detached or removed. New files are prepared under a temporary name and
// linked into place only once marked and sized, so a crash never leaves an
// unmarked file under a volume's name.
package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/storage"
)

const (
	ownerXattr = "user.meshvol.owner"
	suffix     = ".img"
	// AllocationUnit is what sizes are rounded up to: whole MiB keep the
	// device aligned for any file system and DRBD's 4 KiB blocks.
	AllocationUnit = 1 << 20
	maxSize        = 1 << 62
	// maxNameLen keeps "<name>.img" and its temporary ".<name>.img.tmp-N"
	// within NAME_MAX (255).
	maxNameLen = 200
)

// Pool is a directory of volume files.
type Pool struct {
	dir string
	*poolDir
}

// poolDir is what every Pool of one directory in this process shares: the
// agent makes a new Pool whenever the pool's definition changes, and one
// still in use must see the devices the other attached.
type poolDir struct {
	// mu serialises operations: one agent per node owns the pool, and within
	// it two reconciles of the same replica must not race an attach.
	mu sync.Mutex
	// plain says the volumes are their files themselves (NewFiles): no loop
	// device is attached, looked for or detached, and a volume is in use while
	// a process holds a lock on its file (inUse).
	plain bool
	// devices is the loop device of each attached volume file, by replica.
	// The first New of the directory fills it from the one scan of the
	// machine's loop devices the pool makes; the pool keeps it as it
	// attaches and detaches, and checks an entry against the device's own
	// status before each use. So no call costs more than the one device it
	// needs, however many loop devices the machine has.
	devices map[string]loopDev
	// sizes is the size of each volume file, by replica, for Capacity's
	// ProvisionedBytes: Capacity runs at every Lease renewal (every few
	// seconds), and a scan of the directory there cost every renewal, under
	// mu, a stat of every volume of the node. Nil until the first Capacity or
	// List scans the directory; Create, Resize and Delete keep it, and each
	// List, which scans anyway, renews it.
	sizes map[string]int64
}

// poolDirs holds the poolDir of each directory (by its real path) a Pool was
// made for. poolDirsLock guards it, and one open at a time scans the machine's
// loop devices (index): a channel of one, so that an open waits for it only as
// long as its context lives.
var (
	poolDirsLock = make(chan struct{}, 1)
	poolDirs     = map[string]*poolDir{}
)

var _ storage.Provider = (*Pool)(nil)

// New returns the pool in dir, which must exist. The first New of a directory in
// the process scans every loop device of the machine for the volumes' devices
// (index): seconds on a loaded machine with thousands of them, one directory at a
// time. It gives up with an error of kind storage.ErrTimeout when ctx ends first,
// so that an agent that stops does not wait for it (docs/operating.md, "Stopping
// an agent").
func New(ctx context.Context, dir string) (*Pool, error) { return open(ctx, dir, false) }

// NewFiles returns the pool in dir, which must exist, whose volumes are plain
// files with no loop device: a volume's DevicePath is its file. Only a
// simulated DRBD can attach such a volume (drbdsim); the package comment says
// why it exists. A volume is in use, and Delete refuses it, while its file is
// claimed, as drbdsim claims a file while it is its attached backing disk
// (DRBD's exclusive claim of its backing device). The protocol the two share
// (internal/backingclaim): the directory's lock file .drbd-claims, on which
// the holder of a claim keeps a write lock of its open file description
// (fcntl F_OFD_SETLK) on the byte at the file's inode number; Delete takes
// the same lock while it removes the file, so an attach meanwhile is refused.
// The lock file, not the volume file, carries the locks, so drbdsim holds one
// descriptor per node and directory rather than one per attached replica
// (docs/scale.md, "Seventh pass: 10,000 3D volumes held"). The lock file
// stays in the directory.
func NewFiles(ctx context.Context, dir string) (*Pool, error) { return open(ctx, dir, true) }

func open(ctx context.Context, dir string, plain bool) (*Pool, error) {
	abs, err := filepath.Abs(dir)
	if err == nil {
		// The kernel reports backing files by their real path: compare like
		// with like.
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, &storage.Error{Op: "configure", Pool: dir, Kind: storage.ErrPoolNotFound, Err: err}
	}
	st, err := os.Stat(abs)
	if err != nil || !st.IsDir() {
		return nil, &storage.Error{Op: "configure", Pool: dir, Kind: storage.ErrPoolNotFound, Detail: "not a directory", Err: err}
	}
	select {
	case poolDirsLock <- struct{}{}:
	case <-ctx.Done():
		return nil, &storage.Error{Op: "configure", Pool: dir, Kind: storage.ErrTimeout,
			Detail: "waiting for another pool's scan of the loop devices", Err: ctx.Err()}
	}
	defer func() { <-poolDirsLock }()
	if pd, ok := poolDirs[abs]; ok {
		if pd.plain != plain {
			return nil, &storage.Error{Op: "configure", Pool: dir, Kind: storage.ErrFailedPrecondition,
				Detail: "this process already uses the directory as a pool of the other kind (loop devices or plain files)"}
		}
		return &Pool{dir: abs, poolDir: pd}, nil
	}
	p := &Pool{dir: abs, poolDir: &poolDir{devices: map[string]loopDev{}, plain: plain}}
	if !plain {
		if err := p.index(ctx); err != nil {
			var kind error
			if ctx.Err() != nil {
				kind = storage.ErrTimeout
			}
			return nil, &storage.Error{Op: "configure", Pool: dir, Kind: kind, Detail: "finding the loop devices of its files", Err: err}
		}
	}
	poolDirs[abs] = p.poolDir
	return p, nil
}

// index records the loop devices bound to the pool's volume files (after an
// agent restart, DRBD still holds them), each verified by its own status:
// the file's name and its device and inode number, not the directory sysfs
// shows, which depends on the mount it was attached through (boundTo).
func (p *Pool) index(ctx context.Context) error {
	devs, err := backingFiles(ctx)
	if err != nil {
		return err
	}
	for shown, d := range devs {
		name, ok := strings.CutSuffix(filepath.Base(shown), suffix)
		if !ok || validateName(name) != nil {
			continue
		}
		if ok, err := boundTo(d, p.path(name)); err == nil && ok {
			p.devices[name] = d
		}
	}
	return nil
}

// device returns the loop device bound to the replica's file, from the
// index, checked against the device's status; a stale entry is dropped. In a
// pool of plain files it is the file itself, when there is one (index -1).
// Callers hold p.mu.
func (p *Pool) device(replica string) (loopDev, bool, error) {
	if p.plain {
		if _, err := os.Lstat(p.path(replica)); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return loopDev{}, false, nil
			}
			return loopDev{}, false, err
		}
		return loopDev{index: -1, path: p.path(replica)}, true, nil
	}
	d, ok := p.devices[replica]
	if !ok {
		return loopDev{}, false, nil
	}
	bound, err := boundTo(d, p.path(replica))
	if err != nil {
		return loopDev{}, false, err
	}
	if !bound {
		delete(p.devices, replica)
		return loopDev{}, false, nil
	}
	return d, true, nil
}

func (p *Pool) path(replica string) string { return filepath.Join(p.dir, replica+suffix) }

func (p *Pool) err(op, name string, kind error, detail string, cause error) *storage.Error {
	return &storage.Error{Op: op, Pool: p.dir, Name: name, Kind: kind, Detail: detail, Err: cause}
}

// validateName: file names that cannot escape the directory, hide as dot
// files, or collide with temporary names.
func validateName(name string) error {
	if name == "" {
		return errors.New("replica is empty")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("replica %q is %d characters, the limit is %d", name, len(name), maxNameLen)
	}
	if name[0] == '.' || name[0] == '-' {
		return fmt.Errorf("replica %q must not start with '.' or '-'", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("replica %q: character %q is not allowed (use A-Z a-z 0-9 . - _)", name, c)
		}
	}
	return nil
}

func roundUp(n int64) int64 {
	if r := n % AllocationUnit; r != 0 {
		n += AllocationUnit - r
	}
	return n
}

func (p *Pool) check(ctx context.Context, op, replica string, size int64, checkSize bool) error {
	if err := ctx.Err(); err != nil {
		return p.err(op, replica, storage.ErrTimeout, "", err)
	}
	if err := validateName(replica); err != nil {
		return p.err(op, replica, storage.ErrInvalidName, err.Error(), nil)
	}
	if checkSize && (size <= 0 || size > maxSize) {
		return p.err(op, replica, storage.ErrInvalidArgument, fmt.Sprintf("sizeBytes %d must be between 1 and %d", size, int64(maxSize)), nil)
	}
	return nil
}

// owner reads the ownership mark of path; "" when there is none.
func owner(path string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, ownerXattr, buf)
	if errors.Is(err, unix.ENODATA) {
		return "", nil
	}
	if errors.Is(err, unix.ERANGE) {
		return "", fmt.Errorf("%s: %s longer than %d bytes: not ours", path, ownerXattr, len(buf))
	}
	if err != nil {
		return "", fmt.Errorf("getxattr %s %s: %w", path, ownerXattr, err)
	}
	return string(buf[:n]), nil
}

// ownedFile checks that the replica's file exists, is a regular file and is
// marked for this replica. It returns its size.
func (p *Pool) ownedFile(op, replica string) (int64, error) {
	path := p.path(replica)
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, p.err(op, replica, storage.ErrNotFound, "no file "+path, nil)
	}
	if err != nil {
		return 0, p.err(op, replica, nil, "", err)
	}
	if !st.Mode().IsRegular() {
		return 0, p.err(op, replica, storage.ErrNotOwned, fmt.Sprintf("%s is a %v, not a regular file; refusing to use or remove it", path, st.Mode().Type()), nil)
	}
	got, err := owner(path)
	if err != nil {
		return 0, p.err(op, replica, nil, "", err)
	}
	if got != replica {
		detail := fmt.Sprintf("%s has no %s=%q", path, ownerXattr, replica)
		if got != "" {
			detail += fmt.Sprintf(" (it is marked for %q)", got)
		}
		return 0, p.err(op, replica, storage.ErrNotOwned, detail+"; refusing to use or remove it", nil)
	}
	return st.Size(), nil
}

// Create implements storage.Provider.
func (p *Pool) Create(ctx context.Context, req storage.CreateRequest) (storage.Volume, error) {
	const op = "create"
	if err := p.check(ctx, op, req.Replica, req.SizeBytes, true); err != nil {
		return storage.Volume{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	size := roundUp(req.SizeBytes)
	create := p.createFile
	if req.Source != nil {
		create = func(replica string, size int64) error { return p.createFrom(replica, size, req.Source) }
	}
	if err := create(req.Replica, size); err != nil && !errors.Is(err, os.ErrExist) {
		return storage.Volume{}, err
	}
	cur, err := p.ownedFile(op, req.Replica)
	if err != nil {
		return storage.Volume{}, err
	}
	p.sized(req.Replica, cur)
	if cur < req.SizeBytes {
		return storage.Volume{}, p.err(op, req.Replica, storage.ErrAlreadyExists,
			fmt.Sprintf("%s exists with %d bytes, less than the %d requested; resize it instead", p.path(req.Replica), cur, req.SizeBytes), nil)
	}
	return p.attached(op, req.Replica)
}

// createFile makes the marked, sized file under its final name, or returns an
// error wrapping os.ErrExist when the name is taken (by anything).
func (p *Pool) createFile(replica string, size int64) error {
	const op = "create"
	final := p.path(replica)
	if _, err := os.Lstat(final); err == nil {
		return os.ErrExist
	}
	tmp, err := os.CreateTemp(p.dir, "."+replica+suffix+".tmp-*")
	if err != nil {
		return p.err(op, replica, nil, "", err)
	}
	defer os.Remove(tmp.Name()) // after the link below, only the temporary name goes
	defer tmp.Close()
	if err := unix.Fsetxattr(int(tmp.Fd()), ownerXattr, []byte(replica), 0); err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return p.err(op, replica, storage.ErrFailedPrecondition, "the pool's file system does not support user extended attributes, which mark ownership", err)
		}
		return p.err(op, replica, nil, "", err)
	}
	// Sparse: truncate allocates nothing; blocks are allocated as DRBD writes.
	if err := tmp.Truncate(size); err != nil {
		if errors.Is(err, unix.EFBIG) {
			return p.err(op, replica, storage.ErrInsufficientSpace, fmt.Sprintf("the file system cannot hold a %d byte file", size), err)
		}
		return p.err(op, replica, nil, "", err)
	}
	if err := tmp.Sync(); err != nil {
		return p.err(op, replica, nil, "", err)
	}
	// link(2) fails if the final name exists: no window in which a second
	// creator could overwrite a volume, and no unmarked file ever carries the
	// final name.
	if err := os.Link(tmp.Name(), final); err != nil {
		if errors.Is(err, os.ErrExist) {
			return os.ErrExist
		}
		return p.err(op, replica, nil, "", err)
	}
	return syncDir(p.dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// attached returns the volume with its loop device, attaching the file when
// no device is bound to it (first use, or after a reboot).
func (p *Pool) attached(op, replica string) (storage.Volume, error) {
	path := p.path(replica)
	d, found, err := p.device(replica)
	if err != nil {
		return storage.Volume{}, p.err(op, replica, nil, "", err)
	}
	if !found {
		if d, err = attach(path); err != nil {
			return storage.Volume{}, p.err(op, replica, nil, "", err)
		}
		p.devices[replica] = d
	}
	size, err := deviceSize(d.path)
	if err != nil {
		return storage.Volume{}, p.err(op, replica, nil, "", err)
	}
	return storage.Volume{Replica: replica, Name: replica + suffix, Pool: p.dir, SizeBytes: size, DevicePath: d.path}, nil
}

// Get implements storage.Provider. It does not attach: a volume whose file
// exists but has no loop device (after a reboot) is returned with an empty
// DevicePath and its file size; Create attaches it again.
func (p *Pool) Get(ctx context.Context, replica string) (storage.Volume, error) {
	const op = "get"
	if err := p.check(ctx, op, replica, 0, false); err != nil {
		return storage.Volume{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	size, err := p.ownedFile(op, replica)
	if err != nil {
		return storage.Volume{}, err
	}
	v := storage.Volume{Replica: replica, Name: replica + suffix, Pool: p.dir, SizeBytes: size}
	d, found, err := p.device(replica)
	if err != nil {
		return storage.Volume{}, p.err(op, replica, nil, "", err)
	}
	if found {
		v.DevicePath = d.path
		if v.SizeBytes, err = deviceSize(d.path); err != nil {
			return storage.Volume{}, p.err(op, replica, nil, "", err)
		}
	}
	return v, nil
}

// Resize implements storage.Provider: grow the file, then tell the loop
// device (LOOP_SET_CAPACITY, what `losetup -c` does).
func (p *Pool) Resize(ctx context.Context, replica string, sizeBytes int64) (storage.Volume, error) {
	const op = "resize"
	if err := p.check(ctx, op, replica, sizeBytes, true); err != nil {
		return storage.Volume{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, err := p.ownedFile(op, replica)
	if err != nil {
		return storage.Volume{}, err
	}
	want := roundUp(sizeBytes)
	if want < cur {
		return storage.Volume{}, p.err(op, replica, storage.ErrShrinkNotSupported,
			fmt.Sprintf("%s has %d bytes, %d requested", p.path(replica), cur, sizeBytes), nil)
	}
	if want > cur {
		if err := os.Truncate(p.path(replica), want); err != nil {
			kind := error(nil)
			if errors.Is(err, unix.EFBIG) {
				kind = storage.ErrInsufficientSpace
			}
			return storage.Volume{}, p.err(op, replica, kind, "", err)
		}
		p.sized(replica, want)
	}
	v, err := p.attached(op, replica)
	if err != nil {
		return storage.Volume{}, err
	}
	if v.SizeBytes != want {
		d := loopDev{path: v.DevicePath}
		if err := setCapacity(d); err != nil {
			return storage.Volume{}, p.err(op, replica, nil, "", err)
		}
		if v.SizeBytes, err = deviceSize(d.path); err != nil {
			return storage.Volume{}, p.err(op, replica, nil, "", err)
		}
		if v.SizeBytes != want {
			return storage.Volume{}, p.err(op, replica, nil, fmt.Sprintf("%s reports %d bytes after LOOP_SET_CAPACITY, want %d", d.path, v.SizeBytes, want), nil)
		}
	}
	return v, nil
}

// Delete implements storage.Provider: detach, then remove the file. A device
// held by DRBD or a mount is ErrInUse and both stay as they are.
func (p *Pool) Delete(ctx context.Context, replica string) error {
	const op = "delete"
	if err := p.check(ctx, op, replica, 0, false); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	path := p.path(replica)
	if _, err := p.ownedFile(op, replica); err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil
		}
		return err
	}
	d, found, err := p.device(replica)
	if err != nil {
		return p.err(op, replica, nil, "", err)
	}
	switch {
	case p.plain:
		// Removed under the lock that tells whether a simulated DRBD holds it.
		unlock, err := claim(path)
		if err != nil {
			if errors.Is(err, errBusy) {
				return p.err(op, replica, storage.ErrInUse, err.Error(), nil)
			}
			return p.err(op, replica, nil, "", err)
		}
		defer unlock()
	case found:
		if err := detach(d); err != nil {
			if errors.Is(err, errBusy) {
				return p.err(op, replica, storage.ErrInUse, err.Error(), nil)
			}
			return p.err(op, replica, nil, "", err)
		}
		delete(p.devices, replica)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return p.err(op, replica, nil, "", err)
	}
	if p.sizes != nil {
		delete(p.sizes, replica)
	}
	return syncDir(p.dir)
}

// sized records a volume file's size for Capacity. Callers hold p.mu.
func (p *Pool) sized(replica string, size int64) {
	if p.sizes != nil {
		p.sizes[replica] = size
	}
}

// List implements storage.Provider: the marked files of the pool with their
// loop devices (empty DevicePath when detached), by name.
func (p *Pool) List(ctx context.Context) ([]storage.Volume, error) {
	const op = "list"
	if err := ctx.Err(); err != nil {
		return nil, p.err(op, "", storage.ErrTimeout, "", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out, err := p.files()
	if err != nil {
		return nil, err
	}
	for i := range out {
		d, found, err := p.device(out[i].Replica)
		if err != nil {
			return nil, p.err(op, out[i].Replica, nil, "", err)
		}
		if found {
			out[i].DevicePath = d.path
		}
	}
	return out, nil
}

// Names returns the replicas of the pool's volumes, by name, without their loop
// devices: what a sweep for orphaned volumes needs, without List's check of each
// volume's device (the agent's collector runs every minute over every volume).
func (p *Pool) Names(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, p.err("list", "", storage.ErrTimeout, "", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	vols, err := p.files()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(vols))
	for i, v := range vols {
		out[i] = v.Replica
	}
	return out, nil
}

// files lists the marked files of the pool, by name, without their devices.
// Callers hold p.mu.
func (p *Pool) files() ([]storage.Volume, error) {
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, p.err("list", "", storage.ErrPoolNotFound, "", err)
	}
	var out []storage.Volume
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || !e.Type().IsRegular() || validateName(name) != nil {
			continue
		}
		path := filepath.Join(p.dir, e.Name())
		if got, err := owner(path); err != nil || got != name {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, storage.Volume{Replica: name, Name: e.Name(), Pool: p.dir, SizeBytes: info.Size()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Replica < out[j].Replica })
	p.sizes = make(map[string]int64, len(out))
	for _, v := range out {
		p.sizes[v.Replica] = v.SizeBytes
	}
	return out, nil
}

// Capacity implements storage.Provider from statfs of the directory: Free is
// what unprivileged writers can still allocate (f_bavail). Files are sparse,
// so ProvisionedBytes (the sum of our volume sizes) may exceed it.
func (p *Pool) Capacity(ctx context.Context) (storage.Capacity, error) {
	if err := ctx.Err(); err != nil {
		return storage.Capacity{}, p.err("capacity", "", storage.ErrTimeout, "", err)
	}
	p.mu.Lock()
	provisioned := int64(0)
	if p.sizes == nil {
		if _, err := p.files(); err != nil {
			p.mu.Unlock()
			return storage.Capacity{}, err
		}
	}
	for _, size := range p.sizes {
		provisioned += size
	}
	p.mu.Unlock()
	var st unix.Statfs_t
	if err := unix.Statfs(p.dir, &st); err != nil {
		return storage.Capacity{}, p.err("capacity", "", storage.ErrPoolNotFound, "", err)
	}
	return storage.Capacity{Pool: p.dir, TotalBytes: int64(st.Blocks) * st.Bsize, FreeBytes: int64(st.Bavail) * st.Bsize,
		ProvisionedBytes: provisioned}, nil
}
