package controller

import (
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// A deleted RVA's finalizer goes once its node is detached: never while the member
// there is attached or an Attach or Detach of it runs (a live node demotes first), and
// while a ForceDetach runs only when the controller named the member lost in the pass
// (docs/controller.md, "Releasing a lost node's attachment"); a person's ForceLeave of
// a member nobody judged lost keeps the RVA until the force detach is confirmed.
func TestDetachedOn(t *testing.T) {
	rv := func(attached bool, tt v1.TransitionType) *v1.ReplicatedVolume {
		rv := &v1.ReplicatedVolume{}
		rv.Status.Datamesh.Members = []v1.DatameshMember{
			{Name: "vol-a", NodeName: "a", Attached: attached},
			{Name: "vol-b", NodeName: "b"},
		}
		if tt != "" {
			rv.Status.DatameshTransitions = []v1.DatameshTransition{{Type: tt, ReplicaName: "vol-a"}}
		}
		return rv
	}
	lost := []string{"vol-a"}
	for _, c := range []struct {
		what     string
		rv       *v1.ReplicatedVolume
		lost     []string
		detached bool
	}{
		{"attached", rv(true, ""), nil, false},
		{"attached on a lost node, not yet force-detached", rv(true, ""), lost, false},
		{"Attach in flight", rv(false, v1.TransitionAttach), lost, false},
		{"Detach in flight (the node demotes first)", rv(false, v1.TransitionDetach), lost, false},
		{"ForceDetach of a member not named lost", rv(false, v1.TransitionForceDetach), nil, false},
		{"ForceDetach of a member named lost", rv(false, v1.TransitionForceDetach), lost, true},
		{"detached", rv(false, ""), nil, true},
		{"force-removed (no member on the node)", &v1.ReplicatedVolume{}, nil, true},
	} {
		if got := detachedOn(c.rv, "a", c.lost); got != c.detached {
			t.Errorf("%s: detachedOn = %v, want %v", c.what, got, c.detached)
		}
	}
}
