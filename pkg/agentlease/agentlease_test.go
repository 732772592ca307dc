package agentlease

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

func TestJudge(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	lease := func(renewedAgo time.Duration) *coordinationv1.Lease {
		d := int32(10)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshvol-node-a"},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}}}
	}
	for _, tc := range []struct {
		l          *coordinationv1.Lease
		live, lost bool
		reason     string
	}{
		{lease(3 * time.Second), true, false, v1.ReasonAgentLeaseValid},
		{lease(15 * time.Second), false, false, v1.ReasonAgentLeaseValid},
		{lease(21 * time.Second), false, true, v1.ReasonAgentLeaseExpired},
		{&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshvol-node-a"}}, false, true, v1.ReasonAgentLeaseExpired},
		{nil, false, true, v1.ReasonAgentLeaseMissing},
	} {
		lv := Judge(tc.l, now, 10*time.Second)
		if lv.Live != tc.live || lv.Lost != tc.lost || lv.Reason != tc.reason {
			t.Errorf("%+v: got live=%v lost=%v reason=%s", tc, lv.Live, lv.Lost, lv.Reason)
		}
	}
}

func TestNodeName(t *testing.T) {
	for name, want := range map[string]string{"meshvol-node-a": "a", "meshvol-controller": "", "meshvol-node-": ""} {
		if got := NodeName(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}); got != want {
			t.Errorf("NodeName(%q) = %q, want %q", name, got, want)
		}
	}
}
