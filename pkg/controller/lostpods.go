package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/fencing"
)

// Freeing a lost node's pods (Options.DeleteLostPods, docs/controller.md,
// "--delete-lost-pods"). Kubernetes deletes the pods of a node that stopped
// reporting only through kube-controller-manager's pod garbage collector (a fixed
// 20 s period, and only with the out-of-service taint), and the StatefulSet or
// Deployment cannot start the replacement's volume elsewhere until the old pod
// object is gone. meshvol knows more than Kubernetes does: DRBD tells it whether the
// node can still write. So once the node is lost and the survivors of every meshvol
// volume a pod uses hold quorum without the node, the pod is force-deleted
// (grace period 0) and so are the node's meshvol VolumeAttachments no remaining pod
// uses.

// EventPodFreed is the reason of the Events on a force-deleted pod and its PVCs.
const EventPodFreed = "LostNodePodDeleted"

// podVolume is one meshvol volume a pod uses.
type podVolume struct {
	pvc *corev1.PersistentVolumeClaim
	pv  string // PersistentVolume name
	rv  string // ReplicatedVolume name (the CSI volume handle)
}

// freeLostPods force-deletes the pods on the lost node that use meshvol volumes whose
// survivors hold quorum without it, then the node's meshvol VolumeAttachments no pod
// left there uses. settled=false: a pod stays because a volume's survivors do not
// (yet) hold quorum without the node; look again soon.
func (c *Controller) freeLostPods(ctx context.Context, node string, lv agentlease.Liveness) (settled bool, err error) {
	var pods corev1.PodList
	if err := c.api.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		return false, fmt.Errorf("listing the pods of lost node %s: %w", node, err)
	}
	leases, err := c.leasesByNode(ctx)
	if err != nil {
		return false, err
	}
	settled = true
	held := map[string]string{} // rv → why it is held without node ("" = not held)
	kept := map[string]bool{}   // PVs a pod left on the node still uses
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		vols, err := c.meshvolVolumes(ctx, pod)
		if err != nil {
			return false, err
		}
		if len(vols) == 0 {
			continue
		}
		var whys []string
		for _, pv := range vols {
			why, seen := held[pv.rv]
			if !seen {
				why, err = c.heldWithout(ctx, pv.rv, node, leases)
				if err != nil {
					return false, err
				}
				held[pv.rv] = why
			}
			if why == "" {
				whys = nil
				break
			}
			whys = append(whys, why)
		}
		if whys == nil {
			settled = false
			for _, pv := range vols {
				kept[pv.pv] = true
			}
			continue
		}
		if err := c.deleteLostPod(ctx, pod, vols, node, lv, strings.Join(whys, "; ")); err != nil {
			return false, err
		}
	}
	if err := c.deleteLostAttachments(ctx, node, leases, held, kept); err != nil {
		return false, err
	}
	return settled, nil
}

func (c *Controller) deleteLostPod(ctx context.Context, pod *corev1.Pod, vols []podVolume, node string, lv agentlease.Liveness, why string) error {
	err := c.client.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return nil // gone already, or a new pod of the same name
	case err != nil:
		return fmt.Errorf("force-deleting pod %s/%s of lost node %s: %w", pod.Namespace, pod.Name, node, err)
	}
	ctrl.LoggerFrom(ctx).Info("force-deleted a lost node's pod", "pod", pod.Namespace+"/"+pod.Name, "node", node, "why", why)
	msg := fmt.Sprintf("node %s is lost (%s) and %s, so DRBD keeps that node from writing (docs/controller.md, --delete-lost-pods)", node, lv.Message, why)
	c.recorder.Eventf(pod, corev1.EventTypeWarning, EventPodFreed, "meshvol force-deleted this pod: %s", msg)
	for _, pv := range vols {
		c.recorder.Eventf(pv.pvc, corev1.EventTypeWarning, EventPodFreed, "meshvol force-deleted pod %s/%s, which uses this claim: %s", pod.Namespace, pod.Name, msg)
	}
	return nil
}

// deleteLostAttachments deletes the node's meshvol VolumeAttachments whose volume is
// held without the node and which no pod left there uses (the attach/detach
// controller would only attach those again).
func (c *Controller) deleteLostAttachments(ctx context.Context, node string, leases map[string]*coordinationv1.Lease, held map[string]string, kept map[string]bool) error {
	var vas storagev1.VolumeAttachmentList
	if err := c.api.List(ctx, &vas); err != nil {
		return fmt.Errorf("listing VolumeAttachments: %w", err)
	}
	for i := range vas.Items {
		va := &vas.Items[i]
		pvName := va.Spec.Source.PersistentVolumeName
		if va.Spec.NodeName != node || va.Spec.Attacher != v1.CSIDriverName || pvName == nil || kept[*pvName] || va.DeletionTimestamp != nil {
			continue
		}
		pv := &corev1.PersistentVolume{}
		if err := c.api.Get(ctx, types.NamespacedName{Name: *pvName}, pv); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return err
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != v1.CSIDriverName {
			continue
		}
		rv := pv.Spec.CSI.VolumeHandle
		why, seen := held[rv]
		if !seen {
			var err error
			if why, err = c.heldWithout(ctx, rv, node, leases); err != nil {
				return err
			}
			held[rv] = why
		}
		if why == "" {
			continue
		}
		if err := c.client.Delete(ctx, va, client.Preconditions{UID: &va.UID}); client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting VolumeAttachment %s of lost node %s: %w", va.Name, node, err)
		}
		ctrl.LoggerFrom(ctx).Info("deleted a lost node's VolumeAttachment", "volumeAttachment", va.Name, "node", node, "why", why)
	}
	return nil
}

// meshvolVolumes are the pod's volumes that are PVCs bound to PVs of meshvol's CSI
// driver (generic ephemeral volumes included: their claim is <pod>-<volume>).
func (c *Controller) meshvolVolumes(ctx context.Context, pod *corev1.Pod) ([]podVolume, error) {
	var out []podVolume
	for _, vol := range pod.Spec.Volumes {
		claim := ""
		switch {
		case vol.PersistentVolumeClaim != nil:
			claim = vol.PersistentVolumeClaim.ClaimName
		case vol.Ephemeral != nil:
			claim = pod.Name + "-" + vol.Name
		default:
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		if err := c.api.Get(ctx, types.NamespacedName{Namespace: pod.Namespace, Name: claim}, pvc); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading claim %s/%s of pod %s: %w", pod.Namespace, claim, pod.Name, err)
		}
		if pvc.Spec.VolumeName == "" {
			continue
		}
		pv := &corev1.PersistentVolume{}
		if err := c.api.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, pv); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading volume %s of claim %s/%s: %w", pvc.Spec.VolumeName, pod.Namespace, claim, err)
		}
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != v1.CSIDriverName {
			continue
		}
		out = append(out, podVolume{pvc: pvc, pv: pv.Name, rv: pv.Spec.CSI.VolumeHandle})
	}
	return out, nil
}

// heldWithout says why volume rv is held without node, so that DRBD keeps node from
// writing it: no replica on a live node reports a Connected connection to a replica on
// node, and either one such replica reports quorum (DRBD's own verdict, recomputed when
// it lost the connection) under a datamesh that runs DRBD with quorum on, or the
// replicas on node cannot be quorate with whatever is not reported cut off from them
// (fencedBySurvivors). "" when neither holds: then the lost node may still be part of a
// quorum that writes, and nothing of it is deleted.
func (c *Controller) heldWithout(ctx context.Context, rv, node string, leases map[string]*coordinationv1.Lease) (string, error) {
	vol := &v1.ReplicatedVolume{}
	if err := c.reader.Get(ctx, types.NamespacedName{Name: rv}, vol); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	if vol.Status.Datamesh.Quorum < 1 {
		return "", nil // quorum off: DRBD's quorum flag proves nothing about the other side
	}
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := c.reader.List(ctx, &rvrs, client.MatchingFields{indexVolume: rv}); err != nil {
		return "", err
	}
	onNode := map[string]bool{}
	for _, r := range rvrs.Items {
		if r.Spec.NodeName == node {
			onNode[r.Name] = true
		}
	}
	now := c.opts.Now()
	fleet := c.disrupt.observe(leases, now)
	quorate := ""
	for _, s := range rvrs.Items {
		if s.Spec.NodeName == "" || s.Spec.NodeName == node || fleet.Judge(leases[s.Spec.NodeName], now, c.opts.AgentGracePeriod).Lost {
			continue
		}
		for _, p := range s.Status.Peers {
			if onNode[p.Name] && p.ConnectionState == "Connected" {
				return "", nil
			}
		}
		if quorate == "" && s.Status.Quorum != nil && *s.Status.Quorum {
			quorate = s.Name + " on node " + s.Spec.NodeName
		}
	}
	if quorate != "" {
		return fmt.Sprintf("volume %s holds quorum without it (replica %s)", rv, quorate), nil
	}
	live := map[string]bool{} // replicas whose agent's Lease is live
	for _, s := range rvrs.Items {
		if s.Spec.NodeName != "" && s.Spec.NodeName != node && fleet.Judge(leases[s.Spec.NodeName], now, c.opts.AgentGracePeriod).Live {
			live[s.Name] = true
		}
	}
	if fenced, why := fencedBySurvivors(vol, rvrs.Items, node, live); fenced {
		return fmt.Sprintf("volume %s: %s", rv, why), nil
	}
	return "", nil
}

// fencedBySurvivors says whether the members on node cannot be quorate, judged from
// the datamesh and the survivors' reports (pkg/fencing): a 2D+1TB volume whose
// Primary's node is lost has no quorate survivor until the lost member is
// force-removed and q lowered (docs/drbd-quorum.md, "The members set"), yet the lost
// D, one of two voters under q=2, cut off from the other D and the TieBreaker, cannot
// be quorate either. live are the replicas whose agent's Lease is live; one of them
// counts as cut off from node when its report names every member on node it connects
// to, none of them Connected.
//
// The answer needs the q the lost node runs. It is given only while nothing in flight
// changes q or the member set (attachments only), and only when every member on node
// last reported running the last revision published before those attachments, or a
// later one: every revision since then carries the datamesh's q, so that is the q the
// lost node runs, whatever it applied after its last report. (A member that never
// confirmed the last q change — the last step of its own join may complete without it
// once it is lost, docs/datamesh.md — may run an older q, and gets no answer.)
// Otherwise the survivors' own quorum decides, as before.
func fencedBySurvivors(vol *v1.ReplicatedVolume, rvrs []v1.ReplicatedVolumeReplica, node string, live map[string]bool) (bool, string) {
	since := vol.Status.DatameshRevision // the last revision before the attachments in flight
	for _, t := range vol.Status.DatameshTransitions {
		switch t.Type {
		case v1.TransitionAttach, v1.TransitionDetach, v1.TransitionForceDetach:
		default:
			return false, ""
		}
		for _, st := range t.Steps {
			if st.DatameshRevision > 0 {
				since = min(since, st.DatameshRevision-1)
			}
		}
	}
	byName := map[string]*v1.ReplicatedVolumeReplica{}
	for i := range rvrs {
		byName[rvrs[i].Name] = &rvrs[i]
	}
	dm := vol.Status.Datamesh.Members
	members := make([]fencing.Member, 0, len(dm))
	for _, m := range dm {
		fm := fencing.Member{Name: m.Name, Type: m.Type, Lost: m.NodeName == node}
		r := byName[m.Name]
		if fm.Lost && (r == nil || r.Status.DatameshRevision < since) {
			return false, ""
		}
		if !fm.Lost && r != nil && r.Spec.NodeName == m.NodeName && live[r.Name] {
			fm.CutOff = cutOffFrom(r, m.Type, dm, node)
		}
		members = append(members, fm)
	}
	return fencing.Check(members, int(vol.Status.Datamesh.Quorum))
}

// cutOffFrom: replica r (a member of type t) reports a connection to every member on
// node it connects to, and none of them Connected.
func cutOffFrom(r *v1.ReplicatedVolumeReplica, t v1.MemberType, members []v1.DatameshMember, node string) bool {
	for _, m := range members {
		if m.NodeName != node || !t.ConnectsToAllPeers() && !m.Type.ConnectsToAllPeers() {
			continue
		}
		i := slices.IndexFunc(r.Status.Peers, func(p v1.PeerStatus) bool { return p.Name == m.Name })
		if i < 0 || r.Status.Peers[i].ConnectionState == "Connected" {
			return false
		}
	}
	return true
}

// leasesByNode are the agent Leases by node name.
func (c *Controller) leasesByNode(ctx context.Context) (map[string]*coordinationv1.Lease, error) {
	var leases coordinationv1.LeaseList
	if err := c.reader.List(ctx, &leases, client.InNamespace(c.opts.Namespace)); err != nil {
		return nil, err
	}
	byNode := map[string]*coordinationv1.Lease{}
	for i := range leases.Items {
		if n := agentlease.NodeName(&leases.Items[i]); n != "" {
			byNode[n] = &leases.Items[i]
		}
	}
	return byNode, nil
}
