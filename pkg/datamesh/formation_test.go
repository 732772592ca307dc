package datamesh

import (
	"strconv"
	"strings"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestFormationReplacesOnlyAFailedDisk: during formation, and only then, a Diskful member
// whose disk failed after it ran the formation's configuration is deleted so that
// formation starts over (docs/datamesh.md "Formation"): a member still attaching, or one
// with a disk, is never deleted, and a formed volume never loses a replica by this rule.
// Checked on every layout and every Diskful member, from Result.Wanted, not from an
// expected-output file.
func TestFormationReplacesOnlyAFailedDisk(t *testing.T) {
	eachFailingDiskful(t, func(w *world, diskful []*v1.ReplicatedVolumeReplica, f *v1.ReplicatedVolumeReplica, name string) {
		if w.rv.Status.DatameshRevision == 0 || !w.formationActive() {
			t.Fatalf("%s: formation did not publish its members", name)
		}
		deletes := func() (out []string) {
			res, err := w.process(t)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range res.Wanted {
				if x.Action == WantDelete {
					out = append(out, x.Replica)
				}
			}
			return out
		}
		for _, r := range diskful {
			r.Status.DiskState = v1.DiskStateInconsistent
		}
		// Still applying revision 1 (reports revision 0): Diskless is no failure yet.
		f.Status.DiskState = v1.DiskStateDiskless
		if got := deletes(); len(got) != 0 {
			t.Fatalf("%s: a member still attaching was deleted: %v", name, got)
		}
		for _, r := range w.rvrs {
			r.Status.DatameshRevision = w.rv.Status.DatameshRevision
		}
		for _, ds := range []v1.DiskState{v1.DiskStateInconsistent, v1.DiskStateAttaching, v1.DiskStateConsistent} {
			f.Status.DiskState = ds
			if got := deletes(); len(got) != 0 {
				t.Fatalf("%s: a member with disk %s was deleted: %v", name, ds, got)
			}
		}
		for _, ds := range []v1.DiskState{v1.DiskStateDiskless, v1.DiskStateFailed} {
			f.Status.DiskState = ds
			if got := deletes(); len(got) != 1 || got[0] != f.Name {
				t.Fatalf("%s: disk %s during formation: deletes %v, want exactly [%s]", name, ds, got, f.Name)
			}
			if msg := w.rv.Status.DatameshTransitions[0].Steps[1].Message; !strings.Contains(msg, f.Name) {
				t.Fatalf("%s: the step does not name the failed disk: %q", name, msg)
			}
		}
		// Formed: the same report deletes nothing by this rule.
		f.Status.DiskState = ""
		w.settleAll(t)
		if w.formationActive() {
			t.Fatalf("%s: formation did not complete", name)
		}
		f.Status.DiskState = v1.DiskStateDiskless
		for _, d := range deletes() {
			if d == f.Name {
				t.Fatalf("%s: a formed volume's member was deleted for its failed disk by the formation rule", name)
			}
		}
	})
}

// eachFailingDiskful calls check on a fresh world for each of a few configurations and
// each Diskful replica its placement creates: every Diskful replica of the world, the
// one to fail, and a name for messages.
func eachFailingDiskful(t *testing.T, check func(w *world, diskful []*v1.ReplicatedVolumeReplica, failing *v1.ReplicatedVolumeReplica, name string)) {
	t.Helper()
	layouts := []struct{ ftt, gmdr int32 }{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 2}}
	for _, l := range layouts {
		for failing := 0; ; failing++ {
			w := newWorld()
			c := w.rv.Spec.ManualConfiguration
			c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy = l.ftt, l.gmdr
			if err := w.createReplicas(t); err != nil {
				t.Fatal(err)
			}
			var diskful []*v1.ReplicatedVolumeReplica
			for _, r := range w.rvrs {
				if r.Spec.Type == v1.ReplicaTypeDiskful {
					diskful = append(diskful, r)
				}
			}
			if failing == len(diskful) {
				break
			}
			f := diskful[failing]
			check(w, diskful, f, "FTT="+strconv.Itoa(int(l.ftt))+",GMDR="+strconv.Itoa(int(l.gmdr))+" "+f.Name)
		}
	}
}

func (w *world) formationActive() bool {
	for _, t := range w.rv.Status.DatameshTransitions {
		if t.Type == v1.TransitionFormation {
			return true
		}
	}
	return false
}
