package agentlease

import (
	"strings"
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

// Every agent silent at once (docs/controller.md, "Every agent silent at once"): the
// fleet's verdicts against each Lease's own.
func TestFleetJudge(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	grace := 3 * time.Second
	lease := func(name string, renewedAgo time.Duration) *coordinationv1.Lease {
		d := int32(6)
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshvol-node-" + name},
			Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: &d, RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}}}
	}
	// a and b went silent 20 s and 21 s ago; c was lost a minute before that.
	a, b, c := lease("a", 20*time.Second), lease("b", 21*time.Second), lease("c", 80*time.Second)
	silent, start := Silent(map[string]*coordinationv1.Lease{"a": a, "b": b, "c": c}, now)
	if want := now.Add(-14 * time.Second); !silent || !start.Equal(want) {
		t.Fatalf("Silent = %v, %s; want true, %s (a's expiry, the last)", silent, start, want)
	}
	if s, _ := Silent(map[string]*coordinationv1.Lease{"a": a, "live": lease("live", time.Second)}, now); s {
		t.Errorf("Silent with a live Lease")
	}
	if s, _ := Silent(map[string]*coordinationv1.Lease{"missing": nil, "never": {Spec: coordinationv1.LeaseSpec{}}}, now); s {
		t.Errorf("Silent with no Lease ever renewed: nothing to judge")
	}

	during := Fleet{Disrupted: true, Start: start}
	ended := Fleet{Start: start, End: now.Add(-2 * time.Second)}
	for _, tc := range []struct {
		name       string
		f          Fleet
		l          *coordinationv1.Lease
		lost       bool
		next       time.Time
		msgContain string
	}{
		{"a alone", Fleet{}, a, true, time.Time{}, "more than 3s ago"},
		{"a during", during, a, false, time.Time{}, "no node is declared lost until an agent renews"},
		{"b during", during, b, false, time.Time{}, "full disruption"},
		{"c, lost before it began", during, c, true, time.Time{}, "more than 3s ago"},
		// Ended 2 s ago: a's fresh Lease duration and grace end 7 s from now.
		{"a after", ended, a, false, now.Add(7 * time.Second), "lost at"},
		{"c after", ended, c, true, time.Time{}, ""},
		{"a long after", Fleet{Start: start, End: now.Add(-9 * time.Second)}, a, true, time.Time{}, ""},
		{"missing during", during, nil, true, time.Time{}, "no agent Lease"},
	} {
		lv := tc.f.Judge(tc.l, now, grace)
		if lv.Lost != tc.lost || lv.Live || !lv.Next.Equal(tc.next) || !strings.Contains(lv.Message, tc.msgContain) {
			t.Errorf("%s: got lost=%v live=%v next=%s %q; want lost=%v next=%s, message with %q",
				tc.name, lv.Lost, lv.Live, lv.Next, lv.Message, tc.lost, tc.next, tc.msgContain)
		}
	}
	// A node that renews after the disruption and then goes silent is judged by its
	// own Lease: its renewal is later than the disruption's end.
	late := lease("late", 10*time.Second)
	if lv := (Fleet{Start: now.Add(-time.Minute), End: now.Add(-40 * time.Second)}).Judge(late, now, grace); !lv.Lost {
		t.Errorf("a Lease renewed after the disruption, expired past the grace period: not lost (%s)", lv.Message)
	}
}

// An announcement counts only while the agent version that wrote it renews the Lease:
// an earlier agent that replaced a newer one keeps the annotation (agents keep the
// annotations they do not know) but rewrites the version, which voids it.
func TestCapabilities(t *testing.T) {
	lease := func(ann map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "meshvol-node-a", Annotations: ann}}
	}
	announced := func(writer, renewer string) map[string]string {
		return map[string]string{v1.AnnotationCapabilities: "derived-shared-secret, later-thing",
			v1.AnnotationCapabilitiesAgentVersion: writer, v1.AnnotationAgentVersion: renewer}
	}
	for _, tc := range []struct {
		name string
		l    *coordinationv1.Lease
		want []string
	}{
		{"written by the agent that renews", lease(announced("v0.3.0", "v0.3.0")), []string{"derived-shared-secret", "later-thing"}},
		{"renewed by an earlier agent since", lease(announced("v0.3.0", "v0.2.0")), nil},
		{"no version beside the announcement", lease(map[string]string{v1.AnnotationCapabilities: "derived-shared-secret", v1.AnnotationAgentVersion: "v0.3.0"}), nil},
		{"an agent that announces nothing", lease(map[string]string{v1.AnnotationAgentVersion: "v0.2.0"}), nil},
		{"no annotations", lease(nil), nil},
		{"no Lease", nil, nil},
	} {
		got := Capabilities(tc.l)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		if want := len(tc.want) > 0; Announces(tc.l, v1.CapabilityDerivedSharedSecret) != want {
			t.Errorf("%s: Announces(%s) = %v, want %v", tc.name, v1.CapabilityDerivedSharedSecret, !want, want)
		}
	}
}
