package datamesh

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestUnwantedAttachWithdrawnOnAnyRefusal: an Attach whose promotion DRBD refused, for
// want of quorum or for anything else ("(-2) Need access to UpToDate data"), is withdrawn
// once no attachment asks for its member — else the Detach, which waits for the Attach,
// and the volume's deletion would wait for good — and stays while one still asks for
// it, or while its member reports Primary (docs/datamesh.md, "An Attach its member
// cannot promote"). Checked from the transitions, not from an expected-output file.
func TestUnwantedAttachWithdrawnOnAnyRefusal(t *testing.T) {
	for _, reason := range []string{v1.ReasonPromoteNoQuorum, v1.ReasonPromoteFailed} {
		for _, primary := range []bool{false, true} {
			name := reason
			if primary {
				name += " while Primary"
			}
			w := newWorld()
			c := w.rv.Spec.ManualConfiguration
			c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy = 0, 0
			if err := w.createReplicas(t); err != nil {
				t.Fatal(err)
			}
			w.settleAll(t)
			a := &v1.ReplicatedVolumeAttachment{}
			a.Name, a.Spec.ReplicatedVolumeName, a.Spec.NodeName = "rva-n1", "vol", "n1"
			w.rvas = append(w.rvas, a)
			if _, err := w.process(t); err != nil {
				t.Fatal(err)
			}
			attachOf := func() (attach, detach bool) {
				for _, tr := range w.rv.Status.DatameshTransitions {
					attach = attach || tr.Type == v1.TransitionAttach
					detach = detach || tr.Type == v1.TransitionDetach
				}
				return
			}
			if at, _ := attachOf(); !at {
				t.Fatalf("%s: no Attach started", name)
			}
			setCondition(w.rvrs[0], metav1.Condition{Type: v1.ConditionDRBDRole, Status: metav1.ConditionFalse, Reason: reason, Message: "Promotion refused"})
			if primary {
				w.rvrs[0].Status.Role = v1.RolePrimary
			}
			if _, err := w.process(t); err != nil {
				t.Fatal(err)
			}
			if at, _ := attachOf(); !at {
				t.Fatalf("%s: the Attach was withdrawn while an attachment still asks for it", name)
			}
			w.rvas = nil
			if _, err := w.process(t); err != nil {
				t.Fatal(err)
			}
			at, dt := attachOf()
			if primary && (!at || dt) {
				t.Fatalf("%s: the Attach of a member that reports Primary was withdrawn", name)
			}
			if !primary && (at || !dt) {
				t.Fatalf("%s: the refused Attach nobody wants was not withdrawn (Attach %v, Detach %v)", name, at, dt)
			}
		}
	}
}
