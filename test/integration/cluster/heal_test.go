package cluster_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// The sandbox's partition of a 3D volume on three nodes, healed, and the
// volume attached back on the node that returned (test/e2e
// TestPartitionFailover): the attached node is cut off from its peers and
// the control plane at once, its member force-removed, the volume attached
// on another node and written there. Then the cut heals all at once: the
// returning agent fails the stale Primary's held IO and takes its resource
// down once the device is let go, a new replica joins there, and the volume
// is attached on it right after it joined, without waiting for its resync.
func TestHealedNodeAttachesAgain(t *testing.T) {
	r := newRig(t)
	const vol = "heal-3d"
	rv := r.formed(vol, layoutsNamed("3D")[0])
	// As in the e2e run that found it: the partitioned node is node-id 1, the
	// one the volume moves to node-id 2, so that of the two connects refused
	// at the heal the partitioned node initiates one and not the other.
	var all []string
	var a, b string
	for _, m := range rv.Status.Datamesh.Members {
		all = append(all, m.NodeName)
		switch m.NodeID {
		case 1:
			a = m.NodeName
		case 2:
			b = m.NodeName
		}
	}
	r.cordonAllBut(all...)
	r.attach(vol, a)
	r.must(r.c.Node(a).Sim.Write(r.ctx, vol, 0, bytes.Repeat([]byte{1}, 4096)))
	old := r.replicaOn(vol, a)
	// The partitioned pod: a file system mounted on the device and a writer
	// that overwrites a counter and fsyncs it until a write fails.
	mnt, unstage := r.stageAt(vol, a)
	writerDone := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(mnt+"/counter", os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			writerDone <- err
			return
		}
		defer f.Close()
		for i := 0; ; i++ {
			if _, err := f.WriteAt([]byte(fmt.Sprintf("%12d\n", i)), 0); err != nil {
				writerDone <- err
				return
			}
			if err := f.Sync(); err != nil {
				writerDone <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	release := func() {
		select {
		case err := <-writerDone:
			t.Logf("the partitioned writer ended: %v", err)
		case <-time.After(time.Minute):
			t.Errorf("the partitioned writer did not end within a minute of the heal")
		}
		unstage()
	}

	r.must(r.c.CutOff(a))
	r.c.Partition(a)
	t.Cleanup(func() {
		r.c.Heal()
		_ = r.c.Reconnect(a)
	})
	r.moveAttachment(vol, a, b)
	survivors := bytes.Repeat([]byte{2}, 4096)
	r.must(r.c.Node(b).Sim.Write(r.ctx, vol, 0, survivors))
	// The new pod writes on until it is stopped.
	stopB := make(chan struct{})
	bDone := make(chan struct{})
	go func() {
		defer close(bDone)
		for i := 1; ; i++ {
			select {
			case <-stopB:
				return
			case <-time.After(50 * time.Millisecond):
			}
			_ = r.c.Node(b).Sim.Write(r.ctx, vol, int64(4096*(i%1000+1)), bytes.Repeat([]byte{3}, 4096))
		}
	}()
	r.eventually("the lost node's replica removed", 2*time.Minute, func() string {
		if x := r.replicaOn(vol, a); x != nil && x.UID == old.UID {
			return "still there"
		}
		return ""
	})

	// The heal: links and agent back at once. The survivors may connect to
	// the returning node before its agent has failed the stale Primary's held
	// writes (on-no-quorum io-error): here they do.
	r.c.Node(a).Sim.InjectFault("resource-options", drbdsim.Fault{Err: errors.New("held back by the test")})
	healed := time.Now()
	r.c.Heal()
	r.must(r.c.Reconnect(a))
	r.eventually("the survivors configured for the returning node", time.Minute, func() string {
		for _, m := range r.rv(vol).Status.Datamesh.Members {
			if m.NodeName == a {
				return ""
			}
		}
		return "no member on " + a
	})
	time.Sleep(time.Second)
	r.c.Node(a).Sim.ClearFault("resource-options")
	r.newReplicaWaitsForEarlierDevice(vol, a, old.UID)
	// The kubelet ends the partitioned pod a moment later, once its IO failed.
	time.Sleep(2 * time.Second)
	release()
	r.eventually("the new replica on "+a+" joined", 2*time.Minute, func() string {
		for _, m := range r.rv(vol).Status.Datamesh.Members {
			if m.NodeName == a && m.Type == v1.MemberTypeDiskful {
				return ""
			}
		}
		return "no Diskful member on " + a
	})
	t.Logf("%s joined again %s after the heal", a, time.Since(healed).Round(10*time.Millisecond))
	// The new pod is stopped a few seconds later, its volume attached back on
	// the returning node while that node's new replica may still resync.
	time.Sleep(5 * time.Second)
	close(stopB)
	<-bDone
	r.detach(vol, b)
	r.requestAttach(vol, a)
	r.eventually(vol+" attached on "+a, time.Minute, func() string {
		rva := &v1.ReplicatedVolumeAttachment{}
		r.must(r.cl.Get(r.ctx, client.ObjectKey{Name: v1.AttachmentName(vol, a)}, rva))
		if rva.Status.Phase == v1.AttachmentAttached && r.role(vol, a) == "Primary" {
			return ""
		}
		msg := fmt.Sprintf("RVA phase %q %v; ", rva.Status.Phase, rva.Status.Conditions)
		if x := r.replicaOn(vol, a); x != nil {
			msg += fmt.Sprintf("replica on %s: disk %s, conditions %v; ", a, x.Status.DiskState, x.Status.Conditions)
		}
		return msg + phase(r.rv(vol))
	})
	got, err := r.c.Node(a).Sim.Read(r.ctx, vol, 0, len(survivors))
	r.must(err)
	if !bytes.Equal(got, survivors) {
		t.Fatalf("%s reads %d at offset 0, want %d: the write made on %s while %s was away", a, got[0], survivors[0], b, a)
	}
	r.consistent(vol)
	r.detach(vol, a)
	r.deleteVolume(vol)
}
