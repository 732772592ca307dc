package csi

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mount "k8s.io/mount-utils"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// loopDev is a loop device over a sparse file in dir, detached at cleanup.
type loopDev struct{ file, dev string }

func newLoop(t *testing.T, dir, name string, size int64, fill func(f *os.File)) loopDev {
	t.Helper()
	file := filepath.Join(dir, name+".img")
	f, err := os.Create(file)
	must(t, err)
	must(t, f.Truncate(size))
	if fill != nil {
		fill(f)
	}
	must(t, f.Close())
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return loopDev{file: file, dev: dev}
}

func blkidType(t *testing.T, dev string) string {
	t.Helper()
	out, _ := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", dev).Output()
	return strings.TrimSpace(string(out))
}

func head(t *testing.T, dev string, n int) []byte {
	t.Helper()
	f, err := os.Open(dev)
	must(t, err)
	defer f.Close()
	b := make([]byte, n)
	_, err = f.ReadAt(b, 0)
	must(t, err)
	return b
}

// TestNodeService stages, publishes, expands and tears down real loop devices with
// real mkfs and mounts, the replicas' state coming from RVRs on the real apiserver.
// Each row is one code path; they run in order.
func TestNodeService(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the node service test mounts loop devices: run it as root")
	}
	ctx := context.Background()
	pfx := testenvName(t)
	node := pfx + "-node"
	dir, err := os.MkdirTemp("", "csi-node")
	must(t, err)
	mounter := mount.New("")
	t.Cleanup(func() {
		// Whatever a failed row left mounted under dir goes first, then the devices.
		mps, _ := mounter.List()
		for i := len(mps) - 1; i >= 0; i-- {
			if strings.HasPrefix(mps[i].Path, dir+"/") {
				_ = mounter.Unmount(mps[i].Path)
			}
		}
		os.RemoveAll(dir)
	})

	// The devices: fresh (ext4, xfs, block), one holding ext4 with a file on it, one
	// holding data no filesystem tool recognises.
	fresh := newLoop(t, dir, "fresh", 64*mib, nil)
	freshXFS := newLoop(t, dir, "xfs", 320*mib, nil)
	cloneXFS := newLoop(t, dir, "xfsclone", 320*mib, nil)
	blk := newLoop(t, dir, "block", 16*mib, nil)
	hasExt4 := newLoop(t, dir, "hasext4", 64*mib, nil)
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "precious", hasExt4.dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v: %s", err, out)
	}
	noise := make([]byte, mib)
	_, _ = rand.Read(noise)
	hasData := newLoop(t, dir, "hasdata", 64*mib, func(f *os.File) { _, _ = f.WriteAt(noise, 0) })

	rvr := func(vol, dev string, role v1.ReplicaRole) {
		r := &v1.ReplicatedVolumeReplica{
			ObjectMeta: metav1.ObjectMeta{Name: v1.ReplicaName(vol, node), Labels: map[string]string{v1.LabelVolume: vol, v1.LabelNode: node}},
			Spec:       v1.ReplicatedVolumeReplicaSpec{ReplicatedVolumeName: vol, NodeName: node, Type: v1.ReplicaTypeDiskful},
		}
		must(t, env.Client.Create(ctx, r))
		r.Status = v1.ReplicatedVolumeReplicaStatus{Role: role, DevicePath: dev, DiskState: v1.DiskStateUpToDate, Quorum: ptr.To(true)}
		must(t, env.Client.Status().Update(ctx, r))
	}
	vFresh, vXFS, vBlk, vExt4, vData, vSec := pfx+"-fresh", pfx+"-xfs", pfx+"-blk", pfx+"-ext4", pfx+"-data", pfx+"-sec"
	vXFSClone := pfx + "-xfsclone"
	rvr(vFresh, fresh.dev, v1.RolePrimary)
	rvr(vXFS, freshXFS.dev, v1.RolePrimary)
	rvr(vXFSClone, cloneXFS.dev, v1.RolePrimary)
	rvr(vBlk, blk.dev, v1.RolePrimary)
	rvr(vExt4, hasExt4.dev, v1.RolePrimary)
	rvr(vData, hasData.dev, v1.RolePrimary)
	rvr(vSec, fresh.dev, v1.RoleSecondary)

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cl, err := NewNodeClient(cctx, env.Config, env.Scheme, node)
	must(t, err)
	svc := &Node{NodeName: node, Zone: "zone-a", MaxVolumes: 100, Client: cl}
	ns := csipb.NewNodeClient(serve(t, Services{Identity: &Identity{}, Node: svc}))
	// Wait until the informer holds the RVRs written above.
	must(t, waitFor(ctx, func() (bool, error) {
		r, err := svc.localRVR(ctx, vSec)
		return r != nil, err
	}))

	stg := func(v string) string { return filepath.Join(dir, "staging", v) }
	tgt := func(v, n string) string { return filepath.Join(dir, "pods", n, v) }
	stage := func(ctx context.Context, vol string, vc *csipb.VolumeCapability) error {
		_, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: stg(vol), VolumeCapability: vc})
		return err
	}
	publish := func(ctx context.Context, vol, target string, vc *csipb.VolumeCapability, ro bool) error {
		_, err := ns.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: stg(vol),
			TargetPath: target, VolumeCapability: vc, Readonly: ro})
		return err
	}
	mountOf := func(path string) *mount.MountPoint {
		mp, err := svc.mountAt(path)
		must(t, err)
		return mp
	}
	ext4 := mountCap("ext4", snw, "noatime")
	dataHead := head(t, hasData.dev, int(mib))

	rows := []codeRow{
		{"GetInfo: node id and topology", func(ctx context.Context) error {
			r, err := ns.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
			if err == nil && (r.NodeId != node || r.AccessibleTopology.Segments[v1.TopologyKeyNode] != node ||
				r.AccessibleTopology.Segments[v1.LabelZone] != "zone-a" || r.MaxVolumesPerNode != 100) {
				return errors.New("got " + r.String())
			}
			return err
		}, codes.OK, ""},
		{"GetCapabilities", func(ctx context.Context) error {
			r, err := ns.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
			if err == nil && len(r.Capabilities) != 5 {
				return errors.New("got " + r.String())
			}
			return err
		}, codes.OK, ""},
		{"Stage: no volume id", func(ctx context.Context) error { return stage(ctx, "", ext4) }, codes.InvalidArgument, "volume_id"},
		{"Stage: no staging path", func(ctx context.Context) error {
			_, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vFresh, VolumeCapability: ext4})
			return err
		}, codes.InvalidArgument, "staging_target_path"},
		{"Stage: no capability", func(ctx context.Context) error { return stage(ctx, vFresh, nil) }, codes.InvalidArgument, "volume_capability"},
		{"Stage: no replica here", func(ctx context.Context) error { return stage(ctx, pfx+"-none", ext4) }, codes.NotFound, "volume_id"},
		{"Stage: replica not Primary at the deadline", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			return stage(ctx, vSec, ext4)
		}, codes.DeadlineExceeded, "not Primary"},
		{"Stage: an empty device is formatted ext4 and mounted with the mount flags", func(ctx context.Context) error {
			if err := stage(ctx, vFresh, ext4); err != nil {
				return err
			}
			mp := mountOf(stg(vFresh))
			if blkidType(t, fresh.dev) != "ext4" || mp == nil || mp.Type != "ext4" || !strings.Contains(strings.Join(mp.Opts, ","), "noatime") {
				return fmt.Errorf("after staging: blkid %q, mount %+v", blkidType(t, fresh.dev), mp)
			}
			return nil
		}, codes.OK, ""},
		{"Stage: idempotent", func(ctx context.Context) error { return stage(ctx, vFresh, ext4) }, codes.OK, ""},
		{"Stage: same path, other filesystem", func(ctx context.Context) error { return stage(ctx, vFresh, mountCap("xfs", snw)) }, codes.AlreadyExists, "fs_type"},
		{"Publish: no staging path", func(ctx context.Context) error {
			_, err := ns.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vFresh, TargetPath: tgt(vFresh, "p1"), VolumeCapability: ext4})
			return err
		}, codes.InvalidArgument, "staging_target_path"},
		{"Publish: no target", func(ctx context.Context) error { return publish(ctx, vFresh, "", ext4, false) }, codes.InvalidArgument, "target_path"},
		{"Publish: not staged", func(ctx context.Context) error { return publish(ctx, vExt4, tgt(vExt4, "p1"), ext4, false) }, codes.FailedPrecondition, "not staged"},
		{"Publish: bind mount, writable", func(ctx context.Context) error {
			if err := publish(ctx, vFresh, tgt(vFresh, "p1"), ext4, false); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(tgt(vFresh, "p1"), "kept"), []byte("data"), 0o600)
		}, codes.OK, ""},
		{"Publish: idempotent", func(ctx context.Context) error { return publish(ctx, vFresh, tgt(vFresh, "p1"), ext4, false) }, codes.OK, ""},
		{"Publish: same target, readonly differs", func(ctx context.Context) error { return publish(ctx, vFresh, tgt(vFresh, "p1"), ext4, true) }, codes.AlreadyExists, "readonly"},
		{"Publish: readonly bind mount refuses writes", func(ctx context.Context) error {
			if err := publish(ctx, vFresh, tgt(vFresh, "p2"), ext4, true); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(tgt(vFresh, "p2"), "x"), nil, 0o600); !errors.Is(err, unix.EROFS) {
				return fmt.Errorf("write on a readonly publish: %v", err)
			}
			return nil
		}, codes.OK, ""},
		{"Publish: single writer, while published elsewhere", func(ctx context.Context) error {
			return publish(ctx, vFresh, tgt(vFresh, "p3"), mountCap("ext4", ssw), false)
		}, codes.FailedPrecondition, "SINGLE_NODE_SINGLE_WRITER"},
		{"Stats: bytes and inodes, healthy", func(ctx context.Context) error {
			r, err := ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vFresh, VolumePath: tgt(vFresh, "p1")})
			if err == nil && (len(r.Usage) != 2 || r.Usage[0].Total < 50*mib || r.Usage[0].Total > 64*mib || r.Usage[1].Total == 0 || r.VolumeCondition.Abnormal) {
				return errors.New("got " + r.String())
			}
			return err
		}, codes.OK, ""},
		{"Stats: no quorum is abnormal", func(ctx context.Context) error {
			var r v1.ReplicatedVolumeReplica
			must(t, env.Client.Get(ctx, client.ObjectKey{Name: v1.ReplicaName(vFresh, node)}, &r))
			r.Status.Quorum = ptr.To(false)
			must(t, env.Client.Status().Update(ctx, &r))
			return waitFor(ctx, func() (bool, error) {
				s, err := ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vFresh, VolumePath: tgt(vFresh, "p1")})
				return err == nil && s.VolumeCondition.Abnormal && strings.Contains(s.VolumeCondition.Message, "quorum"), err
			})
		}, codes.OK, ""},
		{"Stats: missing path", func(ctx context.Context) error {
			_, err := ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vFresh, VolumePath: tgt(vFresh, "nope")})
			return err
		}, codes.NotFound, "volume_path"},
		{"Stats: volume not on this node", func(ctx context.Context) error {
			_, err := ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: pfx + "-none", VolumePath: tgt(vFresh, "p1")})
			return err
		}, codes.NotFound, "volume_id"},
		{"Expand: larger than the device", func(ctx context.Context) error {
			_, err := ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: vFresh, VolumePath: tgt(vFresh, "p1"),
				CapacityRange: &csipb.CapacityRange{RequiredBytes: gib}})
			return err
		}, codes.FailedPrecondition, "capacity_range"},
		{"Expand: unknown volume", func(ctx context.Context) error {
			_, err := ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: pfx + "-none", VolumePath: tgt(vFresh, "p1")})
			return err
		}, codes.NotFound, "volume_id"},
		// Online ext4 growth needs CAP_SYS_RESOURCE (expand.go): with it the file
		// system grows; without it (this sandbox) the answer is FailedPrecondition
		// saying why, and the next stage grows it (below).
		{"Expand: a published ext4 grows online, or says why it cannot", func(ctx context.Context) error {
			var before unix.Statfs_t
			must(t, unix.Statfs(tgt(vFresh, "p1"), &before))
			must(t, os.Truncate(fresh.file, 96*mib))
			if out, err := exec.Command("losetup", "-c", fresh.dev).CombinedOutput(); err != nil {
				return fmt.Errorf("losetup -c: %v: %s", err, out)
			}
			r, err := ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: vFresh, VolumePath: tgt(vFresh, "p1"),
				CapacityRange: &csipb.CapacityRange{RequiredBytes: 96 * mib}, VolumeCapability: ext4})
			if !hasCapSysResource(t) {
				if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") ||
					!strings.Contains(err.Error(), "next staged") {
					return fmt.Errorf("without CAP_SYS_RESOURCE: %v, want FailedPrecondition naming the capability and the way out", err)
				}
				t.Logf("no CAP_SYS_RESOURCE here: %v", err)
				return nil
			}
			if err != nil {
				return err
			}
			var sfs unix.Statfs_t
			must(t, unix.Statfs(tgt(vFresh, "p1"), &sfs))
			if r.CapacityBytes != 96*mib || sfs.Blocks <= before.Blocks {
				return fmt.Errorf("capacity %d, file system blocks %d → %d", r.CapacityBytes, before.Blocks, sfs.Blocks)
			}
			return nil
		}, codes.OK, ""},
		{"Unpublish: unmounted and removed, twice", func(ctx context.Context) error {
			for _, p := range []string{"p1", "p2", "p1"} {
				if _, err := ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vFresh, TargetPath: tgt(vFresh, p)}); err != nil {
					return err
				}
				if _, err := os.Stat(tgt(vFresh, p)); !os.IsNotExist(err) {
					return fmt.Errorf("%s still there: %v", p, err)
				}
			}
			return nil
		}, codes.OK, ""},
		{"Unstage: unmounted, twice", func(ctx context.Context) error {
			for i := 0; i < 2; i++ {
				if _, err := ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vFresh, StagingTargetPath: stg(vFresh)}); err != nil {
					return err
				}
			}
			if mountOf(stg(vFresh)) != nil {
				return errors.New("still mounted")
			}
			return nil
		}, codes.OK, ""},
		{"Stage again: the data is still there, nothing reformatted", func(ctx context.Context) error {
			if err := stage(ctx, vFresh, ext4); err != nil {
				return err
			}
			b, err := os.ReadFile(filepath.Join(stg(vFresh), "kept"))
			if err != nil || string(b) != "data" {
				return fmt.Errorf("the file written before: %q, %v", b, err)
			}
			// The device grew to 96 MiB above: staging grew the ext4 with it
			// (offline, if it could not grow online), and the stats say so.
			st, err := ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vFresh, VolumePath: stg(vFresh)})
			if err != nil {
				return err
			}
			if total := st.Usage[0].Total; total < 80*mib || total > 96*mib {
				return fmt.Errorf("staged again on a 96 MiB device: the file system has %d bytes", total)
			}
			_, err = ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vFresh, StagingTargetPath: stg(vFresh)})
			return err
		}, codes.OK, ""},
		{"Stage: an empty device is formatted xfs", func(ctx context.Context) error {
			if err := stage(ctx, vXFS, mountCap("xfs", snw)); err != nil {
				return err
			}
			if blkidType(t, freshXFS.dev) != "xfs" || mountOf(stg(vXFS)).Type != "xfs" {
				return errors.New("not xfs")
			}
			return nil
		}, codes.OK, ""},
		{"Stage: a clone of an xfs volume (its source's file system UUID) stages beside its source", func(ctx context.Context) error {
			// The clone holds the source's blocks, as a clone or a restored snapshot does.
			if out, err := exec.Command("cp", "--sparse=always", freshXFS.file, cloneXFS.file).CombinedOutput(); err != nil {
				return fmt.Errorf("cp: %v: %s", err, out)
			}
			if out, err := exec.Command("blockdev", "--flushbufs", cloneXFS.dev).CombinedOutput(); err != nil {
				return fmt.Errorf("blockdev --flushbufs: %v: %s", err, out)
			}
			if err := stage(ctx, vXFS, mountCap("xfs", snw)); err != nil {
				return err
			}
			if err := stage(ctx, vXFSClone, mountCap("xfs", snw)); err != nil {
				return err
			}
			if mountOf(stg(vXFS)) == nil || mountOf(stg(vXFSClone)) == nil {
				return errors.New("the source and its clone are not both mounted")
			}
			_, err := ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vXFSClone, StagingTargetPath: stg(vXFSClone)})
			return err
		}, codes.OK, ""},
		// Online growth is tested on xfs: ext4's needs CAP_SYS_RESOURCE, which this
		// sandbox does not grant (resize2fs gets EPERM from the kernel).
		{"Expand: the published xfs grows to the device", func(ctx context.Context) error {
			xfs := mountCap("xfs", snw)
			if err := publish(ctx, vXFS, tgt(vXFS, "p1"), xfs, false); err != nil {
				return err
			}
			var before unix.Statfs_t
			must(t, unix.Statfs(tgt(vXFS, "p1"), &before))
			must(t, os.Truncate(freshXFS.file, 400*mib))
			if out, err := exec.Command("losetup", "-c", freshXFS.dev).CombinedOutput(); err != nil {
				return fmt.Errorf("losetup -c: %v: %s", err, out)
			}
			r, err := ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: vXFS, VolumePath: tgt(vXFS, "p1"),
				CapacityRange: &csipb.CapacityRange{RequiredBytes: 400 * mib}, VolumeCapability: xfs})
			if err != nil {
				return err
			}
			var sfs unix.Statfs_t
			must(t, unix.Statfs(tgt(vXFS, "p1"), &sfs))
			// The filesystem gains the 80 MiB the device did (xfs's statfs leaves its log out).
			if grown := int64(sfs.Blocks)*sfs.Bsize - int64(before.Blocks)*before.Bsize; r.CapacityBytes != 400*mib || grown < 75*mib {
				return fmt.Errorf("capacity %d, filesystem grew by %d bytes", r.CapacityBytes, grown)
			}
			if _, err := ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vXFS, TargetPath: tgt(vXFS, "p1")}); err != nil {
				return err
			}
			_, err = ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vXFS, StagingTargetPath: stg(vXFS)})
			return err
		}, codes.OK, ""},
		{"Stage: a device holding ext4 is not formatted xfs", func(ctx context.Context) error {
			err := stage(ctx, vExt4, mountCap("xfs", snw))
			if blkidType(t, hasExt4.dev) != "ext4" || mountOf(stg(vExt4)) != nil {
				return errors.New("the ext4 device was touched")
			}
			return err
		}, codes.FailedPrecondition, "holds a ext4 filesystem"},
		{"Stage: a device holding ext4 is mounted as it is", func(ctx context.Context) error {
			if err := stage(ctx, vExt4, ext4); err != nil {
				return err
			}
			out, _ := exec.Command("blkid", "-p", "-s", "LABEL", "-o", "value", hasExt4.dev).Output()
			if strings.TrimSpace(string(out)) != "precious" {
				return errors.New("the filesystem was replaced")
			}
			_, err := ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vExt4, StagingTargetPath: stg(vExt4)})
			return err
		}, codes.OK, ""},
		{"Stage: a device holding unrecognised data is not formatted", func(ctx context.Context) error {
			err := stage(ctx, vData, ext4)
			if !bytes.Equal(head(t, hasData.dev, int(mib)), dataHead) || mountOf(stg(vData)) != nil {
				return errors.New("the data was touched")
			}
			return err
		}, codes.FailedPrecondition, "refusing to format"},
		{"Block: staging needs nothing", func(ctx context.Context) error { return stage(ctx, vBlk, blockCap(snw)) }, codes.OK, ""},
		{"Block: published as a device file", func(ctx context.Context) error {
			if err := publish(ctx, vBlk, tgt(vBlk, "p1"), blockCap(snw), false); err != nil {
				return err
			}
			if err := publish(ctx, vBlk, tgt(vBlk, "p1"), blockCap(snw), false); err != nil {
				return fmt.Errorf("again: %w", err)
			}
			fi, err := os.Stat(tgt(vBlk, "p1"))
			if err != nil || fi.Mode()&os.ModeDevice == 0 {
				return fmt.Errorf("target is not the device: %v %v", fi, err)
			}
			r, err := ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: vBlk, VolumePath: tgt(vBlk, "p1")})
			if err != nil || r.Usage[0].Total != 16*mib {
				return fmt.Errorf("stats %v, %v", r, err)
			}
			_, err = ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vBlk, TargetPath: tgt(vBlk, "p1")})
			if _, serr := os.Stat(tgt(vBlk, "p1")); !os.IsNotExist(serr) {
				return errors.New("device file left behind")
			}
			return err
		}, codes.OK, ""},
		{"Block: single writer, at one target only", func(ctx context.Context) error {
			if err := publish(ctx, vBlk, tgt(vBlk, "p1"), blockCap(ssw), false); err != nil {
				return err
			}
			if err := publish(ctx, vBlk, tgt(vBlk, "p1"), blockCap(ssw), false); err != nil {
				return fmt.Errorf("again at the same target: %w", err)
			}
			err := publish(ctx, vBlk, tgt(vBlk, "p2"), blockCap(ssw), false)
			if _, uerr := ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vBlk, TargetPath: tgt(vBlk, "p1")}); uerr != nil {
				return uerr
			}
			if _, serr := os.Stat(tgt(vBlk, "p2")); !os.IsNotExist(serr) {
				return errors.New("the refused target was created")
			}
			return err
		}, codes.FailedPrecondition, "already published at"},
		{"In flight: a second call for the volume is Aborted", func(ctx context.Context) error {
			release, err := svc.guard.acquire(vBlk, "NodeStageVolume")
			must(t, err)
			defer release()
			return stage(ctx, vBlk, blockCap(snw))
		}, codes.Aborted, "already in progress"},
	}
	runCodeRows(t, rows, 60*time.Second)
}

// hasCapSysResource reports whether this process may grow a mounted ext4
// (CAP_SYS_RESOURCE, bit 24 of CapEff in /proc/self/status).
func hasCapSysResource(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/status")
	must(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			must(t, err)
			return caps&(1<<24) != 0
		}
	}
	t.Fatal("no CapEff in /proc/self/status")
	return false
}

// deviceSize reads a block device's size from sysfs, without opening it (DRBD
// refuses a read-only open of a device without quorum), and a regular file's
// by seeking: a loop device and its backing file agree, to the sector.
func TestDeviceSize(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the test attaches a loop device: run it as root")
	}
	const size = 96<<20 + 3*512
	l := newLoop(t, t.TempDir(), "size", size, nil)
	for _, p := range []string{l.dev, l.file} {
		got, err := deviceSize(p)
		if err != nil || got != size {
			t.Errorf("deviceSize(%s) = %d, %v; want %d", p, got, err, size)
		}
	}
	if _, err := deviceSize(filepath.Join(t.TempDir(), "missing")); !os.IsNotExist(err) {
		t.Errorf("deviceSize of a missing path: %v, want not-exist", err)
	}
}
