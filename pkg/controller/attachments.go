package controller

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh"
)

const reasonAccessNodeUnavailable = "AccessNodeUnavailable"

// writeAttachments writes each RVA's status from the engine's verdict (out.attachments:
// phase, the Attached condition, and the attached replica's device path), and releases
// the finalizer of a deleted RVA once its node is detached (detachedOn). work's status
// is the one just published.
func (c *Controller) writeAttachments(ctx context.Context, v *volume, work *v1.ReplicatedVolume, out engineOutput) error {
	accessRefused := out.accessRefused
	verdicts := map[string]datamesh.AttachmentStatus{}
	for _, a := range out.attachments {
		verdicts[a.Name] = a
	}
	for _, rva := range v.rvas {
		a, ok := verdicts[rva.Name]
		if !ok {
			// The engine did not run (allocation or configuration holds the volume).
			a = datamesh.AttachmentStatus{Name: rva.Name, NodeName: rva.Spec.NodeName, Phase: v1.AttachmentPending,
				Message: "Waiting for the volume: " + string(work.Status.Phase)}
			if c := meta.FindStatusCondition(work.Status.Conditions, v1.ConditionReady); c != nil {
				a.Message = "Waiting for the volume: " + c.Message
			}
		}
		want := rva.Status.DeepCopy()
		want.ObservedGeneration = rva.Generation
		want.Phase = a.Phase
		want.DevicePath = ""
		reason := string(a.Phase)
		msg := a.Message
		if refusal, ok := accessRefused[rva.Spec.NodeName]; ok && a.Phase == v1.AttachmentPending {
			reason, msg = reasonAccessNodeUnavailable, refusal
		}
		if a.Phase == v1.AttachmentAttached {
			for _, r := range v.rvrs {
				if r.Spec.NodeName == rva.Spec.NodeName {
					want.DevicePath = r.Status.DevicePath
				}
			}
		}
		meta.SetStatusCondition(&want.Conditions, metav1.Condition{Type: v1.ConditionAttached, Status: boolStatus(a.Phase == v1.AttachmentAttached),
			Reason: reason, Message: msg, ObservedGeneration: rva.Generation, LastTransitionTime: metav1.NewTime(v.now)})
		if !equality.Semantic.DeepEqual(&rva.Status, want) {
			if err := applyStatus(ctx, c.client, "ReplicatedVolumeAttachment", rva.Name, "", want); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("writing status of attachment %s: %w", rva.Name, err)
			}
		}
		if rva.DeletionTimestamp != nil && slices.Contains(rva.Finalizers, v1.FinalizerController) && detachedOn(work, rva.Spec.NodeName, out.lost) {
			if err := ignoreStale(releaseFinalizer(ctx, c.client, "ReplicatedVolumeAttachment", rva)); err != nil {
				return fmt.Errorf("removing finalizer of attachment %s: %w", rva.Name, err)
			}
		}
	}
	return nil
}

// detachedOn: no member on node is attached and no Attach, Detach or ForceDetach of one
// is in flight: the node cannot be Primary any more, or it is lost and the datamesh has
// stopped counting it as attached.
//
// A ForceDetach of a member in lost — one this pass named ForceLeave: its node lost and
// no live replica reaching it — counts as detached once it is published, before the
// survivors confirm it: the lost node confirms nothing anyway, and what keeps it from
// writing is DRBD's quorum, not the attachment's release. Releasing the RVA then lets
// ControllerUnpublishVolume return and Kubernetes attach elsewhere, while the engine's
// Attach of the new node still waits for the force detach, the force removal and its
// q↓ (docs/controller.md, "Releasing a lost node's attachment").
func detachedOn(rv *v1.ReplicatedVolume, node string, lost []string) bool {
	for _, m := range rv.Status.Datamesh.Members {
		if m.NodeName != node {
			continue
		}
		if m.Attached {
			return false
		}
		for _, t := range rv.Status.DatameshTransitions {
			if t.ReplicaName != m.Name {
				continue
			}
			switch t.Type {
			case v1.TransitionAttach, v1.TransitionDetach:
				return false
			case v1.TransitionForceDetach:
				if !slices.Contains(lost, m.Name) {
					return false
				}
			}
		}
	}
	return true
}
