// Package backingclaim is the claim of a backing disk that is a plain file,
// shared by the simulated DRBD that holds it (pkg/drbd/drbdsim) and the file
// pool that must not remove it meanwhile (pkg/storage/file, NewFiles). The
// kernel's DRBD claims its backing block device exclusively while attached; a
// plain file has no such claim, so the two agree on this one.
//
// The protocol: every directory of claimable files has a lock file, LockFile,
// created by whichever side needs it first and never removed (a lock on a
// removed lock file would not be seen through its successor). A file is
// claimed while some open file description holds a write lock (fcntl
// F_OFD_SETLK) on the one byte of the lock file at the file's inode number
// (Offset). Open file description locks, unlike flock(2) on the file itself,
// let one descriptor hold the claims of many files: drbdsim holds one per
// simulated node and directory, not one per attached replica, which at 30,000
// replicas in one process exceeded the machine's open-file limit
// (docs/scale.md, "Seventh pass: 10,000 3D volumes held"). They are released
// one by one (Release) or all at once when that descriptor is closed, by its
// holder or by the end of its process, so a killed simulator leaves no claim
// behind. Unlike POSIX record locks (F_SETLK), two descriptions in one process
// conflict, as two flock(2)s did, so two simulated nodes in one process cannot
// claim one file; two claims through one description do not, so its holder
// must keep its own account of what it claimed (drbdsim does, per node).
//
// A claim names the inode, not the path: the file is the same however it is
// reached (a pod's mount of the pool, drbdsimd's), and a file renamed over a
// claimed one is not claimed. While a file is claimed its holder need not keep
// it open; an inode number freed by a removal outside the pool and reused by a
// new file would make that file look claimed until the claim ends, which can
// only keep a file, never lose one.
package backingclaim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// LockFile is the name of a directory's lock file. It starts with a dot, which
// no volume file of a pool may (pkg/storage/file, validateName).
const LockFile = ".drbd-claims"

// ErrClaimed is returned by Take when another open file description holds the
// claim.
var ErrClaimed = errors.New("claimed by another holder")

// Open opens, creating it if needed, the lock file of dir for reading and
// writing (a write lock needs a descriptor open for writing). It is
// close-on-exec, so a child process never inherits the claims.
func Open(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("claim lock file: %w", err)
	}
	return f, nil
}

// Offset is the byte of the lock file that stands for the file with inode
// number ino. A lock's offset is a signed 64-bit number; the top bit of an
// inode number is dropped (no file system the pools run on sets it), which at
// worst makes two files share a byte, so that one looks claimed while the
// other is: a Delete refused, never a claimed file removed.
func Offset(ino uint64) int64 { return int64(ino &^ (1 << 63)) }

// Take claims the file with inode number ino through lock, an Open lock file
// of the file's directory. It fails with ErrClaimed when another open file
// description holds the claim; through the same description it succeeds
// again.
func Take(lock *os.File, ino uint64) error {
	err := setLock(lock, ino, unix.F_WRLCK)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return ErrClaimed
	}
	return err
}

// Release ends the claim of the file with inode number ino taken through lock.
func Release(lock *os.File, ino uint64) error { return setLock(lock, ino, unix.F_UNLCK) }

func setLock(lock *os.File, ino uint64, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: Offset(ino), Len: 1}
	if err := unix.FcntlFlock(lock.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
		return fmt.Errorf("fcntl F_OFD_SETLK %s at %d: %w", lock.Name(), lk.Start, err)
	}
	return nil
}
