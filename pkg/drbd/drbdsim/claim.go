package drbdsim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/meshvol/meshvol/internal/backingclaim"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// DRBD claims its backing device exclusively while it is attached. For a
// backing disk that is a plain file, drbdsim takes the claim that a file pool
// of plain files tests before it removes a volume (internal/backingclaim): a
// lock on the file's byte of its directory's lock file, held through one
// descriptor per node and directory, not through the file itself. The file
// is opened only while the simulator reads or writes it (openData), so an
// attached replica holds no descriptor of its own, and a process can simulate
// more replicas than it may open files (30,000 at 10,000 3D volumes,
// docs/scale.md, "Seventh pass: 10,000 3D volumes held"). A block device is
// not locked but held open for as long as it is attached, as the kernel's
// DRBD holds it: the loop devices of a file pool tell whether they are in use
// by their open count (pkg/storage/file, detach), and udev may lock a block
// device while it probes it. Loop devices are far fewer than files on one
// machine anyway.

// claimDir is a node's lock file of one directory: open while the node has a
// file of the directory attached, closed with the last one, so that a node
// with nothing attached holds no descriptor.
type claimDir struct {
	dir  string
	lock *os.File
	// held: the inode numbers of the files claimed. Claims through one
	// descriptor never conflict with each other, so a second resource of
	// this node attaching the same file is refused from here.
	held map[uint64]bool
}

// claim is an attached replica's claim of its backing device.
type claim struct {
	path string
	dir  *claimDir // a plain file's lock file
	ino  uint64
	// device: a block device, held open while attached.
	device *os.File
}

// errClaimed: the backing device is claimed by another resource or another
// node, as DRBD finds it when the device is held exclusively.
var errClaimed = errors.New("already claimed")

// claimBacking claims the backing device at path for an attach, after it
// opened the device as attach does: a device that does not open is refused.
func (n *Node) claimBacking(path string) (*claim, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return &claim{path: path, device: f}, nil
	}
	_ = f.Close()
	ino, err := inode(st)
	if err != nil {
		return nil, err
	}
	// The directory as the pool names it: its real path (a symlink to the
	// file is claimed in its target's directory).
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(real)
	if n.claims == nil {
		n.claims = map[string]*claimDir{}
	}
	cd := n.claims[dir]
	if cd == nil {
		lock, err := backingclaim.Open(dir)
		if err != nil {
			return nil, err
		}
		cd = &claimDir{dir: dir, lock: lock, held: map[uint64]bool{}}
		n.claims[dir] = cd
	}
	if cd.held[ino] {
		n.dropIfUnused(cd)
		return nil, errClaimed
	}
	if err := backingclaim.Take(cd.lock, ino); err != nil {
		n.dropIfUnused(cd)
		if errors.Is(err, backingclaim.ErrClaimed) {
			return nil, errClaimed
		}
		return nil, err
	}
	cd.held[ino] = true
	return &claim{path: path, dir: cd, ino: ino}, nil
}

// release ends a claim (detach, down, crash).
func (n *Node) release(c *claim) {
	if c == nil {
		return
	}
	if c.device != nil {
		_ = c.device.Close()
		return
	}
	cd := c.dir
	delete(cd.held, c.ino)
	if len(cd.held) == 0 {
		// Closing the descriptor releases the lock too.
		n.dropIfUnused(cd)
		return
	}
	_ = backingclaim.Release(cd.lock, c.ino)
}

func (n *Node) dropIfUnused(cd *claimDir) {
	if len(cd.held) > 0 {
		return
	}
	_ = cd.lock.Close()
	delete(n.claims, cd.dir)
}

// openData opens the attached backing device for the simulator's reads and
// writes; the caller closes it when its batch of IO is done. A file that is no
// longer the claimed one (removed or replaced behind the claim) fails like a
// lost disk, so no IO ever reaches another file.
func (c *claim) openData() (*os.File, error) {
	f, err := os.OpenFile(c.path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	if c.dir == nil {
		return f, nil
	}
	st, err := f.Stat()
	if err == nil {
		var ino uint64
		if ino, err = inode(st); err == nil && ino != c.ino {
			err = fmt.Errorf("%s is not the attached file any more (inode %d, attached %d)", c.path, ino, c.ino)
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func inode(st os.FileInfo) (uint64, error) {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Ino, nil
	}
	return 0, fmt.Errorf("%s: no inode number", st.Name())
}

// attachRefused is attach's error for a backing device it cannot claim.
func attachRefused(res string, err error) error {
	if errors.Is(err, errClaimed) {
		return cmdErr(drbd.ErrCommandFailed, []string{"drbdsetup", "attach", res}, 0, 10,
			fmt.Sprintf("%s: Failure: (114) Lower device is already claimed. This usually means it is mounted.\n", res))
	}
	return cmdErr(drbd.ErrCommandFailed, []string{"drbdsetup", "attach", res}, 0, 10,
		fmt.Sprintf("%s: Failure: (104) Can not open backing device: %v\n", res, err))
}
