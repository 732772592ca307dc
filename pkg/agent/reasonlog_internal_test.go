package agent

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func TestReasonLogSaysEachReasonOnceAndForgetsDeletedReplicas(t *testing.T) {
	l := newReasonLog()
	r := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: "vol-node-a", UID: "1"}}
	for i, c := range []struct {
		why  string
		want bool
	}{
		{"Promotion refused", true},
		{"Promotion refused", false}, // the retry, same reason
		{"Configuration not applied", true},
		{"", false}, // confirmed
		{"Configuration not applied", true},
	} {
		if got := l.changed(r, c.why); got != c.want {
			t.Fatalf("step %d (%q): changed = %v, want %v", i, c.why, got, c.want)
		}
	}
	again := &v1.ReplicatedVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: "vol-node-a", UID: "2"}}
	if !l.changed(again, "Configuration not applied") {
		t.Fatal("a replica re-created under the same name did not get its reason logged")
	}
	l.forget("vol-node-a")
	if n := len(l.last); n != 0 {
		t.Fatalf("%d reasons kept after the replica was deleted", n)
	}
}
