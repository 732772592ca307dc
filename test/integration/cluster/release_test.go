package cluster_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The attached node crashes, and ControllerUnpublishVolume of its attachment returns
// once the controller has force-detached the lost member — not after the survivors
// confirmed that and the force removal (and, for 2D+1TB, q↓) that follow — while the
// new node's ControllerPublishVolume still waits for all of them (docs/controller.md,
// "Releasing a lost node's attachment").
//
// To hold the engine's steps still long enough to look, the agent of the third member
// (3D: the other survivor's; 2D+1TB: the TieBreaker's) is stopped just before the
// crash: its DRBD keeps running and connected, but it confirms nothing, so the force
// detach stays unconfirmed and the force removal blocked (MemberUnreachable: its
// report is stale). Before the release came early, ControllerUnpublishVolume waited
// for that agent too.
func TestLostNodeAttachmentReleasedEarly(t *testing.T) {
	for _, c := range []struct {
		name      string
		ftt, gmdr int32
	}{{"3d", 1, 1}, {"2d1tb", 1, 0}} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			vol := "release-" + c.name
			r.volume(vol, r.class(c.ftt, c.gmdr, v1.TopologyIgnored), 1)
			rv := r.ready(vol, 2*time.Minute)
			var diskful []string
			third := ""
			for _, m := range rv.Status.Datamesh.Members {
				if m.Type == v1.MemberTypeDiskful && len(diskful) < 2 {
					diskful = append(diskful, m.NodeName)
				} else {
					third = m.NodeName
				}
			}
			if len(diskful) != 2 || third == "" {
				t.Fatalf("want two Diskful members and a third, got %v", rv.Status.Datamesh.Members)
			}
			a, b := diskful[0], diskful[1]
			cs := r.csiController()
			_, err := cs.ControllerPublishVolume(r.ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: a, VolumeCapability: singleWriterMount})
			r.must(err)
			for i := range 8 {
				r.must(r.c.Node(a).Sim.Write(r.ctx, vol, int64(i)*4096, bytes.Repeat([]byte{byte(i + 1)}, 4096)))
			}

			r.must(r.c.StopAgent(third))
			thirdStopped := true
			t.Cleanup(func() {
				if thirdStopped {
					_ = r.c.RestartAgent(third)
				}
			})
			crashed := time.Now()
			r.must(r.c.CrashNode(a))
			t.Cleanup(func() { _ = r.c.RestartNode(a) })

			// What external-attacher does once the lost node's VolumeAttachment is
			// deleted.
			ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
			_, err = cs.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: a})
			cancel()
			r.must(err)
			released := time.Since(crashed)
			cur := r.rv(vol)
			lostMember := ""
			for _, m := range cur.Status.Datamesh.Members {
				if m.NodeName == a {
					lostMember = m.Name
				}
			}
			if lostMember == "" {
				t.Fatalf("ControllerUnpublishVolume returned %s after the crash, but only after the lost member was force-removed (members %v): not early", released, cur.Status.Datamesh.Members)
			}
			if !slices.ContainsFunc(cur.Status.DatameshTransitions, func(tr v1.DatameshTransition) bool {
				return tr.Type == v1.TransitionForceDetach && tr.ReplicaName == lostMember
			}) {
				t.Fatalf("ControllerUnpublishVolume returned with %s's ForceDetach not in flight: transitions %v", lostMember, cur.Status.DatameshTransitions)
			}
			t.Logf("crash of %s → ControllerUnpublishVolume returned in %s, %s still a member, its ForceDetach unconfirmed (the agent of %s stopped)",
				a, released.Round(10*time.Millisecond), lostMember, third)

			// The new node waits: the engine attaches it only after the force
			// detach, the removal and its q↓ are confirmed.
			publishB := &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: b, VolumeCapability: singleWriterMount}
			ctx, cancel = context.WithTimeout(r.ctx, 5*time.Second)
			_, err = cs.ControllerPublishVolume(ctx, publishB)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("ControllerPublishVolume on %s while the lost member's removal cannot be confirmed: %v, want DeadlineExceeded", b, err)
			}
			if role := r.role(vol, b); role == "Primary" {
				t.Fatalf("%s is Primary while %s's force detach is unconfirmed", b, lostMember)
			}
			t.Logf("ControllerPublishVolume on %s waits: %v", b, err)

			r.must(r.c.RestartAgent(third))
			thirdStopped = false
			_, err = cs.ControllerPublishVolume(r.ctx, publishB)
			r.must(err)
			cur = r.rv(vol)
			for _, m := range cur.Status.Datamesh.Members {
				if m.NodeName == a {
					t.Fatalf("%s attached while the lost member %s is still in the datamesh", b, m.Name)
				}
			}
			for _, tr := range cur.Status.DatameshTransitions {
				if tr.ReplicaName == lostMember {
					t.Fatalf("%s attached while %s of the lost member %s is unconfirmed", b, tr.Type, lostMember)
				}
			}
			if why := r.quorate(vol, b); why != "" {
				t.Fatalf("%s attached without quorum: %s", b, why)
			}
			t.Logf("crash of %s → attached on %s in %s (q=%d)", a, b, time.Since(crashed).Round(10*time.Millisecond), cur.Status.Datamesh.Quorum)
			for i := range 8 {
				got, err := r.c.Node(b).Sim.Read(r.ctx, vol, int64(i)*4096, 4096)
				r.must(err)
				if got[0] != byte(i+1) {
					t.Fatalf("block %d reads %d on %s after failover, want %d", i, got[0], b, i+1)
				}
			}
			r.consistent(vol)
			_, err = cs.ControllerUnpublishVolume(r.ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: b})
			r.must(err)
			r.must(r.c.RestartNode(a))
			r.deleteVolume(vol)
		})
	}
}
