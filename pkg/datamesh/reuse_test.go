package datamesh

import (
	"math/rand"
	"strconv"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReusedEngineMatchesFresh drives volumes through random perturbations of steady
// states, one to three at a time, and after every Process compares the engine, which
// has served every call before, with a fresh engine on a copy of the same input:
// nothing of one call may reach the next (the engine is level-based, and a restarted
// controller must decide exactly the same). After the
// perturbations the cluster heals and placement acts until the volume is steady again
// (or stuck: some perturbations leave conflicts only a person resolves).
func TestReusedEngineMatchesFresh(t *testing.T) {
	layouts := [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 1}, {2, 2}}
	total := 0
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 250; round++ {
		l := layouts[rng.Intn(len(layouts))]
		w := steadyWorld(t, l[0], l[1], rng.Intn(4))
		w.rv.Spec.MaxAttachments = int32(1 + rng.Intn(2))
		w.eng = NewEngine(w.reg, w.features)
		step := func() {
			w.last, _ = w.processOnBoth(t)
			w.force, w.fdetach, w.cq = nil, nil, nil
			total++
		}
		step() // the steady volume itself
		{
			// One to three perturbations of the steady volume, a reconcile each...
			for n := rng.Intn(3); n >= 0; n-- {
				perturb(t, w, rng)
				step()
			}
			// ...then the cluster heals and placement acts until the volume is steady.
			for i := 0; i < 12; i++ {
				for _, r := range w.rvrs {
					r.Status.Conditions = nil
					r.Status.DatameshRevision = w.rv.Status.DatameshRevision
					if r.Spec.Type == v1.ReplicaTypeDiskful {
						r.Status.DiskState = v1.DiskStateUpToDate
					}
				}
				w.place()
				step()
				if !w.last.Changed && len(w.rv.Status.DatameshTransitions) == 0 && len(w.last.Wanted) == 0 {
					break
				}
			}
		}
	}
	t.Logf("%d reconciles compared", total)
}

func perturb(t *testing.T, w *world, rng *rand.Rand) {
	pick := func() *v1.ReplicatedVolumeReplica {
		if len(w.rvrs) == 0 {
			return nil
		}
		return w.rvrs[rng.Intn(len(w.rvrs))]
	}
	now := metav1.NewTime(w.now)
	switch rng.Intn(24) {
	case 0:
		if r := pick(); r != nil {
			r.DeletionTimestamp = &now
		}
	case 1:
		if r := pick(); r != nil {
			r.Spec.Type = []v1.ReplicaType{v1.ReplicaTypeDiskful, v1.ReplicaTypeAccess, v1.ReplicaTypeTieBreaker}[rng.Intn(3)]
		}
	case 2:
		if r := pick(); r != nil {
			switch rng.Intn(4) {
			case 0: // the controller says the agent is silent
				setCondition(r, metav1.Condition{Type: v1.ConditionAgentReady, Status: metav1.ConditionFalse, Reason: v1.ReasonAgentLeaseExpired})
			case 1: // and back
				setCondition(r, metav1.Condition{Type: v1.ConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.ReasonAgentLeaseValid})
			default:
				reason := []string{v1.ReasonConfigured, v1.ReasonApplyingConfiguration}[rng.Intn(2)]
				st := metav1.ConditionFalse
				if reason == v1.ReasonConfigured {
					st = metav1.ConditionTrue
				}
				setCondition(r, metav1.Condition{Type: v1.ConditionDRBDConfigured, Status: st, Reason: reason})
			}
		}
	case 3:
		if r := pick(); r != nil {
			r.Status.DiskState = []v1.DiskState{v1.DiskStateUpToDate, v1.DiskStateOutdated, ""}[rng.Intn(3)]
		}
	case 4:
		if len(w.rvrs) > 0 {
			i := rng.Intn(len(w.rvrs))
			w.rvrs = append(w.rvrs[:i], w.rvrs[i+1:]...)
		}
	case 5:
		n := "r" + strconv.Itoa(50+rng.Intn(50))
		if w.rvr(n) == nil {
			w.addRVR(n, "n"+strconv.Itoa(10+rng.Intn(30)), []v1.ReplicaType{v1.ReplicaTypeDiskful, v1.ReplicaTypeAccess, v1.ReplicaTypeTieBreaker}[rng.Intn(3)])
		}
	case 6:
		node := "n" + strconv.Itoa(1+rng.Intn(12))
		if r := pick(); r != nil && rng.Intn(2) == 0 {
			node = r.Spec.NodeName
		}
		a := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "rva-" + strconv.Itoa(rng.Intn(1000)), CreationTimestamp: metav1.NewTime(w.now.Add(-w.now.Sub(w.now.Truncate(0))))}}
		a.Spec.NodeName = node
		w.rvas = append(w.rvas, a)
	case 7:
		if len(w.rvas) > 0 {
			i := rng.Intn(len(w.rvas))
			if rng.Intn(2) == 0 {
				w.rvas = append(w.rvas[:i], w.rvas[i+1:]...)
			} else {
				w.rvas[i].DeletionTimestamp = &now
			}
		}
	case 8:
		if ms := w.rv.Status.Datamesh.Members; len(ms) > 0 {
			i := rng.Intn(len(ms))
			ms[i].Attached = !ms[i].Attached
		}
	case 9:
		w.rv.Status.Datamesh.Multiattach = !w.rv.Status.Datamesh.Multiattach
	case 10:
		l := [][2]int{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 1}, {2, 2}, {0, 2}, {1, 2}}[rng.Intn(8)]
		c := w.rv.Spec.ManualConfiguration
		c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy = int32(l[0]), int32(l[1])
	case 11:
		rng.Shuffle(len(w.rvrs), func(i, j int) { w.rvrs[i], w.rvrs[j] = w.rvrs[j], w.rvrs[i] })
	case 12:
		rng.Shuffle(len(w.rvas), func(i, j int) { w.rvas[i], w.rvas[j] = w.rvas[j], w.rvas[i] })
	case 13:
		if rs := w.rv.Status.DatameshReplicaRequests; len(rs) > 1 {
			i := rng.Intn(len(rs) - 1)
			rs[i], rs[i+1] = rs[i+1], rs[i]
		}
	case 14:
		if rs := w.rv.Status.DatameshReplicaRequests; len(rs) > 0 {
			i := rng.Intn(len(rs))
			w.rv.Status.DatameshReplicaRequests = append(rs[:i], rs[i+1:]...)
		}
	case 15:
		w.rv.Status.Datamesh.Quorum += int32(rng.Intn(3) - 1)
	case 16:
		w.rv.Status.Datamesh.QuorumMinimumRedundancy += int32(rng.Intn(3) - 1)
	case 17:
		if rng.Intn(2) == 0 {
			w.rv.Status.EffectiveLayout = nil
		} else if el := w.rv.Status.EffectiveLayout; el != nil {
			el.FailuresToTolerate = int32(rng.Intn(3))
		}
	case 18:
		if r := pick(); r != nil {
			w.force = append(w.force, r.Name)
		}
	case 19:
		if r := pick(); r != nil {
			w.fdetach = append(w.fdetach, r.Name)
		}
	case 20:
		w.rv.Spec.MaxAttachments = int32(1 + rng.Intn(2))
	case 21:
		if ms := w.rv.Status.Datamesh.Members; len(ms) > 1 {
			i := rng.Intn(len(ms) - 1)
			ms[i], ms[i+1] = ms[i+1], ms[i]
		}
	case 22:
		if r := pick(); r != nil {
			r.Spec.NodeName = "n" + strconv.Itoa(1+rng.Intn(12))
		}
	case 23:
		// nothing: a reconcile of an unchanged volume
	}
}
