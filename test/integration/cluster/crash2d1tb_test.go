package cluster_test

// TestNodeCrashThreeNodes2D1TB: 2D+1TB on three nodes, the attached Diskful
// node crashes, and the attachment moves to the other Diskful or to the
// TieBreaker — with no fourth node for a replacement. Until 2026-11-25 the
// new Primary lost quorum for good: the survivor was quorate only through
// DRBD's tiebreaker, the promotion (a cluster-wide state change) dropped the
// dead voter from its members set, and one voter was left under the explicit
// q=2 the engine held until a replacement could join. Now, with nothing
// attached, the dead voter's removal starts at once, and once every survivor
// has confirmed it its q↓ follows (q=1): the survivor, or the TieBreaker
// through it, attaches and writes (datamesh replace_lost_voter_detached.txt).

import (
	"bytes"
	"testing"
	"time"

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
			took := r.moveAfterCrash(vol, a, b)
			t.Logf("node crash → writable on %s: %s", b, took.Round(10*time.Millisecond))
			r.detach(vol, b)
			r.must(r.c.RestartNode(a))
			r.deleteVolume(vol)
		})
	}
}
