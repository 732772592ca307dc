//go:build integrationpending

package cluster_test

// Scenarios that do not pass yet, kept runnable for whoever fixes them:
// `go test -tags integrationpending ./test/integration/cluster -run 'TestNodeCrashThreeNodes2D1TB|TestZZStop'`.
// Not part of `make test`.
//
// TestNodeCrashThreeNodes2D1TB (seen 2026-11-25, also as the sandbox's
// TestNodeCrash on its default class): 2D+1TB on three nodes, the attached
// Diskful node crashes, the attachment moves to the other Diskful or to the
// TieBreaker. The new Primary is promoted (the survivor D is quorate through
// DRBD's tiebreaker: one of two voters plus the TB), and then loses quorum
// for good: the promotion is a cluster-wide state change taken while
// quorate, which drops the dead voter from the survivor's members set
// (docs/drbd-quorum.md: it becomes quorumless and leaves the electorate),
// so one voter is left under the datamesh's explicit `quorum 2`. The engine
// meanwhile holds the dead voter's force removal, and q, until a
// replacement Diskful can join (emergency.go awaitReplacement: "the
// tiebreaker keeps the volume quorate until then"), which three nodes never
// offer. The survivor stays Primary with quorum:no and IO suspended.

import (
	"bytes"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func TestNodeCrashThreeNodes2D1TB(t *testing.T) {
	for _, onTB := range []bool{false, true} {
		t.Run(map[bool]string{false: "to-diskful", true: "to-tiebreaker"}[onTB], func(t *testing.T) {
			r := newRig(t)
			vol := "crash3-2d1tb-d"
			if onTB {
				vol = "crash3-2d1tb-tb"
			}
			r.volume(vol, r.class(1, 0, v1.TopologyIgnored), 1)
			rv := r.ready(vol, 2*time.Minute)
			var diskful, all []string
			var tb string
			for _, m := range rv.Status.Datamesh.Members {
				all = append(all, m.NodeName)
				if m.Type == v1.MemberTypeDiskful {
					diskful = append(diskful, m.NodeName)
				} else {
					tb = m.NodeName
				}
			}
			r.cordonAllBut(all...)
			a, b := diskful[0], diskful[1]
			if onTB {
				b = tb
			}
			r.attach(vol, a)
			r.must(r.c.Node(a).Sim.Write(r.ctx, vol, 0, bytes.Repeat([]byte{1}, 4096)))
			crashed := time.Now()
			r.must(r.c.CrashNode(a))
			t.Cleanup(func() { _ = r.c.RestartNode(a) })
			r.must(client.IgnoreNotFound(r.cl.Delete(r.ctx, &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: rvaName(vol, a)}})))
			r.eventually("the dead node's RVA released", 2*time.Minute, func() string {
				if err := r.cl.Get(r.ctx, client.ObjectKey{Name: rvaName(vol, a)}, &v1.ReplicatedVolumeAttachment{}); !apierrors.IsNotFound(err) {
					return "RVA still there"
				}
				return ""
			})
			r.requestAttach(vol, b)
			r.attached(vol, b, 2*time.Minute)
			r.eventually(vol+" writable on "+b, time.Minute, func() string { return r.quorate(vol, b) })
			time.Sleep(3 * time.Second)
			if msg := r.quorate(vol, b); msg != "" {
				t.Fatalf("%s on %s lost quorum after the attach: %s", vol, b, msg)
			}
			t.Logf("node crash → writable on %s: %s", b, time.Since(crashed).Round(10*time.Millisecond))
			r.detach(vol, b)
			r.must(r.c.RestartNode(a))
			r.deleteVolume(vol)
		})
	}
}
