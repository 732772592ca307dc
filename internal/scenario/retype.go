package scenario

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// retypeClass is scenario 10's class: 2D (FTT 0, GMDR 1), then 1D.
const retypeClass = "retype"

// blockMultiCap is a raw block volume attached to several nodes at once, as
// a live migration of a virtual machine uses it.
var blockMultiCap = &csipb.VolumeCapability{
	AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
}

// Scenario 10: a 2D block volume attached on both its Diskful nodes (two
// Primaries) is changed to 1D by its class. Both Diskful replicas are
// attached, so the engine converts one to Access instead of removing it
// (docs/controller.md, "Retyping a replica"): the retyped replica keeps its
// spec.storage, DRBD there runs without a disk and stays Primary, its
// backing volume is freed, and the data written before reads back through
// it. Then both attachments end and the volume is deleted.
func (r *run) retype(t *testing.T) {
	two, one := Layout{Name: retypeClass, FTT: 0, GMDR: 1, Diskful: 2}, Layout{Name: retypeClass, FTT: 0, GMDR: 0, Diskful: 1}
	r.createClass(t, two)
	id := r.createVolume(t, retypeClass, blockMultiCap)
	r.extra = append(r.extra, id)
	r.layoutAs(t, id, two)
	nodes := r.diskful(t, id)
	for _, n := range nodes {
		r.call(t, "ControllerPublishVolume "+id+" on "+n, func(ctx context.Context) error {
			_, err := r.b.Controller().ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
				VolumeId: id, NodeId: n, VolumeCapability: blockMultiCap})
			return err
		})
	}
	for _, n := range nodes {
		r.eventually(t, id+" Primary on "+n, func() string {
			if role := r.role(id, n); role != "Primary" {
				return "role " + role
			}
			return ""
		})
	}
	dev := func(node string) string {
		for _, x := range r.rvrsOf(t, id) {
			if x.Spec.NodeName == node {
				return x.Status.DevicePath
			}
		}
		t.Fatalf("%s: no replica on %s", id, node)
		return ""
	}
	// read is sha256sum's reading of the first dataBytes of the device on
	// node, or the read's error.
	read := func(node string) (string, error) {
		tmp := path.Join(r.b.Dir(node), id+".read")
		out, err := r.b.Shell(r.ctx, node, fmt.Sprintf("dd if=%s of=%s bs=1M count=%d iflag=direct 2>&1 && sha256sum %[2]s; rc=$?; rm -f %[2]s; exit $rc", dev(node), tmp, dataBytes>>20))
		if err != nil {
			return "", fmt.Errorf("reading %s on %s: %w: %s", id, node, err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		sum, _, _ := strings.Cut(lines[len(lines)-1], " ")
		return sum, nil
	}
	script := fmt.Sprintf("dd if=/dev/urandom of=%s bs=1M count=%d oflag=direct conv=fsync 2>&1", dev(nodes[0]), dataBytes>>20)
	if out, err := r.b.Shell(r.ctx, nodes[0], script); err != nil {
		t.Fatalf("writing %s on %s: %v: %s", id, nodes[0], err, out)
	}
	sum, err := read(nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	r.step(t, "10 2d attached on both Diskful nodes")

	began := time.Now()
	r.setClass(t, retypeClass, one)
	var retyped string
	r.eventually(t, id+" Ready as 1 Diskful and 1 Access", func() string {
		rv := r.rv(t, id)
		count := map[v1.MemberType]int{}
		retyped = ""
		for _, m := range rv.Status.Datamesh.Members {
			count[m.Type]++
			if m.Type == v1.MemberTypeAccess {
				retyped = m.NodeName
			}
		}
		if rv.Status.Phase != v1.VolumePhaseReady || len(rv.Status.DatameshTransitions) > 0 ||
			count[v1.MemberTypeDiskful] != 1 || count[v1.MemberTypeAccess] != 1 || len(rv.Status.Datamesh.Members) != 2 {
			return fmt.Sprintf("phase %s, %d transitions, members %v", rv.Status.Phase, len(rv.Status.DatameshTransitions), count)
		}
		return ""
	})
	took := time.Since(began)
	if !slices.Contains(nodes, retyped) {
		t.Fatalf("%s: the Access member is on %s, not on one of the Diskful nodes %v: a new replica, not a retype", id, retyped, nodes)
	}
	r.eventually(t, "the retyped replica on "+retyped+" runs without its backing volume", func() string {
		for _, x := range r.rvrsOf(t, id) {
			if x.Spec.NodeName != retyped {
				continue
			}
			switch {
			case x.Spec.Type != v1.ReplicaTypeAccess:
				return "spec.type " + string(x.Spec.Type)
			case x.Spec.Storage == nil:
				return "spec.storage dropped by the retype"
			case x.Status.BackingVolume != nil:
				return fmt.Sprintf("status.backingVolume %+v", *x.Status.BackingVolume)
			}
		}
		left, err := r.b.Leftovers(r.ctx, retyped, id)
		if err != nil {
			return err.Error()
		}
		for _, l := range left {
			if !strings.HasSuffix(l, ".res") {
				return "backing volume left: " + l
			}
		}
		st, err := r.b.DRBD(retyped).Status(r.ctx, id)
		if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
			return fmt.Sprintf("drbdsetup status: %v", err)
		}
		if d := st[0].Devices[0]; st[0].Role != "Primary" || d.DiskState != "Diskless" {
			return "kernel " + kernelSummary(st[0], nil)
		}
		return ""
	})
	// A diskless Primary reads through its one connection: a read that
	// fails while that connection is re-established (a ping timeout of an
	// emulated guest under load) is tried again; data that differs is not.
	r.eventually(t, "the data read back through the Access Primary on "+retyped, func() string {
		got, err := read(retyped)
		switch {
		case err != nil:
			return err.Error() + "; " + r.kernelOf(id)
		case got != sum:
			t.Fatalf("%s: the 4 MiB written on %s read through the Access Primary on %s with sha256 %s, want %s", id, nodes[0], retyped, got, sum)
		}
		return ""
	})
	r.step(t, "10 retyped to Access")
	for _, n := range nodes {
		r.call(t, "ControllerUnpublishVolume "+id+" from "+n, func(ctx context.Context) error {
			_, err := r.b.Controller().ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: n})
			return err
		})
	}
	r.call(t, "DeleteVolume "+id, func(ctx context.Context) error {
		_, err := r.b.Controller().DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id})
		return err
	})
	r.eventually(t, id+" gone", func() string { return r.leftovers(id) })
	r.extra = slices.DeleteFunc(r.extra, func(v string) bool { return v == id })
	r.rec.Figures = append(r.rec.Figures, fmt.Sprintf("10: 2D attached on %s -> 1D: the Diskful replica on %s retyped to Access in %s, its backing volume freed, %d bytes read back through it",
		strings.Join(nodes, " and "), retyped, took.Round(100*time.Millisecond), dataBytes))
}
