package kubectlmeshvol

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Reader reads the objects the views are built from. It only gets and lists.
type Reader struct {
	Client client.Reader
	// Namespace is where a PVC name is looked up (kubectl's -n, or the context's).
	Namespace string
	// MeshvolNamespace holds the agents' Leases.
	MeshvolNamespace string
}

// Volume reads the objects of one volume, named by its RV or by a PVC bound to it.
func (r Reader) Volume(ctx context.Context, name string) (VolumeObjects, error) {
	rv := &v1.ReplicatedVolume{}
	err := r.Client.Get(ctx, client.ObjectKey{Name: name}, rv)
	pvc := ""
	switch {
	case apierrors.IsNotFound(err):
		rvName, err := r.volumeOfPVC(ctx, name)
		if err != nil {
			return VolumeObjects{}, err
		}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: rvName}, rv); err != nil {
			return VolumeObjects{}, fmt.Errorf("PVC %s/%s is bound to volume %s: %w", r.Namespace, name, rvName, err)
		}
		pvc = r.Namespace + "/" + name
	case err != nil:
		return VolumeObjects{}, fmt.Errorf("reading ReplicatedVolume %s: %w", name, err)
	default:
		if pvc, err = r.pvcOfVolume(ctx, name); err != nil {
			return VolumeObjects{}, err
		}
	}
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := r.Client.List(ctx, &rvrs, client.MatchingLabels{v1.LabelVolume: rv.Name}); err != nil {
		return VolumeObjects{}, fmt.Errorf("listing the replicas of %s: %w", rv.Name, err)
	}
	leases, err := r.leases(ctx)
	if err != nil {
		return VolumeObjects{}, err
	}
	byNode := map[string]*coordinationv1.Lease{}
	for i := range leases {
		if node := agentlease.NodeName(&leases[i]); node != "" {
			byNode[node] = &leases[i]
		}
	}
	return VolumeObjects{RV: rv, Replicas: rvrs.Items, Leases: byNode, PVC: pvc}, nil
}

// volumeOfPVC follows a claim to its PersistentVolume and the meshvol volume
// behind it (the CSI volume handle is the RV's name).
func (r Reader) volumeOfPVC(ctx context.Context, name string) (string, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("%s is neither a ReplicatedVolume nor a PersistentVolumeClaim in namespace %s", name, r.Namespace)
		}
		return "", fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", r.Namespace, name, err)
	}
	if pvc.Spec.VolumeName == "" {
		return "", fmt.Errorf("PersistentVolumeClaim %s/%s is not bound yet (phase %s)", r.Namespace, name, pvc.Status.Phase)
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil {
		return "", fmt.Errorf("reading PersistentVolume %s of claim %s/%s: %w", pvc.Spec.VolumeName, r.Namespace, name, err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != v1.CSIDriverName {
		return "", fmt.Errorf("PersistentVolume %s of claim %s/%s is not a %s volume", pv.Name, r.Namespace, name, v1.CSIDriverName)
	}
	return pv.Spec.CSI.VolumeHandle, nil
}

// pvcOfVolume is the claim bound to the volume's PersistentVolume, "" when none is.
func (r Reader) pvcOfVolume(ctx context.Context, rv string) (string, error) {
	var pvs corev1.PersistentVolumeList
	if err := r.Client.List(ctx, &pvs); err != nil {
		return "", fmt.Errorf("listing PersistentVolumes: %w", err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == v1.CSIDriverName && pv.Spec.CSI.VolumeHandle == rv && pv.Spec.ClaimRef != nil {
			return pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name, nil
		}
	}
	return "", nil
}

func (r Reader) leases(ctx context.Context) ([]coordinationv1.Lease, error) {
	var leases coordinationv1.LeaseList
	if err := r.Client.List(ctx, &leases, client.InNamespace(r.MeshvolNamespace)); err != nil {
		return nil, fmt.Errorf("listing the agents' Leases in %s: %w", r.MeshvolNamespace, err)
	}
	return leases.Items, nil
}

// Nodes reads the objects of the nodes view.
func (r Reader) Nodes(ctx context.Context) (NodeObjects, error) {
	var o NodeObjects
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes); err != nil {
		return o, fmt.Errorf("listing Nodes: %w", err)
	}
	o.Nodes = nodes.Items
	leases, err := r.leases(ctx)
	if err != nil {
		return o, err
	}
	o.Leases = leases
	var rvs v1.ReplicatedVolumeList
	if err := r.Client.List(ctx, &rvs); err != nil {
		return o, fmt.Errorf("listing ReplicatedVolumes: %w", err)
	}
	o.Volumes = rvs.Items
	var rvrs v1.ReplicatedVolumeReplicaList
	if err := r.Client.List(ctx, &rvrs); err != nil {
		return o, fmt.Errorf("listing ReplicatedVolumeReplicas: %w", err)
	}
	o.Replicas = rvrs.Items
	return o, nil
}
