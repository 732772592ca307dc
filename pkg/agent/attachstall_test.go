package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/meshvol/meshvol/internal/localcluster"
	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A replica joins a 3D volume whose Primary (node 0) is written all along: as
// LiminalDiskful (connected, diskless) first, then Diskful, when its agent
// attaches a fresh disk to the running resource. That attach loses the
// handshake with one peer, as DRBD 9.2.18 does now and then (drbdsim's
// LoseAttachHandshake; test/vm/FINDINGS.md, "The product on real DRBD", 16):
// the disk stays Negotiating and the agent's adjust waits with it. The agent's
// watchdog cycles one connection per AttachStallTimeout, the Secondaries'
// first, until the disk leaves Negotiating; then the disk resyncs to UpToDate,
// no write of the Primary failed and none was lost.
func TestAttachStallBesideASecondaryEndsAtTheFirstCycle(t *testing.T) {
	r := newStallRig(t, 4)
	names := r.form3D()
	r.attachStall(names, 1, 3, []int{1})
}

// The same with the Primary's handshake lost: both Secondaries are cycled
// first, to no effect, and the Primary's connection last (three voters of four
// stay with it, so it lets the joining replica go unforced).
func TestAttachStallBesideThePrimaryCyclesItLast(t *testing.T) {
	r := newStallRig(t, 4)
	names := r.form3D()
	r.attachStall(names, 0, 3, []int{1, 2, 0})
}

// A 1D volume grows to 2D and the joining replica's attach loses the handshake
// with the Primary, its only peer: the joining replica is the Primary's second
// voter of two, so the Primary refuses the unforced disconnect (drbdsim models
// DRBD 9.2.18's refusal: test/vm/drbd TestReconnect), and the watchdog forces it
// (on-no-quorum suspend-io, the default: the Primary would hold its writes, not
// fail them). The disk reaches UpToDate, no write failed.
func TestAttachStallOfA1DGrowingTo2DForcesThePrimarysCycle(t *testing.T) {
	r := newStallRig(t, 2)
	d := r.addReplica(0, v1.ReplicaTypeDiskful)
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh = v1.Datamesh{Members: []v1.DatameshMember{r.member(d, v1.MemberTypeDiskful, 0)},
			Quorum: 1, QuorumMinimumRedundancy: 1, Port: 7000, Minor: 1000}
		formation(st, st.DatameshRevision+1)
	})
	r.confirmed(rev, v1.DiskStateUpToDate, d)
	r.publish(func(st *v1.ReplicatedVolumeStatus) { st.DatameshTransitions = nil })
	r.attachStall([]string{d}, 0, 1, []int{0})
	if !strings.Contains(r.logs(), "the Primary refused the disconnect") {
		t.Fatalf("the watchdog did not force the Primary's cycle after a refusal; its log:\n%s", r.attachStallLog())
	}
}

// stallRig is a rig whose agents cycle after 2 s and whose log is kept.
type stallRig struct {
	*rig
	mu  sync.Mutex
	log strings.Builder
}

func newStallRig(t *testing.T, nodes int) *stallRig {
	s := &stallRig{}
	sink := funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.log.WriteString(prefix + " " + args + "\n")
	}, funcr.Options{})
	s.rig = newRigWith(t, nodes, localcluster.Options{Agent: func(c *agent.Config) { c.AttachStallTimeout = 2 * time.Second }, Log: sink})
	s.c.Sim.SetConnectInt(500 * time.Millisecond)
	return s
}

func (s *stallRig) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

// attachStallLog is the watchdog's lines of the log, for a failure's report.
func (s *stallRig) attachStallLog() string {
	var out []string
	for _, l := range strings.Split(s.logs(), "\n") {
		if strings.Contains(l, "attach stall") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// attachStall: node 0 of the formed volume (its members names) is attached and
// written; a replica on node `joining` joins as LiminalDiskful with q raised
// for its vote (docs/datamesh.md), then becomes Diskful with its attach losing
// the handshake with node `stalled`. The watchdog must cycle exactly
// wantCycled (node indexes, in order), and the replica reach UpToDate with no
// write failed or lost.
func (s *stallRig) attachStall(members []string, stalled, joining int, wantCycled []int) {
	r, t := s.rig, s.t
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", members...)

	var writes, failures atomic.Int64
	var firstFailure atomic.Value
	ctx, stop := context.WithCancel(r.ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := int64(0); ctx.Err() == nil; i++ {
			if err := r.node(0).Sim.Write(ctx, r.rv, (i%512)*4096, bytes.Repeat([]byte{byte(i + 1)}, 4096)); err != nil && ctx.Err() == nil {
				failures.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
			writes.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	defer func() { stop(); wg.Wait() }()

	name := r.addReplica(joining, v1.ReplicaTypeDiskful)
	m := r.member(name, v1.MemberTypeLiminalDiskful, int32(len(members)))
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members = append(st.Datamesh.Members, m)
		st.Datamesh.Quorum = int32(len(members)+1)/2 + 1 // the diskful peers count the D∅ (docs/datamesh.md)
	})
	r.confirmed(rev, "", append(members, name)...)
	r.eventually("the joining replica connected to its peers", 30*time.Second, func() string {
		st, err := r.node(joining).Sim.Status(r.ctx, r.rv)
		if err != nil || len(st) != 1 || len(st[0].Connections) != len(members) {
			return fmt.Sprint(st, err)
		}
		for _, c := range st[0].Connections {
			if c.ConnectionState != "Connected" {
				return fmt.Sprintf("%+v", st[0])
			}
		}
		return ""
	})

	events := r.recordEvents(joining)

	r.node(joining).Sim.LoseAttachHandshake(r.rv, r.node(stalled).Name)
	attachAt := time.Now()
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[len(members)].Type = v1.MemberTypeDiskful })
	r.eventually("the joining replica UpToDate", 2*time.Minute, func() string {
		o := r.rvr(name)
		if o.Status.DiskState != v1.DiskStateUpToDate || o.Status.DatameshRevision < rev {
			return fmt.Sprintf("disk %s revision %d", o.Status.DiskState, o.Status.DatameshRevision)
		}
		return ""
	})
	took := time.Since(attachAt)
	stop()
	wg.Wait()

	lines := strings.Split(events(), "\n")
	negotiating := false
	var cycled []string
	for _, l := range lines {
		if strings.Contains(l, " device ") && strings.Contains(l, "disk:Negotiating") {
			negotiating = true
		}
		if strings.Contains(l, " connection ") && strings.Contains(l, "connection:Disconnecting") {
			for _, f := range strings.Fields(l) {
				if peer, ok := strings.CutPrefix(f, "conn-name:"); ok {
					cycled = append(cycled, peer)
				}
			}
		}
	}
	if !negotiating {
		t.Fatalf("the joining replica's disk was never Negotiating: the lost handshake did not fire")
	}
	var want []string
	for _, i := range wantCycled {
		want = append(want, r.node(i).Name)
	}
	if !slices.Equal(cycled, want) {
		t.Fatalf("the watchdog cycled %v, want %v (Secondaries first, the Primary last, none after the stall ended); its log:\n%s",
			cycled, want, s.attachStallLog())
	}
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d of %d writes of the Primary failed, first: %v", n, writes.Load(), firstFailure.Load())
	}
	if writes.Load() == 0 {
		t.Fatal("the writer wrote nothing")
	}
	if lost := r.c.Sim.LostAckedWrites(r.rv); len(lost) > 0 {
		t.Fatalf("acknowledged writes lost: %v", lost)
	}
	if !strings.Contains(s.logs(), "attach stall over") {
		t.Fatalf("the watchdog did not log the end of the stall; its log:\n%s", s.attachStallLog())
	}
	t.Logf("stalled beside %s: cycled %v; UpToDate %s after the attach was asked for; %d writes, none failed",
		r.node(stalled).Name, cycled, took.Round(100*time.Millisecond), writes.Load())
}
