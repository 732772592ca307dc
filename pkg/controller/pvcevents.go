package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Event reasons on a volume's PVC: the phase it entered, so that `kubectl describe
// pvc` says why the volume is not ready (the Ready condition's message), that it is
// being moved, or that it is back.
const (
	EventPVCVolumeReady         = "VolumeReady"
	EventPVCVolumeDegraded      = "VolumeDegraded"
	EventPVCVolumeFailed        = "VolumeFailed"
	EventPVCVolumeReconfiguring = "VolumeReconfiguring"
)

// pvcEvent is the PVC event for a volume entering phase: its type and reason; ok is
// false for phases a claim's user has nothing to learn from (Pending and Forming come
// before the claim is bound, Deleting after it is gone).
func pvcEvent(phase v1.VolumePhase) (eventType, reason string, ok bool) {
	switch phase {
	case v1.VolumePhaseReady:
		return corev1.EventTypeNormal, EventPVCVolumeReady, true
	case v1.VolumePhaseDegraded:
		return corev1.EventTypeWarning, EventPVCVolumeDegraded, true
	case v1.VolumePhaseFailed:
		return corev1.EventTypeWarning, EventPVCVolumeFailed, true
	case v1.VolumePhaseReconfiguring:
		return corev1.EventTypeNormal, EventPVCVolumeReconfiguring, true
	}
	return "", "", false
}

// recordPVCEvent tells the volume's PVC about a phase change, once per change (never
// periodically: the Ready message moving within a phase, a resync's percentage, is
// the RV's status, not an event). The PV is the one the external-provisioner created
// for the CreateVolume name (the RV's name, or the name its annotation keeps); a
// statically provisioned PV under another name gets no claim events. One uncached read
// per phase change: phases change rarely, and caching every PV costs more.
func (c *Controller) recordPVCEvent(ctx context.Context, work *v1.ReplicatedVolume) {
	eventType, reason, ok := pvcEvent(work.Status.Phase)
	if !ok {
		return
	}
	pvName := work.Name
	if n := work.Annotations[v1.AnnotationCSIVolumeName]; n != "" {
		pvName = n
	}
	pv := &corev1.PersistentVolume{}
	if err := c.api.Get(ctx, types.NamespacedName{Name: pvName}, pv); err != nil {
		if !apierrors.IsNotFound(err) {
			ctrl.Log.WithName("pvc-events").V(1).Info("reading the PV of a volume", "volume", work.Name, "err", err.Error())
		}
		return
	}
	ref := pv.Spec.ClaimRef
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != v1.CSIDriverName || pv.Spec.CSI.VolumeHandle != work.Name || ref == nil {
		return
	}
	msg := "meshvol volume " + work.Name + " is " + string(work.Status.Phase)
	if cond := meta.FindStatusCondition(work.Status.Conditions, v1.ConditionReady); cond != nil && cond.Message != "" {
		msg += ": " + cond.Message
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID}}
	c.recorder.Event(pvc, eventType, reason, msg)
}
