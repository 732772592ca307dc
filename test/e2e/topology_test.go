package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/sandbox"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// deletePVCAndVolume deletes a claim and waits until its volume is gone.
func deletePVCAndVolume(t *testing.T, pvcName string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: pvcName}}
	if err := sb.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
		return
	}
	if err := sb.Client.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
		return
	}
	if pvc.Spec.VolumeName != "" {
		waitGone(t, ctx, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvc.Spec.VolumeName}}, 2*time.Minute)
	}
}

// claimProvisioning describes, for a failure message, why a claim is not
// bound yet: every reason of the events on it (the provisioner's own, not
// only kube-controller-manager's repeated ExternalProvisioning) with its
// latest message and, once CreateVolume made the ReplicatedVolume (named
// pvc-<the claim's uid>), its phase and conditions.
func claimProvisioning(ctx context.Context, pvc *corev1.PersistentVolumeClaim) string {
	var out []string
	var evs corev1.EventList
	if err := sb.Client.List(ctx, &evs, client.InNamespace(pvc.Namespace)); err == nil {
		slices.SortFunc(evs.Items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
		latest := map[string]*corev1.Event{}
		var reasons []string
		for i := range evs.Items {
			e := &evs.Items[i]
			if e.InvolvedObject.Kind != "PersistentVolumeClaim" || e.InvolvedObject.Name != pvc.Name {
				continue
			}
			if latest[e.Reason] == nil {
				reasons = append(reasons, e.Reason)
			}
			latest[e.Reason] = e
		}
		for _, r := range reasons {
			out = append(out, fmt.Sprintf("event %s (x%d): %s", r, latest[r].Count, latest[r].Message))
		}
	}
	var rv v1.ReplicatedVolume
	if pvc.UID != "" && sb.Client.Get(ctx, client.ObjectKey{Name: "pvc-" + string(pvc.UID)}, &rv) == nil {
		conds := []string{}
		for _, c := range rv.Status.Conditions {
			conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
		}
		out = append(out, fmt.Sprintf("volume %s %s, conditions %v", rv.Name, rv.Status.Phase, conds))
	}
	return strings.Join(out, "; ")
}

// TestAllowedTopologies: a StorageClass whose allowedTopologies name one
// node, with Immediate binding, gives a PersistentVolume usable on that
// node only (CreateVolume's accessible topology inside the requisite
// segments, docs/contract.md), and its pod runs there.
func TestAllowedTopologies(t *testing.T) {
	ctx := ctxT(t, 4*time.Minute)
	scName, pvcName, podName := name(t, "-sc"), name(t, "-pvc"), name(t, "-pod")
	only := sb.Kube.Nodes[len(sb.Kube.Nodes)-1].Name
	immediate := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: scName},
		Provisioner:       v1.CSIDriverName,
		Parameters:        map[string]string{v1.CSIParameterStorageClass: class},
		VolumeBindingMode: &immediate,
		AllowedTopologies: []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
			{Key: v1.TopologyKeyNode, Values: []string{only}}}}},
	}
	if err := sb.Client.Create(ctx, sc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Client.Delete(context.Background(), sc) })
	if err := sb.Client.Create(ctx, sandbox.PVC(pvcName, scName, "16Mi", corev1.PersistentVolumeFilesystem)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePVCAndVolume(t, pvcName) })
	var pvc corev1.PersistentVolumeClaim
	waitUntil(t, ctx, 2*time.Minute, "claim "+pvcName+" to be bound", func() (bool, string) {
		err := sb.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: pvcName}, &pvc)
		return err == nil && pvc.Status.Phase == corev1.ClaimBound, string(pvc.Status.Phase) + "; " + claimProvisioning(ctx, &pvc)
	})
	var pv corev1.PersistentVolume
	if err := sb.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		t.Fatalf("PV %s has no node affinity; allowedTopologies name %s", pv.Name, only)
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == v1.TopologyKeyNode {
				nodes = append(nodes, e.Values...)
			}
		}
	}
	if !slices.Equal(nodes, []string{only}) {
		t.Fatalf("PV %s is usable on %v; allowedTopologies name %s alone", pv.Name, nodes, only)
	}
	pod(t, ctx, podName, pvcName, "", sleepScript, false)
	p := waitRunning(t, ctx, podName)
	t.Cleanup(func() { deletePod(t, context.Background(), podName) })
	if p.Spec.NodeName != only {
		t.Fatalf("pod %s runs on %s; its volume is usable on %s alone", podName, p.Spec.NodeName, only)
	}
	t.Logf("allowedTopologies %s: PV node affinity %v, pod on %s", only, nodes, p.Spec.NodeName)
}
