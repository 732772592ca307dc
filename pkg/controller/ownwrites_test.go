package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func TestOwnWritesWaitForTheCacheToShowTheWrite(t *testing.T) {
	var w ownWrites
	if w.behind("a", "10") {
		t.Fatal("behind with no write remembered")
	}
	w.wrote("a", "10")
	if !w.behind("a", "10") {
		t.Fatal("the cache still shows the version the write replaced: want behind")
	}
	if w.behind("b", "10") {
		t.Fatal("another object's write made b behind")
	}
	if w.behind("a", "11") {
		t.Fatal("the cache shows a newer version: want not behind")
	}
	// Once a newer version was seen, the memory is gone: an object recreated under an
	// old version string (etcd never reuses one, but a test apiserver may restart) is
	// not held back.
	if w.behind("a", "10") {
		t.Fatal("the memory of the write outlived the cache catching up")
	}
	w.wrote("a", "12")
	w.forget("a")
	if w.behind("a", "12") {
		t.Fatal("forget kept the memory")
	}
}

// A status that moves only progress waits for progressInterval after this controller's
// last write of it, by the time the controller remembers (the cache keeps no
// managedFields, so the object cannot say); a real change, or a status it has not
// written since it started, goes at once.
func TestProgressWaitsForTheLastStatusWrite(t *testing.T) {
	var times statusTimes
	now := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	rv := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	rv.Status.ReadyMembers = "1/3"
	progress := rv.DeepCopy()
	progress.Status.ReadyMembers = "2/3"
	change := rv.DeepCopy()
	change.Status.Phase = v1.VolumePhaseReady

	if got := progressWait(rv, progress, now, times.last("a")); got != 0 {
		t.Fatalf("no write remembered: wait %s, want 0", got)
	}
	times.wrote("a", now.Add(-2*time.Second))
	if got := progressWait(rv, progress, now, times.last("a")); got != progressInterval-2*time.Second {
		t.Fatalf("progress only, written 2 s ago: wait %s, want %s", got, progressInterval-2*time.Second)
	}
	if got := progressWait(rv, change, now, times.last("a")); got != 0 {
		t.Fatalf("a real change: wait %s, want 0", got)
	}
	if got := progressWait(rv, progress, now.Add(progressInterval), times.last("a")); got != 0 {
		t.Fatalf("progress only, written %s ago: wait %s, want 0", progressInterval+2*time.Second, got)
	}
	if got := progressWait(rv, progress, now, times.last("b")); got != 0 {
		t.Fatalf("another volume's write held b back: wait %s", got)
	}
	times.forget("a")
	if !times.last("a").IsZero() {
		t.Fatal("forget kept the time")
	}
}
