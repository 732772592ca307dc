package drbdsim

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// Write writes data at off through the resource's DRBD device on this node,
// as an application on a Primary does. It returns once the write is on every
// connected diskful replica (protocol C): then, and only then, the write is
// acknowledged and the cluster remembers it (LostAckedWrites).
//
// Without quorum the write fails with EIO (on-no-quorum io-error) or blocks
// until quorum returns or ctx ends (suspend-io). After SuspendIO it blocks
// until ResumeIO or ctx ends, quorum or not. A Primary without any
// UpToDate data in reach fails with EIO (on-no-data-accessible io-error),
// suspended or not, and so does a suspended write once that happens. A
// write to the Primary's block device (Options.LoopDevices) takes the same
// path.
func (n *Node) Write(ctx context.Context, name string, off int64, data []byte) error {
	n.c.mu.Lock()
	defer n.c.mu.Unlock()
	return n.ioLocked(ctx, "write", name, off, nil, func(r *resource) error { return r.writeLocked(off, data) })
}

// ioLocked runs one write-path request (a write, a zero-out, a flush) of
// the resource's device on this node, with c.mu held: refused on a crashed
// node, on a Secondary, on a device that is no longer the resource's (dev,
// when the request came through the block device), and without quorum as
// on-no-quorum says — suspend-io waits on c.cond (releasing c.mu) until
// quorum returns or ctx ends.
func (n *Node) ioLocked(ctx context.Context, op, name string, off int64, dev *device, do func(*resource) error) error {
	c := n.c
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		if n.crashed {
			return ioErr(op, name, off, "node crashed")
		}
		r := n.res[name]
		if r == nil {
			return ioErr(op, name, off, "resource not up")
		}
		if dev != nil && r.dev != dev {
			return ioErr(op, name, off, "the device is gone (demoted, down or crashed)")
		}
		if r.role != rolePrimary {
			return fmt.Errorf("%s %s at offset %d: device is Secondary (not opened for writing): %w", op, name, off, syscall.EROFS)
		}
		if !r.dataAccessible() && r.failsWithoutData() {
			// Suspended or not: DRBD fails the request, and releases those
			// it held, once no UpToDate data is in reach (a suspended
			// Primary outdated by a refused connect, refuseConnect).
			return ioErr(op, name, off, "no UpToDate data accessible (on-no-data-accessible io-error)")
		}
		why := "suspended by suspend-io"
		if !r.suspendedUser {
			if r.cfg.Options.Resource.Quorum == drbd.QuorumOff || r.quorate {
				return c.delayedAck(ctx, r, do(r))
			}
			if r.failsWithoutQuorum() {
				return ioErr(op, name, off, "no quorum (on-no-quorum io-error)")
			}
			if !r.suspendedQuorum {
				r.suspendedQuorum = true
				r.publish()
			}
			why = "suspended without quorum (on-no-quorum suspend-io)"
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%s %s at offset %d: %s: %w", op, name, off, why, err)
		}
		if dev != nil && c.devs.closing() {
			// Close unmounts the filesystems on the devices before it tears
			// them down: a write of theirs that waited here would hold the
			// unmount, and Close, for ever.
			return ioErr(op, name, off, why+", and the devices close (Cluster.Close)")
		}
		if stop == nil {
			// Registered only when waiting: for a FUSE request's
			// context it costs a goroutine.
			stop = context.AfterFunc(ctx, func() {
				c.mu.Lock()
				c.cond.Broadcast()
				c.mu.Unlock()
			})
		}
		c.cond.Wait()
	}
}

// delayedAck returns err, a completed request's outcome, once the slowest link the
// request crossed has carried its acknowledgment back (Cluster.SetLinkDelay): the
// replicas have the change already, the writer hears of it later. c.mu is released
// meanwhile, so the rest of the cluster runs on.
func (c *Cluster) delayedAck(ctx context.Context, r *resource, err error) error {
	d := c.replicationDelay(r)
	if err != nil || d <= 0 {
		return err
	}
	c.mu.Unlock()
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	c.mu.Lock()
	return nil
}

// holders are the replicas a write of r reaches: the local disk if
// attached, and every connected peer with an attached disk.
func (c *Cluster) holders(r *resource) []*resource {
	var out []*resource
	if r.attached() {
		out = append(out, r)
	}
	for _, k := range r.sortedConns() {
		if !k.connected() || k.repl == replOff {
			continue
		}
		if pr := c.peerResource(r, k); pr != nil && pr.attached() {
			out = append(out, pr)
		}
	}
	return out
}

// writeLocked is the replication of one write of data at off.
func (r *resource) writeLocked(off int64, data []byte) error {
	return r.replicateLocked("write", off, int64(len(data)), func(f *os.File) error {
		_, err := f.WriteAt(data, off)
		return err
	}, func(b int64) []byte { return data[b*blockSize-off:][:blockSize] })
}

// zeroLocked is the replication of a discard or a zero-out of size bytes
// at off (fallocate punch-hole or zero-range on the device, as mkfs and
// ext4 send them): afterwards every replica reads zeros there.
func (r *resource) zeroLocked(off, size int64) error {
	return r.replicateLocked("zero-out", off, size, func(f *os.File) error { return zeroRange(f, off, size) },
		func(int64) []byte { return zeroBlock[:] })
}

// flushLocked is a flush (fsync) of the device: every write before it is
// already on every reachable replica, so a flush only needs UpToDate data
// in reach, like any request.
func (r *resource) flushLocked() error {
	for _, h := range r.n.c.holders(r) {
		if h.disk == DiskUpToDate {
			return nil
		}
	}
	return ioErr("flush", r.name, 0, "no UpToDate data accessible (on-no-data-accessible io-error)")
}

// replicateLocked applies one change of size bytes at off to every replica
// the resource's writes reach (apply writes one replica's backing device)
// and does DRBD's bookkeeping: outdated unreachable peers, bitmaps towards
// absent ones, a new data generation, statistics, and the acknowledged
// content. block(b) is the new content of a block the change covers whole.
func (r *resource) replicateLocked(op string, off, size int64, apply func(*os.File) error, block func(b int64) []byte) error {
	c := r.n.c
	hs := c.holders(r)
	var ref *resource
	for _, h := range hs {
		if h.disk == DiskUpToDate {
			ref = h
			break
		}
	}
	if ref == nil {
		return ioErr(op, r.name, off, "no UpToDate data accessible (on-no-data-accessible io-error)")
	}
	if off < 0 || size < 0 || off+size > ref.md.sizeBytes {
		return ioErr(op, r.name, off, fmt.Sprintf("beyond the end of the device (%d bytes)", ref.md.sizeBytes))
	}
	if size == 0 {
		return nil
	}
	in := map[int]bool{}
	for _, h := range hs {
		in[h.nodeID()] = true
	}
	// A diskful replica that is reachable through the cluster but does not
	// receive this write is outdated by the writer (DRBD's weak nodes).
	outdated := false
	for _, x := range c.component(r) {
		if !in[x.nodeID()] && x.attached() && x.disk == DiskUpToDate {
			x.setDisk(DiskOutdated)
			r.outdated()[x.nodeID()] = true
			x.publish()
			outdated = true
		}
	}
	first, last := off/blockSize, (off+size-1)/blockSize
	// Bitmaps towards absent diskful peers, and a new generation when this
	// is the first write since one of them left.
	rotate := false
	for _, h := range hs {
		for _, p := range h.cfg.Peers {
			if p.Diskless || in[p.NodeID] {
				continue
			}
			pm := h.md.peer(p.NodeID)
			if pm.bitmapUUID == 0 {
				pm.bitmapUUID = h.md.current
			}
			if pm.bitmapUUID == h.md.current {
				rotate = true
			}
			for b := first; b <= last; b++ {
				pm.bits.set(b)
			}
			h.bmWrites++
		}
	}
	if rotate {
		u := c.newUUID()
		cur := ref.md.current
		for _, h := range hs {
			if h.md.current == cur {
				h.md.rotate(u)
			}
		}
	}
	for _, h := range hs {
		if err := h.applyData(apply); err != nil {
			return ioErr(op, r.name, off, "backing device: "+err.Error())
		}
	}
	kib := (size + 1023) / 1024
	for _, h := range hs {
		h.written += kib
		if h != r {
			if k := r.conns[h.nodeID()]; k != nil {
				k.sent += kib
			}
			if k := h.conns[r.nodeID()]; k != nil {
				k.received += kib
			}
		}
	}
	acked := c.acked[r.name]
	if acked == nil {
		acked = map[int64]uint64{}
		c.acked[r.name] = acked
	}
	for b := first; b <= last; b++ {
		if b*blockSize >= off && (b+1)*blockSize <= off+size {
			acked[b] = hashBytes(block(b)) // whole: no need to read it back
			continue
		}
		if h, err := ref.blockHash(b); err == nil {
			acked[b] = h
		}
	}
	// Statistics alone (written, sent, out-of-sync) are no state change:
	// DRBD prints them with the next one, not an events2 line per write —
	// a filesystem on the device would flood every events2 reader.
	if outdated {
		r.publish()
	}
	return nil
}

var zeroBlock [blockSize]byte

// zeroRange makes size bytes at off of a replica's backing device read as
// zeros: a hole punched into a file (which keeps sparse backing files
// sparse) or a discard that zeroes on a block device; written zeros where
// neither is supported.
func zeroRange(f *os.File, off, size int64) error {
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, size)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENODEV) {
		return err
	}
	zero := make([]byte, min(size, 1<<20))
	for done := int64(0); done < size; {
		m := min(int64(len(zero)), size-done)
		if _, err := f.WriteAt(zero[:m], off+done); err != nil {
			return err
		}
		done += m
	}
	return nil
}

// Read opens the DRBD device, reads and closes it: from the local replica if
// UpToDate, else from a connected UpToDate peer. Like DRBD 9.2 with
// auto-promote no (as meshvol renders it), only a Primary's device opens: a
// Secondary's refuses read-only opens with EMEDIUMTYPE (drbd_open; the VM
// tier's TestSecondaryCannotBeOpened saw it), so a replica's data is read
// where it is attached, never through a Secondary.
func (n *Node) Read(ctx context.Context, name string, off int64, size int) ([]byte, error) {
	if err := n.begin(ctx, "read", name); err != nil {
		return nil, err
	}
	defer n.c.mu.Unlock()
	r := n.res[name]
	if r == nil {
		return nil, ioErr("read", name, off, "resource not up")
	}
	if r.role != rolePrimary && !r.cfg.Options.Resource.AutoPromote {
		return nil, fmt.Errorf("read %s at offset %d: open of a Secondary's device refused (auto-promote no): %w", name, off, syscall.EMEDIUMTYPE)
	}
	buf := make([]byte, size)
	m, err := r.readLocked(off, buf)
	return buf[:m], err
}

// readLocked reads into buf at off from the local replica if UpToDate, else
// from a connected UpToDate peer (a diskless Primary, a SyncTarget). Without
// quorum a read fails under on-no-quorum io-error, as every request does
// (failsWithoutQuorum); under suspend-io reads go on.
func (r *resource) readLocked(off int64, buf []byte) (int, error) {
	if r.failsWithoutQuorum() {
		return 0, ioErr("read", r.name, off, "no quorum (on-no-quorum io-error)")
	}
	var src *resource
	for _, h := range r.n.c.holders(r) {
		if h.disk == DiskUpToDate {
			src = h
			break
		}
	}
	if src == nil {
		return 0, ioErr("read", r.name, off, "no UpToDate data accessible")
	}
	if off >= src.md.sizeBytes {
		return 0, nil
	}
	buf = buf[:min(int64(len(buf)), src.md.sizeBytes-off)]
	var m int
	err := src.applyData(func(f *os.File) error {
		var err error
		m, err = f.ReadAt(buf, off)
		return err
	})
	if err != nil && err != io.EOF {
		return m, ioErr("read", r.name, off, err.Error())
	}
	kib := int64(m+1023) / 1024
	r.read += kib
	if src != r {
		if k := r.conns[src.nodeID()]; k != nil {
			k.received += kib
		}
	}
	return m, nil
}

// applyData runs apply on r's backing device, opened for it alone (the
// simulator holds no descriptor per attached replica: claim.go).
func (r *resource) applyData(apply func(*os.File) error) error {
	if r.claim == nil {
		return fmt.Errorf("not attached")
	}
	f, err := r.claim.openData()
	if err != nil {
		return err
	}
	err = apply(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// blockHash hashes block b of r's backing device.
func (r *resource) blockHash(b int64) (uint64, error) {
	var h uint64
	err := r.applyData(func(f *os.File) error {
		var err error
		h, err = hashBlock(f, b)
		return err
	})
	return h, err
}

func hashBlock(f *os.File, b int64) (uint64, error) {
	buf := make([]byte, blockSize)
	m, err := f.ReadAt(buf, b*blockSize)
	if err != nil && err != io.EOF {
		return 0, err
	}
	return hashBytes(buf[:m]), nil
}

// hashSeed: block hashes are only compared within one process.
var hashSeed = maphash.MakeSeed()

func hashBytes(data []byte) uint64 { return maphash.Bytes(hashSeed, data) }
