package drbdsim

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// Write writes data at off through the resource's DRBD device on this node,
// as an application on a Primary does. It returns once the write is on every
// connected diskful replica (protocol C): then, and only then, the write is
// acknowledged and the cluster remembers it (LostAckedWrites).
//
// Without quorum the write fails with EIO (on-no-quorum io-error) or blocks
// until quorum returns or ctx ends (suspend-io). A Primary without any
// UpToDate data in reach fails with EIO.
func (n *Node) Write(ctx context.Context, name string, off int64, data []byte) error {
	c := n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	for {
		if n.crashed {
			return ioErr("write", name, off, "node crashed")
		}
		r := n.res[name]
		if r == nil {
			return ioErr("write", name, off, "resource not up")
		}
		if r.role != rolePrimary {
			return fmt.Errorf("write %s at offset %d: device is Secondary (not opened for writing): %w", name, off, syscall.EROFS)
		}
		if r.cfg.Options.Resource.Quorum == drbd.QuorumOff || r.quorate {
			return r.writeLocked(off, data, false)
		}
		if r.cfg.Options.Resource.OnNoQuorum != drbd.OnNoQuorumSuspendIO {
			return ioErr("write", name, off, "no quorum (on-no-quorum io-error)")
		}
		if !r.suspendedQuorum {
			r.suspendedQuorum = true
			r.publish()
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("write %s at offset %d: suspended without quorum (on-no-quorum suspend-io): %w", name, off, err)
		}
		c.cond.Wait()
	}
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

// writeLocked is the replication of one write. localDone: the data is
// already in r's own replica (a loop-device write found at a sync point).
func (r *resource) writeLocked(off int64, data []byte, localDone bool) error {
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
		return ioErr("write", r.name, off, "no UpToDate data accessible (on-no-data-accessible io-error)")
	}
	if off < 0 || off+int64(len(data)) > ref.md.sizeBytes {
		return ioErr("write", r.name, off, fmt.Sprintf("beyond the end of the device (%d bytes)", ref.md.sizeBytes))
	}
	if len(data) == 0 {
		return nil
	}
	in := map[int]bool{}
	for _, h := range hs {
		in[h.nodeID()] = true
	}
	// A diskful replica that is reachable through the cluster but does not
	// receive this write is outdated by the writer (DRBD's weak nodes).
	for _, x := range c.component(r) {
		if !in[x.nodeID()] && x.attached() && x.disk == DiskUpToDate {
			x.setDisk(DiskOutdated)
			r.outdated()[x.nodeID()] = true
			x.publish()
		}
	}
	first, last := off/blockSize, (off+int64(len(data))-1)/blockSize
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
		if localDone && h == r {
			continue
		}
		if _, err := h.file.WriteAt(data, off); err != nil {
			return ioErr("write", r.name, off, "backing device: "+err.Error())
		}
	}
	kib := (int64(len(data)) + 1023) / 1024
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
		if h, err := ref.blockHash(b); err == nil {
			acked[b] = h
		}
	}
	r.publish()
	return nil
}

// Read reads through the DRBD device: from the local replica if UpToDate,
// else from a connected UpToDate peer.
func (n *Node) Read(ctx context.Context, name string, off int64, size int) ([]byte, error) {
	if err := n.begin(ctx, "read", name); err != nil {
		return nil, err
	}
	defer n.c.mu.Unlock()
	r := n.res[name]
	if r == nil {
		return nil, ioErr("read", name, off, "resource not up")
	}
	var src *resource
	for _, h := range n.c.holders(r) {
		if h.disk == DiskUpToDate {
			src = h
			break
		}
	}
	if src == nil {
		return nil, ioErr("read", name, off, "no UpToDate data accessible")
	}
	buf := make([]byte, size)
	m, err := src.file.ReadAt(buf, off)
	if err != nil && err != io.EOF {
		return nil, ioErr("read", name, off, err.Error())
	}
	kib := int64(m+1023) / 1024
	r.read += kib
	if src != r {
		if k := r.conns[src.nodeID()]; k != nil {
			k.received += kib
		}
	}
	return buf[:m], nil
}

// Sync propagates writes made through the Primary's loop device to the
// peers (see doc.go, "Block device"). A no-op without a loop device.
func (n *Node) Sync(ctx context.Context, name string) error {
	if err := n.begin(ctx, "sync", name); err != nil {
		return err
	}
	defer n.c.mu.Unlock()
	r := n.res[name]
	if r == nil {
		return unknownRes("sync", name)
	}
	if r.loop == "" {
		return nil
	}
	err := r.syncLoop()
	n.c.settle()
	return err
}

func (r *resource) blockHash(b int64) (uint64, error) {
	if r.file == nil {
		return 0, fmt.Errorf("not attached")
	}
	return hashBlock(r.file, b)
}

func hashBlock(f *os.File, b int64) (uint64, error) {
	buf := make([]byte, blockSize)
	m, err := f.ReadAt(buf, b*blockSize)
	if err != nil && err != io.EOF {
		return 0, err
	}
	return hashBytes(buf[:m]), nil
}

// setupLoop gives a new Primary a real block device: a loop device over
// its replica (diskful) or over a scratch copy of an UpToDate peer's data
// (diskless), limited to DRBD's usable size.
func (r *resource) setupLoop() error {
	c := r.n.c
	if c.opts.Dir == "" {
		return fmt.Errorf("drbdsim: Options.Dir is required with LoopDevices")
	}
	var src *resource
	for _, h := range c.holders(r) {
		if h.disk == DiskUpToDate {
			src = h
			break
		}
	}
	if src == nil {
		return fmt.Errorf("no UpToDate data for a loop device")
	}
	size := src.md.sizeBytes
	file := src.md.backing
	if src != r {
		file = filepath.Join(c.opts.Dir, "scratch", r.n.name, r.name+".img")
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return err
		}
		dst, err := os.Create(file)
		if err != nil {
			return err
		}
		_, err = io.Copy(dst, io.NewSectionReader(src.file, 0, size))
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("copy peer data for diskless Primary: %w", err)
		}
	}
	out, err := exec.Command("losetup", "--find", "--show", "--sizelimit", strconv.FormatInt(size, 10), file).CombinedOutput()
	if err != nil {
		return fmt.Errorf("losetup %s: %v: %s", file, err, strings.TrimSpace(string(out)))
	}
	r.loop = strings.TrimSpace(string(out))
	r.loopFile = file
	r.loopScratch = src != r
	link := filepath.Join(c.opts.Dir, "dev", r.n.name, "drbd"+strconv.Itoa(r.cfg.Minor))
	_ = os.MkdirAll(filepath.Dir(link), 0o755)
	_ = os.Remove(link)
	if err := os.Symlink(r.loop, link); err != nil {
		r.teardownLoop()
		return err
	}
	r.loopHashes, err = hashFile(file, size)
	if err != nil {
		r.teardownLoop()
		return err
	}
	return nil
}

func hashFile(path string, size int64) ([]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := make([]uint64, size/blockSize)
	err = eachBlock(f, int64(len(out)), func(b int64, data []byte) { out[b] = hashBytes(data) })
	return out, err
}

// eachBlock reads blocks [0, n) of f in 1 MiB chunks.
func eachBlock(f *os.File, n int64, fn func(b int64, data []byte)) error {
	const chunk = 256
	buf := make([]byte, chunk*blockSize)
	for b := int64(0); b < n; b += chunk {
		m, err := f.ReadAt(buf[:min(chunk, n-b)*blockSize], b*blockSize)
		if err != nil && err != io.EOF {
			return err
		}
		for i := 0; i*blockSize < m; i++ {
			end := min((i+1)*blockSize, m)
			fn(b+int64(i), buf[i*blockSize:end])
		}
	}
	return nil
}

func hashBytes(data []byte) uint64 {
	h := fnv.New64a()
	_, _ = h.Write(data)
	return h.Sum64()
}

// loopChanges flushes the loop device and returns the blocks that differ
// from the last sync point.
func (r *resource) loopChanges() (map[int64][]byte, error) {
	if dev, err := os.OpenFile(r.loop, os.O_RDWR, 0); err == nil {
		_ = dev.Sync()
		_ = dev.Close()
	}
	f, err := os.Open(r.loopFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[int64][]byte{}
	err = eachBlock(f, int64(len(r.loopHashes)), func(b int64, data []byte) {
		if hashBytes(data) != r.loopHashes[b] {
			out[b] = append([]byte(nil), data...)
		}
	})
	return out, err
}

// syncLoop replicates the loop device's changed blocks as writes. Without
// quorum (or data) it fails with EIO and keeps them pending.
func (r *resource) syncLoop() error {
	changes, err := r.loopChanges()
	if err != nil {
		return ioErr("sync", r.name, 0, err.Error())
	}
	if len(changes) == 0 {
		return nil
	}
	if r.cfg.Options.Resource.Quorum != drbd.QuorumOff && !r.quorate {
		return ioErr("sync", r.name, 0, fmt.Sprintf("%d changed blocks not replicated: no quorum", len(changes)))
	}
	localDone := !r.loopScratch
	// Contiguous changed blocks become one write, as the block layer would
	// have merged them.
	blocks := sortedBlocks(changes)
	for i := 0; i < len(blocks); {
		j := i
		var run []byte
		for j < len(blocks) && blocks[j] == blocks[i]+int64(j-i) && j-i < 256 {
			run = append(run, changes[blocks[j]]...)
			j++
		}
		if err := r.writeLocked(blocks[i]*blockSize, run, localDone); err != nil {
			return err
		}
		for _, b := range blocks[i:j] {
			r.loopHashes[b] = hashBytes(changes[b])
		}
		i = j
	}
	return nil
}

// alRecovery marks a crashed Primary's unsynced loop-device writes out of
// sync towards every peer, as DRBD's activity log does after a crash.
func (r *resource) alRecovery() {
	changes, err := r.loopChanges()
	if err != nil || r.md == nil || r.loopScratch {
		return
	}
	for b := range changes {
		for _, p := range r.cfg.Peers {
			if !p.Diskless {
				r.md.peer(p.NodeID).bits.set(b)
			}
		}
	}
}

func (r *resource) teardownLoop() {
	if r.loop == "" {
		return
	}
	_ = exec.Command("losetup", "-d", r.loop).Run()
	link := filepath.Join(r.n.c.opts.Dir, "dev", r.n.name, "drbd"+strconv.Itoa(r.cfg.Minor))
	_ = os.Remove(link)
	if r.loopScratch {
		_ = os.Remove(r.loopFile)
	}
	r.loop, r.loopFile, r.loopHashes, r.loopScratch = "", "", nil, false
}

func sortedBlocks(m map[int64][]byte) []int64 {
	out := make([]int64, 0, len(m))
	for b := range m {
		out = append(out, b)
	}
	slices.Sort(out)
	return out
}
