package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/storage"
)

// Snapshots of a file pool are files <dir>/<name>.snap marked with
// user.meshvol.snapshot=<name> and user.meshvol.origin=<replica>. They are
// made by reflink (FICLONE) where the pool's file system shares extents (xfs
// with reflink, btrfs): instant and free until either side is written. On
// other file systems (ext4, tmpfs) they are a sparse copy: only the written
// parts are read and written, in time linear in them (docs/snapshots.md,
// "Pools"). A restore makes a volume from a snapshot the same way.
const (
	snapshotXattr  = "user.meshvol.snapshot"
	originXattr    = "user.meshvol.origin"
	snapshotSuffix = ".snap"
)

var _ storage.Snapshotter = (*Pool)(nil)

func (p *Pool) snapshotPath(name string) string { return filepath.Join(p.dir, name+snapshotSuffix) }

func xattr(path, key string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, key, buf)
	if errors.Is(err, unix.ENODATA) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("getxattr %s %s: %w", path, key, err)
	}
	return string(buf[:n]), nil
}

// ownedSnapshot returns the snapshot's origin and size, ErrNotFound when there is
// no file, ErrNotOwned when the file is not our snapshot of that name.
func (p *Pool) ownedSnapshot(op, name string) (origin string, size int64, err error) {
	path := p.snapshotPath(name)
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", 0, p.err(op, name, storage.ErrNotFound, "no snapshot file "+path, nil)
	}
	if err != nil {
		return "", 0, p.err(op, name, nil, "", err)
	}
	got, err := xattr(path, snapshotXattr)
	if err != nil {
		return "", 0, p.err(op, name, nil, "", err)
	}
	if !st.Mode().IsRegular() || got != name {
		return "", 0, p.err(op, name, storage.ErrNotOwned, fmt.Sprintf("%s is not marked %s=%q; refusing to use or remove it", path, snapshotXattr, name), nil)
	}
	origin, err = xattr(path, originXattr)
	if err != nil {
		return "", 0, p.err(op, name, nil, "", err)
	}
	return origin, st.Size(), nil
}

// CreateSnapshot implements storage.Snapshotter: a reflink or sparse copy of the
// replica's file, made under a temporary name and linked into place once whole.
func (p *Pool) CreateSnapshot(ctx context.Context, req storage.SnapshotRequest) (storage.Snapshot, error) {
	const op = "snapshot"
	if err := p.check(ctx, op, req.Name, 0, false); err != nil {
		return storage.Snapshot{}, err
	}
	if err := p.check(ctx, op, req.Replica, 0, false); err != nil {
		return storage.Snapshot{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if origin, size, err := p.ownedSnapshot(op, req.Name); err == nil {
		if origin != req.Replica {
			return storage.Snapshot{}, p.err(op, req.Name, storage.ErrAlreadyExists,
				fmt.Sprintf("snapshot %s exists but was taken of replica %q, not %q", req.Name, origin, req.Replica), nil)
		}
		return storage.Snapshot{Name: req.Name, Replica: origin, Pool: p.dir, SizeBytes: size}, nil
	} else if !errors.Is(err, storage.ErrNotFound) {
		return storage.Snapshot{}, err
	}
	if _, err := p.ownedFile(op, req.Replica); err != nil {
		return storage.Snapshot{}, err
	}
	if err := p.flushLoop(req.Replica); err != nil {
		return storage.Snapshot{}, p.err(op, req.Name, nil, "flushing the volume's loop device", err)
	}
	marks := map[string]string{snapshotXattr: req.Name, originXattr: req.Replica}
	size, err := p.copyInto(op, req.Name, p.path(req.Replica), p.snapshotPath(req.Name), marks, -1, -1)
	if err != nil {
		return storage.Snapshot{}, err
	}
	return storage.Snapshot{Name: req.Name, Replica: req.Replica, Pool: p.dir, SizeBytes: size}, nil
}

// DeleteSnapshot implements storage.Snapshotter.
func (p *Pool) DeleteSnapshot(ctx context.Context, name string) error {
	const op = "delete snapshot"
	if err := p.check(ctx, op, name, 0, false); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, _, err := p.ownedSnapshot(op, name); err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil
		}
		return err
	}
	if err := os.Remove(p.snapshotPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return p.err(op, name, nil, "", err)
	}
	return syncDir(p.dir)
}

// ListSnapshots implements storage.Snapshotter.
func (p *Pool) ListSnapshots(ctx context.Context, replica string) ([]storage.Snapshot, error) {
	const op = "list snapshots"
	if err := ctx.Err(); err != nil {
		return nil, p.err(op, "", storage.ErrTimeout, "", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	entries, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, p.err(op, "", storage.ErrPoolNotFound, "", err)
	}
	var out []storage.Snapshot
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), snapshotSuffix)
		if !ok || validateName(name) != nil {
			continue
		}
		origin, size, err := p.ownedSnapshot(op, name)
		if err != nil || (replica != "" && origin != replica) {
			continue
		}
		out = append(out, storage.Snapshot{Name: name, Replica: origin, Pool: p.dir, SizeBytes: size})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// flushLoop writes out what a writer of the replica's loop device left in the device's
// page cache (a process writing the block device rather than submitting bios, as the
// DRBD simulator does), so that the file holds every completed write. Callers hold p.mu.
func (p *Pool) flushLoop(replica string) error {
	d, found, err := p.device(replica)
	if err != nil || !found {
		return err
	}
	f, err := os.Open(d.path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// createFrom makes a replica's file from a snapshot: the snapshot's first
// src.DataBytes, zeros after them up to size.
func (p *Pool) createFrom(replica string, size int64, src *storage.Source) error {
	const op = "create"
	if err := validateName(src.Snapshot); err != nil {
		return p.err(op, replica, storage.ErrInvalidName, err.Error(), nil)
	}
	if _, err := os.Lstat(p.path(replica)); err == nil {
		return os.ErrExist
	}
	_, snapSize, err := p.ownedSnapshot(op, src.Snapshot)
	if err != nil {
		return err
	}
	if src.DataBytes <= 0 || src.DataBytes > snapSize {
		return p.err(op, replica, storage.ErrInvalidArgument,
			fmt.Sprintf("source data of %d bytes does not fit snapshot %s of %d bytes", src.DataBytes, src.Snapshot, snapSize), nil)
	}
	if size < src.DataBytes {
		return p.err(op, replica, storage.ErrInvalidArgument,
			fmt.Sprintf("a volume of %d bytes cannot hold the %d bytes of snapshot %s", size, src.DataBytes, src.Snapshot), nil)
	}
	_, err = p.copyInto(op, replica, p.snapshotPath(src.Snapshot), p.path(replica), map[string]string{ownerXattr: replica}, src.DataBytes, size)
	return err
}

// copyInto copies src to a temporary file marked with marks, cuts it to keep
// bytes when keep ≥ 0 and sizes it to size when size ≥ 0 (the cut part reads
// as zeros), then links it to dst. It returns the final size.
func (p *Pool) copyInto(op, name, src, dst string, marks map[string]string, keep, size int64) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, p.err(op, name, nil, "", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(p.dir, "."+filepath.Base(dst)+".tmp-*")
	if err != nil {
		return 0, p.err(op, name, nil, "", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	for k, v := range marks {
		if err := unix.Fsetxattr(int(tmp.Fd()), k, []byte(v), 0); err != nil {
			return 0, p.err(op, name, storage.ErrFailedPrecondition, "marking the copy", err)
		}
	}
	if err := cloneOrCopy(tmp, in); err != nil {
		return 0, p.err(op, name, nil, "copying "+src, err)
	}
	if keep >= 0 {
		if err := tmp.Truncate(keep); err != nil {
			return 0, p.err(op, name, nil, "", err)
		}
	}
	if size >= 0 {
		if err := tmp.Truncate(roundUp(size)); err != nil {
			return 0, p.err(op, name, storage.ErrInsufficientSpace, "", err)
		}
	}
	if err := tmp.Sync(); err != nil {
		return 0, p.err(op, name, nil, "", err)
	}
	st, err := tmp.Stat()
	if err != nil {
		return 0, p.err(op, name, nil, "", err)
	}
	if err := os.Link(tmp.Name(), dst); err != nil {
		if errors.Is(err, os.ErrExist) {
			return 0, os.ErrExist
		}
		return 0, p.err(op, name, nil, "", err)
	}
	return st.Size(), syncDir(p.dir)
}

// cloneOrCopy makes dst's content src's: a reflink when the file system can,
// else a copy of src's data extents only (SEEK_DATA/SEEK_HOLE), so holes stay
// holes.
func cloneOrCopy(dst, src *os.File) error {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		return nil
	}
	st, err := src.Stat()
	if err != nil {
		return err
	}
	size := st.Size()
	if err := dst.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.NewOffsetWriter(dst, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// Reflink reports whether the pool's file system makes snapshots and restores
// by reflink (true) or by copy (false), by trying it on two scratch files.
func (p *Pool) Reflink() bool {
	a, err := os.CreateTemp(p.dir, ".reflink-probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(a.Name())
	defer a.Close()
	b, err := os.CreateTemp(p.dir, ".reflink-probe-*")
	if err != nil {
		return false
	}
	defer os.Remove(b.Name())
	defer b.Close()
	return unix.IoctlFileClone(int(b.Fd()), int(a.Fd())) == nil
}
