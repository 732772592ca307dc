package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/csi"
)

// Scenario: expansion of a formed volume, detached and attached (online), for
// 1D, 2D+1TB and 3D: spec.size grows, the controller publishes the size, every
// diskful replica's backing volume and DRBD device grow, and the attached
// node's block device has the new size.
func TestExpansion(t *testing.T) {
	for _, l := range layoutsNamed("1D", "2D+1TB", "3D") {
		modes := []string{"detached", "attached", "diskless"}
		if l.tb > 0 {
			modes = append(modes, "tiebreaker")
		}
		for _, mode := range modes {
			t.Run(l.slug()+"-"+mode, func(t *testing.T) {
				r := newRig(t)
				vol := "expand-" + l.slug() + "-" + mode
				rv := r.formed(vol, l)
				node := ""
				switch mode {
				case "attached": // where a diskful replica is
					for _, m := range rv.Status.Datamesh.Members {
						if m.Type == v1.MemberTypeDiskful {
							node = m.NodeName
							break
						}
					}
				case "tiebreaker": // on the tie-breaker's node: attached in place, diskless
					for _, m := range rv.Status.Datamesh.Members {
						if m.Type == v1.MemberTypeTieBreaker {
							node = m.NodeName
						}
					}
				case "diskless": // on a node without a replica: an Access member
					on := map[string]bool{}
					for _, m := range rv.Status.Datamesh.Members {
						on[m.NodeName] = true
					}
					for _, n := range r.c.Nodes {
						if !on[n.Name] {
							node = n.Name
							break
						}
					}
				}
				if node != "" {
					r.attach(vol, node)
				}
				r.grow(vol, "128Mi", node)
				if node != "" {
					r.detach(vol, node)
				}
				r.deleteVolume(vol)
			})
		}
	}
}

// grow raises spec.size and waits until the datamesh publishes it, every
// diskful member's backing volume and DRBD device are at least that large,
// and (when attached on node) the node's device has grown.
func (r *rig) grow(vol, size, node string) {
	r.t.Helper()
	want := resource.MustParse(size)
	began := time.Now()
	cur := r.rv(vol)
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.Size = want
	r.must(r.cl.Patch(r.ctx, cur, patch))
	r.eventually(vol+" grown to "+size, time.Minute, func() string {
		rv := r.rv(vol)
		if s := rv.Status.Datamesh.Size; s == nil || s.Cmp(want) < 0 {
			return fmt.Sprintf("datamesh size %v; %s", rv.Status.Datamesh.Size, phase(rv))
		}
		for _, m := range rv.Status.Datamesh.Members {
			if !m.Type.HasDisk() {
				continue
			}
			var rvr v1.ReplicatedVolumeReplica
			r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: m.Name}, &rvr))
			if b := rvr.Status.BackingVolume; b == nil || b.Size.Cmp(want) < 0 {
				return fmt.Sprintf("%s backing volume %v", m.Name, b)
			}
			if rvr.Status.DatameshRevision < rv.Status.DatameshRevision {
				return fmt.Sprintf("%s at revision %d of %d", m.Name, rvr.Status.DatameshRevision, rv.Status.DatameshRevision)
			}
			st, err := r.c.Node(m.NodeName).Sim.Status(r.ctx, vol)
			if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
				return fmt.Sprintf("%s: DRBD status %v", m.NodeName, err)
			}
			if kib := st[0].Devices[0].Size; kib*1024 < want.Value() {
				return fmt.Sprintf("%s: DRBD device of %d KiB", m.NodeName, kib)
			}
		}
		return ""
	})
	if node != "" {
		// The attached node's device, diskful or not, offers the new size.
		r.eventually(vol+" device on "+node+" grown", 30*time.Second, func() string {
			st, err := r.c.Node(node).Sim.Status(r.ctx, vol)
			if err != nil || len(st) != 1 || len(st[0].Devices) != 1 {
				return fmt.Sprintf("%s: DRBD status %v", node, err)
			}
			if st[0].Role != "Primary" {
				return node + " is " + st[0].Role
			}
			if kib := st[0].Devices[0].Size; kib*1024 < want.Value() {
				return fmt.Sprintf("%s: the Primary's device has %d KiB", node, kib)
			}
			b, err := r.c.Node(node).Sim.Read(r.ctx, vol, want.Value()-4096, 4096)
			if err != nil || len(b) != 4096 {
				return fmt.Sprintf("reading the last 4 KiB of the new size on %s: %d bytes, %v", node, len(b), err)
			}
			return ""
		})
		r.must(r.c.Node(node).Sim.Write(r.ctx, vol, want.Value()-4096, bytes.Repeat([]byte{7}, 4096)))
	}
	r.t.Logf("%s: %s published and grown on every diskful replica in %s", vol, size, time.Since(began).Round(time.Millisecond))
}

// Scenario: ControllerExpandVolume on the real controller and agents returns
// only once every diskful replica has grown. With one diskful replica's agent
// stopped, it answers DeadlineExceeded naming that replica and why; once the
// agent is back, the retry returns the new size, node expansion required
// for a mount volume and not for a block one.
func TestControllerExpandWaitsForEveryReplica(t *testing.T) {
	r := newRig(t)
	const vol = "expand-csi-3d"
	r.volume(vol, r.class(1, 1, v1.TopologyIgnored), 1)
	rv := r.ready(vol, 2*time.Minute)
	cl, err := csi.NewControllerClient(r.ctx, r.c.Env.Config, r.c.Env.Scheme, r.c.Namespace)
	r.must(err)
	cs := &csi.Controller{Client: cl, Namespace: r.c.Namespace}
	mountCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}

	stopped := rv.Status.Datamesh.Members[0]
	r.must(r.c.StopAgent(stopped.NodeName))
	t.Cleanup(func() { _ = r.c.RestartAgent(stopped.NodeName) })
	// Each call has 5 s, as the external-resizer's would; on a loaded machine the
	// controller may not have published the new size within the first, whose answer then
	// says so. The retries, as the resizer's, must name the replica; none may succeed.
	r.eventually("ControllerExpandVolume naming "+stopped.Name, time.Minute, func() string {
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		defer cancel()
		_, err = cs.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: vol,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 96 << 20}, VolumeCapability: mountCap})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("with the agent of %s stopped: %v; want DeadlineExceeded", stopped.Name, err)
		}
		if !strings.Contains(err.Error(), stopped.Name) {
			return err.Error()
		}
		return ""
	})
	t.Logf("agent stopped: %v", err)

	r.must(r.c.RestartAgent(stopped.NodeName))
	began := time.Now()
	res, err := cs.ControllerExpandVolume(r.ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: vol,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 96 << 20}, VolumeCapability: mountCap})
	r.must(err)
	if res.CapacityBytes != 96<<20 || !res.NodeExpansionRequired {
		t.Fatalf("ControllerExpandVolume: %v", res)
	}
	t.Logf("agent back: grown on every diskful replica in %s", time.Since(began).Round(time.Millisecond))
	cur := r.rv(vol)
	for _, m := range cur.Status.Datamesh.Members {
		if !m.Type.HasDisk() {
			continue
		}
		st, err := r.c.Node(m.NodeName).Sim.Status(r.ctx, vol)
		r.must(err)
		if kib := st[0].Devices[0].Size; kib*1024 < 96<<20 {
			t.Fatalf("ControllerExpandVolume returned while %s's DRBD device has %d KiB", m.Name, kib)
		}
	}
	res, err = cs.ControllerExpandVolume(r.ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: vol,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: blockCap})
	r.must(err)
	if res.CapacityBytes != 128<<20 || res.NodeExpansionRequired {
		t.Fatalf("ControllerExpandVolume of a block volume: %v", res)
	}
	// More than a node's pool has free: refused before spec.size changes.
	_, err = cs.ControllerExpandVolume(r.ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: vol,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 50}, VolumeCapability: blockCap})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), pool) {
		t.Fatalf("growing to 1 PiB: %v; want ResourceExhausted naming the pool", err)
	}
	t.Logf("1 PiB: %v", err)
	if s := r.rv(vol).Spec.Size.Value(); s != 128<<20 {
		t.Fatalf("a refused expansion changed spec.size to %d", s)
	}
	got, err := cs.ControllerGetVolume(r.ctx, &csipb.ControllerGetVolumeRequest{VolumeId: vol})
	r.must(err)
	if got.Volume.CapacityBytes != 128<<20 {
		t.Fatalf("ControllerGetVolume after growing to 128 MiB: %d bytes", got.Volume.CapacityBytes)
	}
	r.deleteVolume(vol)
}
