package csi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Growing file systems (NodeExpandVolume, and NodeStage for ext4).
//
// xfs grows only while mounted (xfs_growfs), which needs no privilege beyond
// the mount. ext4 grows online through the EXT4_IOC_RESIZE_FS ioctl, which
// the kernel allows only with CAP_SYS_RESOURCE: a node plugin without it
// (an unprivileged container, or this project's test machines) gets EPERM,
// resize2fs says "Permission denied to resize filesystem". Unmounted, ext4
// grows with resize2fs writing the device itself, which needs no capability;
// so NodeStage grows an ext4 that is smaller than its device before it
// mounts it, and NodeExpandVolume answers FailedPrecondition when the online
// way is refused. The kubelet takes FailedPrecondition from NodeExpandVolume
// as "this volume cannot grow while in use": it records the message on the
// PVC (condition NodeResizeError) and expands again at the next mount,
// where our NodeStage has already grown it.

// errOnlineExt4Refused marks resize2fs's EPERM on a mounted file system.
var errOnlineExt4Refused = errors.New("resize2fs: Permission denied to resize filesystem")

// growMounted grows the fs file system on dev, mounted at path, to the
// device's size. Growing a file system that already fills its device is a
// no-op for both tools.
func growMounted(ctx context.Context, dev, path, fs string) error {
	var cmd *exec.Cmd
	switch fs {
	case "ext4", "ext3":
		cmd = exec.CommandContext(ctx, "resize2fs", dev)
	case fsXFS:
		cmd = exec.CommandContext(ctx, "xfs_growfs", "-d", path)
	default:
		return status.Errorf(codes.Internal, "the device %s holds a %s file system, which meshvol cannot grow", dev, fs)
	}
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	if bytes.Contains(out, []byte("Permission denied to resize filesystem")) {
		return errOnlineExt4Refused
	}
	return status.Errorf(codes.Internal, "%s: %v: %s", strings.Join(cmd.Args, " "), err, bytes.TrimSpace(out))
}

// onlineExt4Refused is NodeExpandVolume's answer when the kernel refused to
// grow a mounted ext4.
func onlineExt4Refused(dev, path string, size int64) error {
	return status.Errorf(codes.FailedPrecondition,
		"the ext4 file system on %s, mounted at %s, cannot grow while mounted: the kernel refused online growth "+
			"(resize2fs: Permission denied to resize filesystem), because this node plugin lacks CAP_SYS_RESOURCE. "+
			"The device already has %d bytes; the file system grows to them when the volume is next staged "+
			"(restart the pods that use it), or give the node plugin CAP_SYS_RESOURCE for online growth",
		dev, path, size)
}

// growExtOffline grows an unmounted ext4 on dev to the device's size, if
// resize2fs would grow it: e2fsck -f first (resize2fs refuses a file system
// not checked since it was last mounted), then resize2fs. It reports whether
// it grew. The check runs only when there is something to gain, since
// e2fsck -f of a large file system takes minutes.
func growExtOffline(ctx context.Context, dev string) (bool, error) {
	g, err := extGeometryOf(ctx, dev)
	if err != nil {
		return false, err
	}
	devBytes, err := deviceSize(dev)
	if err != nil {
		return false, status.Errorf(codes.Internal, "reading the size of %s: %v", dev, err)
	}
	if g.grownBlocks(devBytes) <= g.blocks {
		return false, nil
	}
	fsBytes := g.blocks * g.blockSize
	fsck := exec.CommandContext(ctx, "e2fsck", "-f", "-p", dev)
	out, err := fsck.CombinedOutput()
	var ee *exec.ExitError
	// Exit 1: errors found and corrected; anything above needs a person.
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		return false, status.Errorf(codes.FailedPrecondition, "e2fsck -f -p %s before growing the file system from %d to %d bytes: %v: %s; "+
			"the file system needs a manual check, it was neither grown nor mounted", dev, fsBytes, devBytes, err, bytes.TrimSpace(out))
	}
	if out, err := exec.CommandContext(ctx, "resize2fs", dev).CombinedOutput(); err != nil {
		return false, status.Errorf(codes.Internal, "resize2fs %s (from %d to %d bytes): %v: %s", dev, fsBytes, devBytes, err, bytes.TrimSpace(out))
	}
	return true, nil
}

// extGeometry is what dumpe2fs -h says about an ext2/3/4 file system's size
// and block groups.
type extGeometry struct {
	blocks, blockSize, firstBlock, blocksPerGroup int64
	reservedGDT, inodeBlocksPerGroup, descSize    int64
}

// grownBlocks is how many blocks resize2fs would make the file system on a
// device of devBytes: all of them, except that, like mke2fs, it drops a last
// block group too small to hold its own metadata and 50 blocks (which is why
// a fresh file system is often up to a few MiB short of its device). The
// metadata is bounded from above (a superblock and descriptor backup, the
// reserved descriptor blocks, two bitmaps, the inode table), so a file system
// short of its device by such a tail is left alone rather than checked at
// every stage.
func (g extGeometry) grownBlocks(devBytes int64) int64 {
	n := devBytes / g.blockSize
	if g.blocksPerGroup <= 0 || n <= g.blocks {
		return n
	}
	groups := (n - g.firstBlock + g.blocksPerGroup - 1) / g.blocksPerGroup
	gdt := (groups*g.descSize + g.blockSize - 1) / g.blockSize
	overhead := 1 + gdt + g.reservedGDT + 2 + g.inodeBlocksPerGroup
	if last := (n - g.firstBlock) % g.blocksPerGroup; last > 0 && last < overhead+50 {
		n -= last
	}
	return n
}

// extGeometryOf reads an ext2/3/4 file system's superblock.
func extGeometryOf(ctx context.Context, dev string) (extGeometry, error) {
	out, err := exec.CommandContext(ctx, "dumpe2fs", "-h", dev).Output()
	if err != nil {
		return extGeometry{}, status.Errorf(codes.Internal, "dumpe2fs -h %s: %v", dev, err)
	}
	g := extGeometry{descSize: 32}
	fields := map[string]*int64{
		"Block count": &g.blocks, "Block size": &g.blockSize, "First block": &g.firstBlock,
		"Blocks per group": &g.blocksPerGroup, "Reserved GDT blocks": &g.reservedGDT,
		"Inode blocks per group": &g.inodeBlocksPerGroup, "Group descriptor size": &g.descSize,
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if p := fields[k]; ok && p != nil {
			*p, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if g.blocks <= 0 || g.blockSize <= 0 {
		return extGeometry{}, status.Errorf(codes.Internal, "dumpe2fs -h %s: no block count and size in its output", dev)
	}
	return g, nil
}
