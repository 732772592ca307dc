package controller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// An attempt moves on only when every participant has done its part, records the
// snapshot's point when the last one suspended, is Ready with a copy per Diskful
// participant, and aborts past its deadline naming who was late.
func TestSnapshotAttemptPhases(t *testing.T) {
	now := time.Date(2026, 11, 27, 3, 0, 0, 0, time.UTC)
	deadline := metav1.NewTime(now.Add(10 * time.Second))
	parts := []v1.SnapshotParticipant{
		{NodeName: "a", ReplicaName: "v-a", Diskful: true},
		{NodeName: "b", ReplicaName: "v-b", Diskful: true},
		{NodeName: "t", ReplicaName: "v-t"},
	}
	rvs := func(phase v1.SnapshotPhase, nodes ...v1.SnapshotNodeStatus) (*v1.ReplicatedVolumeSnapshot, *v1.ReplicatedVolumeSnapshotStatus) {
		s := &v1.ReplicatedVolumeSnapshot{Status: v1.ReplicatedVolumeSnapshotStatus{
			Phase: phase, Attempt: 2, Participants: parts, SuspendDeadline: &deadline, Nodes: nodes}}
		st := s.Status.DeepCopy()
		st.Nodes = nil
		return s, st
	}
	suspended := func(n string, attempt int32) v1.SnapshotNodeStatus {
		return v1.SnapshotNodeStatus{NodeName: n, Attempt: attempt, Suspended: true}
	}
	withCopy := func(e v1.SnapshotNodeStatus, attempt int32) v1.SnapshotNodeStatus {
		e.Copy = &v1.SnapshotCopy{Attempt: attempt, Pool: "p", Name: "s.a2", SizeBytes: 1}
		return e
	}

	// Suspending: t suspended for an older attempt does not count.
	s, st := rvs(v1.SnapshotSuspending, suspended("a", 2), suspended("b", 2), suspended("t", 1))
	advanceAttempt(s, st, now, 10*time.Second)
	if st.Phase != v1.SnapshotSuspending {
		t.Fatalf("with t suspended for attempt 1 only: phase %s", st.Phase)
	}
	s, st = rvs(v1.SnapshotSuspending, suspended("a", 2), suspended("b", 2), suspended("t", 2))
	advanceAttempt(s, st, now, 10*time.Second)
	if st.Phase != v1.SnapshotSnapshotting || st.CreationTime == nil || !st.CreationTime.Time.Equal(now) {
		t.Fatalf("all suspended: phase %s, creationTime %v", st.Phase, st.CreationTime)
	}

	// Snapshotting: the TieBreaker takes no copy; a copy of another attempt does not count.
	s, st = rvs(v1.SnapshotSnapshotting, withCopy(suspended("a", 2), 2), withCopy(suspended("b", 2), 1), suspended("t", 2))
	advanceAttempt(s, st, now, 10*time.Second)
	if st.Phase != v1.SnapshotSnapshotting || st.ReadyToUse {
		t.Fatalf("b's copy is attempt 1's: phase %s ready %v", st.Phase, st.ReadyToUse)
	}
	s, st = rvs(v1.SnapshotSnapshotting, withCopy(suspended("a", 2), 2), withCopy(suspended("b", 2), 2), suspended("t", 2))
	advanceAttempt(s, st, now, 10*time.Second)
	if st.Phase != v1.SnapshotReady || !st.ReadyToUse || strings.Join(st.Copies, ",") != "a,b" || st.SuspendDeadline != nil {
		t.Fatalf("every copy taken: %+v", st)
	}

	// Past the deadline: Aborting, naming the late node; then the next attempt once
	// everyone resumed and dropped the attempt's copy, or two timeouts later anyway.
	s, st = rvs(v1.SnapshotSnapshotting, withCopy(suspended("a", 2), 2), suspended("b", 2), suspended("t", 2))
	advanceAttempt(s, st, deadline.Time, 10*time.Second)
	if st.Phase != v1.SnapshotAborting || !strings.Contains(st.Message, "b did not take a copy") {
		t.Fatalf("past the deadline: phase %s, message %q", st.Phase, st.Message)
	}
	s, st = rvs(v1.SnapshotAborting, withCopy(v1.SnapshotNodeStatus{NodeName: "a", Attempt: 2}, 2))
	finishAbort(s, st, deadline.Time, 10*time.Second)
	if st.Phase != v1.SnapshotAborting {
		t.Fatalf("a still holds attempt 2's copy: phase %s", st.Phase)
	}
	finishAbort(s, st, deadline.Add(20*time.Second), 10*time.Second)
	if st.Phase != v1.SnapshotPending {
		t.Fatalf("two timeouts past the deadline: phase %s", st.Phase)
	}
	s, st = rvs(v1.SnapshotAborting, v1.SnapshotNodeStatus{NodeName: "a", Attempt: 2})
	finishAbort(s, st, deadline.Time, 10*time.Second)
	if st.Phase != v1.SnapshotPending || st.SuspendDeadline != nil {
		t.Fatalf("everyone resumed and clean: %+v", st)
	}
}
