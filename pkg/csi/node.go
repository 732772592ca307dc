package csi

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	mount "k8s.io/mount-utils"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/mountinfo"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Node is the CSI node service of one node. It runs in the agent's process and only
// mounts: the agent makes the node's replica Primary when the controller marks it
// attached, and reports the device in the RVR's status.devicePath (docs/contract.md).
type Node struct {
	csipb.UnimplementedNodeServer
	// NodeName is this node; the node id and the topology.meshvol.io/node segment.
	NodeName string
	// Zone is the node's topology.kubernetes.io/zone, empty when it has none.
	Zone string
	// MaxVolumes is max_volumes_per_node; 0 leaves the limit to the CO.
	MaxVolumes int64
	// Client reads this node's RVRs (NewNodeClient).
	Client client.Reader
	// Mounter mounts; nil means mount.New("").
	Mounter mount.Interface

	guard inflight
}

func (n *Node) mounter() mount.Interface {
	if n.Mounter == nil {
		n.Mounter = mount.New("")
	}
	return n.Mounter
}

func (n *Node) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	seg := map[string]string{v1.TopologyKeyNode: n.NodeName}
	if n.Zone != "" {
		seg[v1.LabelZone] = n.Zone
	}
	return &csipb.NodeGetInfoResponse{
		NodeId:             n.NodeName,
		MaxVolumesPerNode:  n.MaxVolumes,
		AccessibleTopology: &csipb.Topology{Segments: seg},
	}, nil
}

func (n *Node) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_VOLUME_CONDITION,
		// SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER are served (one Primary
		// per node, published at one or many targets): NodePublish enforces the first.
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{
			Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// localRVR is this node's replica of the volume, nil if there is none.
func (n *Node) localRVR(ctx context.Context, vol string) (*v1.ReplicatedVolumeReplica, error) {
	var r v1.ReplicatedVolumeReplica
	if err := n.Client.Get(ctx, client.ObjectKey{Name: v1.ReplicaName(vol, n.NodeName)}, &r); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, internal("reading this node's replica of "+vol, err)
	}
	return &r, nil
}

// primaryDevice waits (bounded by ctx) until this node's replica is Primary and
// returns its device.
func (n *Node) primaryDevice(ctx context.Context, vol string) (string, error) {
	var last *v1.ReplicatedVolumeReplica
	err := waitRPC(ctx, func() (bool, error) {
		r, err := n.localRVR(ctx, vol)
		if err != nil {
			return false, err
		}
		last = r
		return r != nil && r.Status.Role == v1.RolePrimary && r.Status.DevicePath != "", nil
	}, func() string {
		if last == nil {
			return fmt.Sprintf("volume_id: volume %q has no replica on node %q yet; was it published here?", vol, n.NodeName)
		}
		return fmt.Sprintf("volume %q: the replica on node %q is not Primary yet (role %q, disk %q); a retry waits for it",
			vol, n.NodeName, last.Status.Role, last.Status.DiskState)
	})
	if err != nil {
		return "", err
	}
	return last.Status.DevicePath, nil
}

// mountAt returns the mount table's entry for path, nil if nothing is mounted there.
func (n *Node) mountAt(path string) (*mount.MountPoint, error) {
	mps, err := n.mounter().List()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading the mount table: %v", err)
	}
	path = filepath.Clean(path)
	var found *mount.MountPoint
	for i := range mps {
		if mps[i].Path == path {
			found = &mps[i] // the last one is the top of the stack
		}
	}
	return found, nil
}

func sameDevice(a, b string) bool {
	if a == b {
		return true
	}
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	return err1 == nil && err2 == nil && ra == rb
}

func (n *Node) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	vol, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireVolumeID(vol); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("staging_target_path: required")
	}
	if err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	release, err := n.guard.acquire(vol, "NodeStageVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	if r, err := n.localRVR(ctx, vol); err != nil {
		return nil, err
	} else if r == nil {
		return nil, status.Errorf(codes.NotFound, "volume_id: volume %q has no replica on node %q; publish it to this node first", vol, n.NodeName)
	}
	dev, err := n.primaryDevice(ctx, vol)
	if err != nil {
		return nil, err
	}
	mnt := req.GetVolumeCapability().GetMount()
	if mnt == nil {
		// A block volume is used straight from the device: nothing to stage.
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	fs := mnt.GetFsType()
	if fs == "" {
		fs = fsExt4
	}
	if mp, err := n.mountAt(path); err != nil {
		return nil, err
	} else if mp != nil {
		if !sameDevice(mp.Device, dev) {
			return nil, status.Errorf(codes.AlreadyExists, "staging_target_path: %s already holds %s, not volume %q's device %s", path, mp.Device, vol, dev)
		}
		if mp.Type != fs {
			return nil, status.Errorf(codes.AlreadyExists, "volume_capability.mount.fs_type: volume %q is staged with %s, not %s", vol, mp.Type, fs)
		}
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	if err := os.MkdirAll(path, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "staging_target_path: %v", err)
	}
	if err := formatIfEmpty(ctx, dev, fs); err != nil {
		return nil, err
	}
	// An ext4 smaller than its device (the volume grew while it was not
	// mounted, or online growth was refused: expand.go) grows now, while
	// that needs no privilege. Never for a read-only mount.
	if fs == fsExt4 && !slices.Contains(mnt.GetMountFlags(), "ro") {
		if _, err := growExtOffline(ctx, dev); err != nil {
			return nil, err
		}
	}
	opts := mnt.GetMountFlags()
	// A clone or a restored snapshot of an xfs volume holds its source's file
	// system, UUID included, and XFS refuses to mount a file system whose UUID
	// is already mounted on the node ("Filesystem has duplicate UUID"): the
	// source and its copy could never be used on one node.
	if fs == fsXFS && !slices.Contains(opts, "nouuid") {
		opts = append(slices.Clone(opts), "nouuid")
	}
	if err := n.mounter().Mount(dev, path, fs, opts); err != nil {
		return nil, status.Errorf(codes.Internal, "mounting %s (%s) at %s with %v: %v", dev, fs, path, opts, err)
	}
	return &csipb.NodeStageVolumeResponse{}, nil
}

// emptyProbeBytes is how much of a device must read as zeroes before it may be
// formatted. blkid already looks for every signature it knows anywhere it expects
// one; this catches what it does not know (a database, an image, encrypted data).
// 4 KiB is what every pool guarantees for a new volume: LVM zeroes the first 4 KiB
// of a new LV, thin volumes and sparse files read as zeroes throughout.
const emptyProbeBytes = 4096

// probeDevice returns the filesystem (TYPE) blkid finds on dev and any other
// signature it finds (a partition table, LVM, RAID, swap...).
func probeDevice(ctx context.Context, dev string) (fsType, other string, err error) {
	out, err := exec.CommandContext(ctx, "blkid", "-p", "-o", "export", dev).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return "", "", nil // blkid: nothing found
	}
	if err != nil {
		return "", "", status.Errorf(codes.Internal, "blkid -p %s: %v: %s", dev, err, bytes.TrimSpace(out))
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	switch {
	case kv["PTTYPE"] != "":
		return "", "partition table " + kv["PTTYPE"], nil
	case kv["USAGE"] == "filesystem" && kv["TYPE"] != "":
		return kv["TYPE"], "", nil
	case kv["TYPE"] != "":
		return "", kv["TYPE"] + " (" + kv["USAGE"] + ")", nil
	}
	return "", "unrecognised signature", nil
}

// readsEmpty reports whether the first emptyProbeBytes of dev are all zero.
func readsEmpty(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	buf := make([]byte, emptyProbeBytes)
	k, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return false, err
	}
	for _, b := range buf[:k] {
		if b != 0 {
			return false, nil
		}
	}
	return true, nil
}

// formatIfEmpty makes fs on dev only when dev holds no filesystem and reads as empty.
// A device with the wanted filesystem is left alone; anything else is refused with
// FailedPrecondition, because formatting it would destroy data.
func formatIfEmpty(ctx context.Context, dev, fs string) error {
	have, other, err := probeDevice(ctx, dev)
	if err != nil {
		return err
	}
	switch {
	case have == fs:
		return nil
	case have != "":
		return status.Errorf(codes.FailedPrecondition, "volume_capability.mount.fs_type: the device %s holds a %s filesystem, not %s; it is not reformatted", dev, have, fs)
	case other != "":
		return status.Errorf(codes.FailedPrecondition, "the device %s holds %s; refusing to format it", dev, other)
	}
	empty, err := readsEmpty(dev)
	if err != nil {
		return status.Errorf(codes.Internal, "reading %s: %v", dev, err)
	}
	if !empty {
		return status.Errorf(codes.FailedPrecondition, "the device %s holds data blkid does not recognise (its first %d bytes are not zero); refusing to format it", dev, emptyProbeBytes)
	}
	var cmd *exec.Cmd
	switch fs {
	case fsExt4:
		// -F: mkfs.ext4 asks before using a whole device; we have just checked it is empty.
		cmd = exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", dev)
	case fsXFS:
		// No -f: mkfs.xfs then refuses a device with any signature, a second guard.
		cmd = exec.CommandContext(ctx, "mkfs.xfs", "-q", dev)
	default:
		return invalid("volume_capability.mount.fs_type: %q is not supported", fs)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return status.Errorf(codes.Internal, "%s: %v: %s", strings.Join(cmd.Args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func (n *Node) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	vol, path := req.GetVolumeId(), req.GetStagingTargetPath()
	if err := requireVolumeID(vol); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("staging_target_path: required")
	}
	release, err := n.guard.acquire(vol, "NodeUnstageVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	if err := n.unmountAll(path); err != nil {
		return nil, err
	}
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

// unmountAll unmounts every layer stacked at path: a retry after a crash, or a
// kubelet that staged twice, may find more than one. No mount there is success.
func (n *Node) unmountAll(path string) error {
	for {
		mp, err := n.mountAt(path)
		if err != nil {
			return err
		}
		if mp == nil {
			return nil
		}
		if err := n.mounter().Unmount(path); err != nil {
			return status.Errorf(codes.Internal, "unmounting %s: %v", path, err)
		}
	}
}

// NodePublishVolume bind-mounts the staged filesystem, or the device of a block volume,
// at the target path.
func (n *Node) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	vol, target := req.GetVolumeId(), req.GetTargetPath()
	if err := validateNodePublish(req); err != nil {
		return nil, err
	}
	release, err := n.guard.acquire(vol, "NodePublishVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	if r, err := n.localRVR(ctx, vol); err != nil {
		return nil, err
	} else if r == nil {
		return nil, status.Errorf(codes.NotFound, "volume_id: volume %q has no replica on node %q", vol, n.NodeName)
	}
	opts := []string{"bind"}
	if req.GetReadonly() {
		opts = append(opts, "ro")
	}
	var source string
	var already *csipb.NodePublishVolumeResponse
	if mnt := req.GetVolumeCapability().GetMount(); mnt != nil {
		opts = append(opts, mnt.GetMountFlags()...)
		source, already, err = n.filesystemTarget(req)
	} else {
		source, already, err = n.blockTarget(ctx, req)
	}
	if err != nil || already != nil {
		return already, err
	}
	if err := n.mounter().Mount(source, target, "", opts); err != nil {
		return nil, status.Errorf(codes.Internal, "bind-mounting %s at %s with %v: %v", source, target, opts, err)
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

// validateNodePublish checks the request's own fields.
func validateNodePublish(req *csipb.NodePublishVolumeRequest) error {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return err
	}
	if req.GetTargetPath() == "" {
		return invalid("target_path: required")
	}
	if req.GetStagingTargetPath() == "" {
		return invalid("staging_target_path: required (the plugin has STAGE_UNSTAGE_VOLUME)")
	}
	return checkCapability("volume_capability", req.GetVolumeCapability())
}

// filesystemTarget prepares the publication of a filesystem volume: the source is the
// staging mount, the target a directory. already is the answer when the target is
// published already.
func (n *Node) filesystemTarget(req *csipb.NodePublishVolumeRequest) (source string, already *csipb.NodePublishVolumeResponse, err error) {
	vol, target, staging := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath()
	smp, err := n.mountAt(staging)
	if err != nil {
		return "", nil, err
	}
	if smp == nil {
		return "", nil, status.Errorf(codes.FailedPrecondition, "staging_target_path: volume %q is not staged at %s", vol, staging)
	}
	if mp, err := n.mountAt(target); err != nil {
		return "", nil, err
	} else if mp != nil {
		already, err = n.publishedAlready(vol, target, mp, smp.Device, req.GetReadonly())
		return "", already, err
	}
	if err := n.singleWriter(vol, staging, target, req.GetVolumeCapability()); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return "", nil, status.Errorf(codes.Internal, "target_path: %v", err)
	}
	return staging, nil, nil
}

// blockTarget prepares the publication of a block volume: the source is the DRBD
// device (once this node's replica is Primary), the target a file bind-mounted over it.
// already is the answer when the target is published already.
func (n *Node) blockTarget(ctx context.Context, req *csipb.NodePublishVolumeRequest) (source string, already *csipb.NodePublishVolumeResponse, err error) {
	vol, target := req.GetVolumeId(), req.GetTargetPath()
	dev, err := n.primaryDevice(ctx, vol)
	if err != nil {
		return "", nil, err
	}
	if mp, err := n.mountAt(target); err != nil {
		return "", nil, err
	} else if mp != nil {
		already, err = n.publishedAlready(vol, target, mp, "", req.GetReadonly())
		return "", already, err
	}
	if err := n.singleWriter(vol, dev, target, req.GetVolumeCapability()); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return "", nil, status.Errorf(codes.Internal, "target_path: %v", err)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return "", nil, status.Errorf(codes.Internal, "target_path: %v", err)
	}
	f.Close()
	return dev, nil, nil
}

// singleWriter refuses, with FailedPrecondition, to publish a SINGLE_NODE_SINGLE_WRITER
// volume at a second target path (the spec's rule for that mode, which Kubernetes
// maps ReadWriteOncePod to). The other publications are the bind mounts of source (the
// staging path, or the device of a block volume): the mount table's entries with
// source's filesystem and root.
func (n *Node) singleWriter(vol, source, target string, c *csipb.VolumeCapability) error {
	if c.GetAccessMode().GetMode() != csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER {
		return nil
	}
	refs, err := mountRefs(source)
	if err != nil {
		return status.Errorf(codes.Internal, "looking for other publications of %s: %v", source, err)
	}
	for _, r := range refs {
		if r != filepath.Clean(target) {
			return status.Errorf(codes.FailedPrecondition, "volume_capability.access_mode: volume %q is SINGLE_NODE_SINGLE_WRITER and already published at %s", vol, r)
		}
	}
	return nil
}

// mountRefs lists the mount points that show the same file or directory as path: the
// same filesystem (major:minor) and the same root inside it, other than the mount path
// lies on. mount-utils' GetMountRefs answers for the first mount containing path in
// reverse mount order rather than the deepest one, so on a machine that lists / after
// /dev it looks for /dev/loop0 on the root filesystem and finds nothing.
func mountRefs(path string) ([]string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	ms, err := mountinfo.Read()
	if err != nil {
		return nil, err
	}
	on := -1 // the deepest mount containing real; the last one when stacked
	for i, m := range ms {
		if real == m.MountPoint || strings.HasPrefix(real, strings.TrimSuffix(m.MountPoint, "/")+"/") {
			if on < 0 || len(m.MountPoint) >= len(ms[on].MountPoint) {
				on = i
			}
		}
	}
	if on < 0 {
		return nil, fmt.Errorf("%s is on no mount", real)
	}
	root := filepath.Join(ms[on].Root, strings.TrimPrefix(real, ms[on].MountPoint))
	var refs []string
	for i, m := range ms {
		if i != on && m.Major == ms[on].Major && m.Minor == ms[on].Minor && m.Root == root {
			refs = append(refs, m.MountPoint)
		}
	}
	return refs, nil
}

// publishedAlready answers a repeated NodePublish: the same volume with the same
// readonly flag succeeds, anything else at that path is AlreadyExists.
func (n *Node) publishedAlready(vol, target string, mp *mount.MountPoint, wantDev string, readonly bool) (*csipb.NodePublishVolumeResponse, error) {
	if wantDev != "" && !sameDevice(mp.Device, wantDev) {
		return nil, status.Errorf(codes.AlreadyExists, "target_path: %s already holds %s, not volume %q", target, mp.Device, vol)
	}
	ro := false
	for _, o := range mp.Opts {
		if o == "ro" {
			ro = true
		}
	}
	if ro != readonly {
		return nil, status.Errorf(codes.AlreadyExists, "readonly: volume %q is published at %s with readonly=%v", vol, target, ro)
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

func (n *Node) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	vol, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireVolumeID(vol); err != nil {
		return nil, err
	}
	if target == "" {
		return nil, invalid("target_path: required")
	}
	release, err := n.guard.acquire(vol, "NodeUnpublishVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	if err := n.unmountAll(target); err != nil {
		return nil, err
	}
	// The spec: the plugin deletes the file or directory it created at target_path.
	if err := os.Remove(target); err != nil && !os.IsNotExist(err) {
		return nil, status.Errorf(codes.Internal, "removing target_path %s: %v", target, err)
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// replicaCondition reads the volume's health on this node from the RVR's status.
func replicaCondition(r *v1.ReplicatedVolumeReplica) *csipb.VolumeCondition {
	st := &r.Status
	if st.Quorum != nil && !*st.Quorum {
		return &csipb.VolumeCondition{Abnormal: true, Message: "DRBD has no quorum on this node; IO fails or waits until it returns"}
	}
	if st.IOSuspended {
		return &csipb.VolumeCondition{Abnormal: true, Message: "DRBD has suspended IO on this node"}
	}
	upToDate := st.DiskState == v1.DiskStateUpToDate
	for _, p := range st.Peers {
		if p.ConnectionState == "Connected" && p.PeerDiskState == v1.DiskStateUpToDate {
			upToDate = true
		}
	}
	if !upToDate {
		return &csipb.VolumeCondition{Abnormal: true, Message: fmt.Sprintf("no UpToDate copy of the data is reachable (local disk %q, %d peer(s))", st.DiskState, len(st.Peers))}
	}
	return &csipb.VolumeCondition{Message: fmt.Sprintf("DRBD role %s, disk %s", st.Role, st.DiskState)}
}

func (n *Node) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	vol, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireVolumeID(vol); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("volume_path: required")
	}
	r, err := n.localRVR(ctx, vol)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, status.Errorf(codes.NotFound, "volume_id: volume %q has no replica on node %q", vol, n.NodeName)
	}
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return nil, status.Errorf(codes.NotFound, "volume_path: %s does not exist", path)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume_path: %v", err)
	}
	resp := &csipb.NodeGetVolumeStatsResponse{VolumeCondition: replicaCondition(r)}
	if fi.Mode()&os.ModeDevice != 0 {
		size, err := deviceSize(path)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume_path: %v", err)
		}
		resp.Usage = []*csipb.VolumeUsage{{Unit: csipb.VolumeUsage_BYTES, Total: size}}
		return resp, nil
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	bs := sfs.Bsize
	resp.Usage = []*csipb.VolumeUsage{
		{Unit: csipb.VolumeUsage_BYTES, Total: int64(sfs.Blocks) * bs, Available: int64(sfs.Bavail) * bs, Used: int64(sfs.Blocks-sfs.Bfree) * bs},
		{Unit: csipb.VolumeUsage_INODES, Total: int64(sfs.Files), Available: int64(sfs.Ffree), Used: int64(sfs.Files - sfs.Ffree)},
	}
	return resp, nil
}

// deviceSize is a block device's size. The kernel's sysfs says it without
// opening the device: DRBD 9.2 refuses even a read-only open while the device
// has no quorum (ENODATA, drbd_open), and a Primary whose connections a loaded
// network drops regains it seconds later (test/vm/FINDINGS.md, "The product on
// real DRBD" 10); a size read should not fail on that. Anything else (a
// regular file in tests, a device sysfs does not list) is measured by seeking
// to its end.
func deviceSize(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		dev := uint64(st.Rdev) // Rdev is uint32 on some architectures
		if b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/size", unix.Major(dev), unix.Minor(dev))); err == nil {
			// sysfs counts 512-byte sectors whatever the logical block size.
			if sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return sectors * 512, nil
			}
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

func (n *Node) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	vol, path := req.GetVolumeId(), req.GetVolumePath()
	if err := requireVolumeID(vol); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, invalid("volume_path: required")
	}
	if req.GetVolumeCapability() != nil {
		if err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	release, err := n.guard.acquire(vol, "NodeExpandVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	r, err := n.localRVR(ctx, vol)
	if err != nil {
		return nil, err
	}
	if r == nil || r.Status.DevicePath == "" {
		return nil, status.Errorf(codes.NotFound, "volume_id: volume %q has no device on node %q", vol, n.NodeName)
	}
	fi, err := os.Stat(path)
	if os.IsNotExist(err) {
		return nil, status.Errorf(codes.NotFound, "volume_path: %s does not exist", path)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume_path: %v", err)
	}
	dev := r.Status.DevicePath
	size, err := deviceSize(dev)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading the size of %s: %v", dev, err)
	}
	if req.GetVolumeCapability().GetBlock() != nil || fi.Mode()&os.ModeDevice != 0 {
		return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	if want := req.GetCapacityRange().GetRequiredBytes(); want > size {
		return nil, status.Errorf(codes.FailedPrecondition, "capacity_range.required_bytes: the device %s has %d bytes, fewer than %d; ControllerExpandVolume first", dev, size, want)
	}
	if mp, err := n.mountAt(path); err != nil {
		return nil, err
	} else if mp == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume_path: nothing is mounted at %s", path)
	}
	fs, _, err := probeDevice(ctx, dev)
	if err != nil {
		return nil, err
	}
	if err := growMounted(ctx, dev, path, fs); errors.Is(err, errOnlineExt4Refused) {
		return nil, onlineExt4Refused(dev, path, size)
	} else if err != nil {
		return nil, err
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
