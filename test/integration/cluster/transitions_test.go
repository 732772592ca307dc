package cluster_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// manualVolume creates a Manual volume with the given protection.
func (r *rig) manualVolume(name string, ftt, gmdr int32) {
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ReplicatedVolumeSpec{
		Size:              resource.MustParse("64Mi"),
		ConfigurationMode: v1.ConfigurationModeManual,
		ManualConfiguration: &v1.ReplicatedVolumeConfiguration{
			StoragePool: pool, FailuresToTolerate: ftt, GuaranteedMinimumDataRedundancy: gmdr, Topology: v1.TopologyIgnored},
		MaxAttachments: 1,
	}}
	r.must(r.cl.Create(r.ctx, rv))
}

// reconfigure changes a Manual volume's protection.
func (r *rig) reconfigure(name string, ftt, gmdr int32) {
	r.t.Helper()
	for {
		rv := r.rv(name)
		rv.Spec.ManualConfiguration.FailuresToTolerate = ftt
		rv.Spec.ManualConfiguration.GuaranteedMinimumDataRedundancy = gmdr
		err := r.cl.Update(r.ctx, rv)
		if !apierrors.IsConflict(err) {
			r.must(err)
			return
		}
	}
}

// readyAs waits until the volume is Ready with exactly the layout's members.
func (r *rig) readyAs(name string, l layoutCase, d time.Duration) *v1.ReplicatedVolume {
	r.t.Helper()
	var cur *v1.ReplicatedVolume
	r.eventually(fmt.Sprintf("%s Ready as %s", name, l.name), d, func() string {
		cur = r.rv(name)
		dd, tb := 0, 0
		for _, m := range cur.Status.Datamesh.Members {
			switch m.Type {
			case v1.MemberTypeDiskful:
				dd++
			case v1.MemberTypeTieBreaker:
				tb++
			}
		}
		if cur.Status.Phase != v1.VolumePhaseReady || len(cur.Status.DatameshTransitions) > 0 || dd != l.d || tb != l.tb {
			return fmt.Sprintf("%dD+%dTB, %s", dd, tb, phase(cur))
		}
		return ""
	})
	return cur
}

// writer writes through the attached node's device until stopped; every
// write must be acknowledged (none fails).
type writer struct {
	writes, failures atomic.Int64
	lastErr          atomic.Value
	stop             chan struct{}
	done             chan struct{}
}

func (r *rig) startWriter(vol, node string) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := int64(0); ; i++ {
			select {
			case <-w.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
			err := r.c.Node(node).Sim.Write(ctx, vol, (i%512)*4096, bytes.Repeat([]byte{byte(i)}, 4096))
			cancel()
			w.writes.Add(1)
			if err != nil {
				w.failures.Add(1)
				w.lastErr.Store(err.Error())
			}
			time.Sleep(3 * time.Millisecond)
		}
	}()
	return w
}

func (w *writer) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	<-w.done
	if n := w.failures.Load(); n > 0 {
		t.Fatalf("%d of %d writes failed; last: %v", n, w.writes.Load(), w.lastErr.Load())
	}
	t.Logf("%d writes, none failed", w.writes.Load())
}

// upToDateWatch samples every node's DRBD and records the fewest UpToDate
// diskful copies seen.
type upToDateWatch struct {
	mu     sync.Mutex
	fewest int
	stop   chan struct{}
	done   chan struct{}
}

func (r *rig) watchUpToDate(vol string) *upToDateWatch {
	u := &upToDateWatch{fewest: 1 << 30, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(u.done)
		for {
			select {
			case <-u.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			n := 0
			for _, node := range r.c.Nodes {
				st, err := node.Sim.Status(r.ctx, vol)
				if err == nil && len(st) == 1 && len(st[0].Devices) == 1 && st[0].Devices[0].DiskState == "UpToDate" {
					n++
				}
			}
			u.mu.Lock()
			u.fewest = min(u.fewest, n)
			u.mu.Unlock()
		}
	}()
	return u
}

func (u *upToDateWatch) finish() int {
	close(u.stop)
	<-u.done
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.fewest
}

// Scenario 2: FTT and GMDR up and down on a live, attached volume while a
// writer runs the whole time: no write fails, no acknowledged write is lost
// (drbdsim's oracle), no split brain, and never fewer UpToDate copies than
// GMDR+1 of the weaker of the two configurations of each step.
func TestProtectionChangesUnderWrites(t *testing.T) {
	r := newRig(t)
	const vol = "protect"
	r.manualVolume(vol, 0, 1)
	rv := r.readyAs(vol, layouts[1], 2*time.Minute)
	node := rv.Status.Datamesh.Members[0].NodeName
	r.attach(vol, node)
	w := r.startWriter(vol, node)
	prev := layouts[1]
	var report []string
	for _, l := range []layoutCase{layouts[3], layouts[4], layouts[3], layouts[2], layouts[1]} { // 2D → 3D → 4D → 3D → 2D+1TB → 2D
		u := r.watchUpToDate(vol)
		began := time.Now()
		r.reconfigure(vol, l.ftt, l.gmdr)
		r.readyAs(vol, l, 2*time.Minute)
		fewest := u.finish()
		need := int(min(prev.gmdr, l.gmdr)) + 1
		report = append(report, fmt.Sprintf("%s → %s in %s, fewest UpToDate copies %d (need ≥ %d)", prev.name, l.name, time.Since(began).Round(10*time.Millisecond), fewest, need))
		if fewest < need {
			t.Errorf("%s → %s: only %d UpToDate copies at some point, GMDR needs %d", prev.name, l.name, fewest, need)
		}
		prev = l
	}
	w.finish(t)
	t.Logf("protection changes under writes:\n%s", strings.Join(report, "\n"))
	r.consistent(vol)
	r.detach(vol, node)
	r.deleteVolume(vol)
}

// Scenario 6: the controller is killed and restarted after every published
// step of a 3D → 4D+1TB change, and an agent is restarted mid-transition;
// the change still completes, writes never fail, nothing is lost.
func TestRestartsMidTransition(t *testing.T) {
	r := newRig(t)
	const vol = "restarts"
	r.manualVolume(vol, 1, 1)
	rv := r.readyAs(vol, layouts[3], 2*time.Minute)
	node := rv.Status.Datamesh.Members[0].NodeName
	agentNode := rv.Status.Datamesh.Members[1].NodeName
	r.attach(vol, node)
	w := r.startWriter(vol, node)

	r.reconfigure(vol, 2, 1)
	restarts := 0
	agentRestarted := false
	last := rv.Status.DatameshRevision
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		cur := r.rv(vol)
		if cur.Status.DatameshRevision != last {
			last = cur.Status.DatameshRevision
			// Kill the controller between this step's publication and its
			// confirmation, then start a new one.
			r.must(r.c.StopController())
			time.Sleep(200 * time.Millisecond)
			r.c.StartController()
			restarts++
			if !agentRestarted && len(cur.Status.DatameshTransitions) > 0 {
				r.must(r.c.RestartAgent(agentNode))
				agentRestarted = true
			}
		}
		if cur.Status.Phase == v1.VolumePhaseReady && len(cur.Status.DatameshTransitions) == 0 && cur.Status.Layout == "4D+1TB" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	final := r.readyAs(vol, layouts[5], time.Minute)
	t.Logf("3D → 4D+1TB completed through %d controller restarts (one per published step) and an agent restart; revision %d", restarts, final.Status.DatameshRevision)
	if !agentRestarted {
		t.Errorf("no transition was seen in flight to restart an agent in")
	}
	w.finish(t)
	r.checkLayout(final, layouts[5], v1.TopologyIgnored)
	r.consistent(vol)
	r.detach(vol, node)
	r.deleteVolume(vol)
}
