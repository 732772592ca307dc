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
	attachStall(t, 1, []int{1})
}

// The same with the Primary's handshake lost: both Secondaries are cycled
// first, to no effect, and the Primary's connection last.
func TestAttachStallBesideThePrimaryCyclesItLast(t *testing.T) {
	attachStall(t, 0, []int{1, 2, 0})
}

func attachStall(t *testing.T, stalled int, wantCycled []int) {
	const bound = 2 * time.Second
	r := newRig(t, 4, func(c *agent.Config) { c.AttachStallTimeout = bound })
	r.c.Sim.SetConnectInt(500 * time.Millisecond)
	names := r.form3D()
	rev := r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[0].Attached = true })
	r.confirmed(rev, "", names...)

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

	joining := r.addReplica(3, v1.ReplicaTypeDiskful)
	m := r.member(joining, v1.MemberTypeLiminalDiskful, 3)
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) {
		st.Datamesh.Members = append(st.Datamesh.Members, m)
		st.Datamesh.Quorum = 3 // four voters: the diskful peers count the D∅ (docs/datamesh.md)
	})
	r.confirmed(rev, "", append(names, joining)...)
	r.eventually("the joining replica connected to its three peers", 30*time.Second, func() string {
		st, err := r.node(3).Sim.Status(r.ctx, r.rv)
		if err != nil || len(st) != 1 || len(st[0].Connections) != 3 {
			return fmt.Sprint(st, err)
		}
		for _, c := range st[0].Connections {
			if c.ConnectionState != "Connected" {
				return fmt.Sprintf("%+v", st[0])
			}
		}
		return ""
	})

	events, err := r.node(3).Sim.Events(r.ctx)
	r.must(err)
	defer events.Close()
	var evMu sync.Mutex
	var ev bytes.Buffer
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := events.Read(buf)
			evMu.Lock()
			ev.Write(buf[:n])
			evMu.Unlock()
			if err != nil {
				return
			}
		}
	}()

	r.node(3).Sim.LoseAttachHandshake(r.rv, r.node(stalled).Name)
	attachAt := time.Now()
	rev = r.publish(func(st *v1.ReplicatedVolumeStatus) { st.Datamesh.Members[3].Type = v1.MemberTypeDiskful })
	r.eventually("the joining replica UpToDate", 2*time.Minute, func() string {
		o := r.rvr(joining)
		if o.Status.DiskState != v1.DiskStateUpToDate || o.Status.DatameshRevision < rev {
			return fmt.Sprintf("disk %s revision %d", o.Status.DiskState, o.Status.DatameshRevision)
		}
		return ""
	})
	took := time.Since(attachAt)
	stop()
	wg.Wait()

	evMu.Lock()
	lines := strings.Split(ev.String(), "\n")
	evMu.Unlock()
	negotiating := false
	var cycled []string
	for _, l := range lines {
		if strings.Contains(l, " device ") && strings.Contains(l, "disk:Negotiating") {
			negotiating = true
		}
		if strings.Contains(l, " connection ") && strings.Contains(l, "connection:Disconnecting") {
			for _, f := range strings.Fields(l) {
				if name, ok := strings.CutPrefix(f, "conn-name:"); ok {
					cycled = append(cycled, name)
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
		t.Fatalf("the watchdog cycled %v, want %v (Secondaries first, the Primary last, none after the stall ended)", cycled, want)
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
	t.Logf("stalled beside %s: cycled %v; UpToDate %s after the attach was asked for; %d writes, none failed",
		r.node(stalled).Name, cycled, took.Round(100*time.Millisecond), writes.Load())
}
