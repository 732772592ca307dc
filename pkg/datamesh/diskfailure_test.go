package datamesh

import (
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestFailedDiskReplacedOnlyWhenSafe: a formed volume's Diskful member whose disk failed
// is replaced — a Diskful replica asked for, then the failed one deleted once the
// replacement is placed — exactly when another Diskful member it is connected to
// reports an UpToDate copy; never while the failed disk may hold the only current
// data, while a report is stale, while the member still attaches its disk, or during
// formation (docs/datamesh.md, "A disk that fails after formation"). Checked on every
// layout and every Diskful member, from Result.Wanted and FailedDisk, not from an
// expected-output file.
func TestFailedDiskReplacedOnlyWhenSafe(t *testing.T) {
	eachFailingDiskful(t, func(w *world, diskful []*v1.ReplicatedVolumeReplica, f *v1.ReplicatedVolumeReplica, name string) {
		for _, r := range w.rvrs {
			r.Status.DatameshRevision = w.rv.Status.DatameshRevision
		}
		// Formation: its own rule, not this one.
		f.Status.DiskState = v1.DiskStateDiskless
		if got := FailedDisk(w.rv, w.rvrs, f.Name); !w.formationActive() || got != DiskNotFailed {
			t.Fatalf("%s: during formation (%v) FailedDisk = %d, want DiskNotFailed", name, w.formationActive(), got)
		}
		f.Status.DiskState = ""
		w.settleAll(t)
		if w.formationActive() {
			t.Fatalf("%s: formation did not complete", name)
		}
		for _, o := range diskful {
			if o != f {
				f.Status.Peers = append(f.Status.Peers, v1.PeerStatus{Name: o.Name, ConnectionState: "Connected"})
			}
		}
		replaces := ""
		wanted := func() (creates int, deletes []string) {
			res, err := w.process(t)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range res.Wanted {
				switch {
				case x.Action == WantCreate && x.Type == v1.ReplicaTypeDiskful:
					creates++
					replaces = x.Replaces
				case x.Action != WantCreate:
					deletes = append(deletes, string(x.Action)+" "+x.Replica)
				}
			}
			return creates, deletes
		}
		check := func(why string, want DiskFailure, wantCreates int) {
			t.Helper()
			creates, deletes := wanted()
			if got := FailedDisk(w.rv, w.rvrs, f.Name); got != want || creates != wantCreates || len(deletes) != 0 {
				t.Fatalf("%s, %s: FailedDisk = %d, %d Diskful creates, removals %v; want %d, %d, none",
					name, why, got, creates, deletes, want, wantCreates)
			}
		}
		for _, ds := range []v1.DiskState{v1.DiskStateUpToDate, v1.DiskStateInconsistent, v1.DiskStateAttaching, v1.DiskStateOutdated} {
			f.Status.DiskState = ds
			check("disk "+string(ds), DiskNotFailed, 0)
		}
		f.Status.DiskState = v1.DiskStateDiskless
		if len(diskful) == 1 {
			check("the only Diskful failed", DiskFailedLastCopy, 0)
			return
		}
		setAgentReady(f, false)
		check("its agent is silent", DiskNotFailed, 0)
		setAgentReady(f, true)
		for _, o := range diskful {
			if o != f {
				o.Status.DiskState = v1.DiskStateOutdated
			}
		}
		check("no other copy is UpToDate", DiskFailedLastCopy, 0)
		for _, o := range diskful {
			if o != f {
				o.Status.DiskState = v1.DiskStateUpToDate
				setAgentReady(o, false)
			}
		}
		check("no other copy's agent reports", DiskFailedLastCopy, 0)
		for i := range f.Status.Peers {
			setAgentReady(w.rvr(f.Status.Peers[i].Name), true)
			f.Status.Peers[i].ConnectionState = "Connecting"
		}
		check("no UpToDate copy is connected to it", DiskFailedLastCopy, 0)
		f.Status.Peers[0].ConnectionState = "Connected"
		for _, ds := range []v1.DiskState{v1.DiskStateDiskless, v1.DiskStateFailed} {
			f.Status.DiskState = ds
			check("disk "+string(ds)+" beside a connected UpToDate copy", DiskFailedReplacing, 1)
			if replaces != f.Name {
				t.Fatalf("%s: the Diskful asked for replaces %q, want %s (placement fills its zone)", name, replaces, f.Name)
			}
		}
		// Placed: the failed replica is deleted (or retyped when attached), nothing else.
		w.place()
		_, deletes := wanted()
		if len(deletes) != 1 || deletes[0] != "Delete "+f.Name {
			t.Fatalf("%s: after the replacement was placed: removals %v, want [Delete %s]", name, deletes, f.Name)
		}
	})
}

func setAgentReady(r *v1.ReplicatedVolumeReplica, ready bool) {
	c := metav1.Condition{Type: v1.ConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.ReasonAgentLeaseValid}
	if !ready {
		c.Status, c.Reason = metav1.ConditionFalse, v1.ReasonAgentLeaseExpired
	}
	setCondition(r, c)
}
