package csi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	"github.com/meshvol/meshvol/pkg/placement"
)

// annotationReadonly on an RVA records ControllerPublish's readonly flag, so a retry
// with a different flag is told AlreadyExists instead of silently succeeding.
const annotationReadonly = "storage.meshvol.io/csi-readonly"

// Controller is the CSI controller service.
type Controller struct {
	csipb.UnimplementedControllerServer
	// Client reads from informer caches (RV, RVA, RVR, RSC, RSP, and Leases in
	// Namespace) and writes to the apiserver; NewControllerClient builds one.
	Client client.Client
	// Namespace is the controller's namespace, where agents renew their Leases.
	Namespace string

	guard inflight
}

func (c *Controller) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	var caps []*csipb.ControllerServiceCapability
	for _, t := range []csipb.ControllerServiceCapability_RPC_Type{
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csipb.ControllerServiceCapability_RPC_GET_CAPACITY,
		csipb.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csipb.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csipb.ControllerServiceCapability_RPC_VOLUME_CONDITION,
		csipb.ControllerServiceCapability_RPC_GET_VOLUME,
		csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		// The access modes SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER, which
		// checkCapability accepts; the node service enforces the single writer.
		csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		// docs/snapshots.md
		csipb.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csipb.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csipb.ControllerServiceCapability_RPC_CLONE_VOLUME,
	} {
		caps = append(caps, &csipb.ControllerServiceCapability{Type: &csipb.ControllerServiceCapability_Rpc{
			Rpc: &csipb.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// internal wraps an API error that is none of the caller's doing.
func internal(what string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.Errorf(codes.DeadlineExceeded, "%s: %v", what, err)
	}
	return status.Errorf(codes.Unavailable, "%s: %v", what, err)
}

func (c *Controller) getRV(ctx context.Context, name string) (*v1.ReplicatedVolume, error) {
	rv := &v1.ReplicatedVolume{}
	if len(validation.IsDNS1123Label(name)) > 0 {
		// Not an RV name, so no such volume; do not ask the cache about it.
		return nil, nil
	}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, rv); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, internal("reading ReplicatedVolume "+name, err)
	}
	return rv, nil
}

// existingRV is getRV for the RPCs on a volume that must exist: no volume is NotFound.
func (c *Controller) existingRV(ctx context.Context, id string) (*v1.ReplicatedVolume, error) {
	rv, err := c.getRV(ctx, id)
	if err == nil && rv == nil {
		err = status.Errorf(codes.NotFound, "volume_id: volume %q does not exist", id)
	}
	return rv, err
}

func (c *Controller) attachmentsOf(ctx context.Context, rv string) ([]v1.ReplicatedVolumeAttachment, error) {
	var l v1.ReplicatedVolumeAttachmentList
	if err := c.Client.List(ctx, &l, client.MatchingLabels{v1.LabelVolume: rv}); err != nil {
		return nil, internal("listing ReplicatedVolumeAttachments of "+rv, err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	return l.Items, nil
}

// formed reports whether the volume's first datamesh is in place, from the Formed
// condition the controller publishes (docs/contract.md "CSI"), and if not, what it
// waits for in the controller's words.
func formed(rv *v1.ReplicatedVolume) (bool, string) {
	c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionFormed)
	switch {
	case c == nil:
		return false, "the controller has not reported on it yet"
	case c.Status != metav1.ConditionTrue:
		return false, c.Reason + ": " + c.Message
	}
	return true, ""
}

// classLayout is the layout a class gives its volumes, decided by the rule the engine
// applies (layout.FromClass, then Validate), so that a class the engine would refuse to
// configure a volume from is refused here, with the engine's words, before a volume
// exists to be stuck. InvalidArgument: the request's parameters name the class.
func classLayout(rsc *v1.ReplicatedStorageClass) (layout.Layout, error) {
	sp := &rsc.Spec
	l, err := layout.FromClass(rsc.Name, (*string)(sp.Replication), sp.FailuresToTolerate, sp.GuaranteedMinimumDataRedundancy)
	if err == nil {
		if verr := l.Validate(); verr != nil {
			err = fmt.Errorf("storage class %s: %w", rsc.Name, verr)
		}
	}
	if err != nil {
		return l, invalid("parameters[%q]: %v", v1.CSIParameterStorageClass, err)
	}
	return l, nil
}

func volumeAccessOf(rv *v1.ReplicatedVolume, rsc *v1.ReplicatedStorageClass) v1.VolumeAccess {
	if cfg := rv.Status.Configuration; cfg != nil && cfg.VolumeAccess != "" {
		return cfg.VolumeAccess
	}
	if rsc != nil && rsc.Spec.VolumeAccess != "" {
		return rsc.Spec.VolumeAccess
	}
	return v1.VolumeAccessPreferablyLocal
}

func (c *Controller) getRSC(ctx context.Context, name string) (*v1.ReplicatedStorageClass, error) {
	rsc := &v1.ReplicatedStorageClass{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, rsc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, invalid("parameters[%q]: ReplicatedStorageClass %q does not exist", v1.CSIParameterStorageClass, name)
		}
		return nil, internal("reading ReplicatedStorageClass "+name, err)
	}
	return rsc, nil
}

func (c *Controller) CreateVolume(ctx context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	r, err := validateCreate(req)
	if err != nil {
		return nil, err
	}
	release, err := c.guard.acquire(r.rvName, "CreateVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	rsc, err := c.getRSC(ctx, r.rsc)
	if err != nil {
		return nil, err
	}
	l, err := classLayout(rsc)
	if err != nil {
		return nil, err
	}
	rv, err := c.getRV(ctx, r.rvName)
	if err != nil {
		return nil, err
	}
	created := false
	if rv != nil {
		if err := compatible(rv, r, req.GetCapacityRange()); err != nil {
			return nil, err
		}
		if err := sourceCompatible(rv, r); err != nil {
			return nil, err
		}
	} else {
		if err := c.resolveSource(ctx, &r, rsc, req.GetCapacityRange()); err != nil {
			return nil, err
		}
		if err := c.checkCapacity(ctx, rsc, l, r); err != nil {
			return nil, err
		}
		if err := c.createRV(ctx, r); err != nil {
			return nil, err
		}
		created = true
	}
	if rv, err = c.waitFormed(ctx, r.rvName, created); err != nil {
		return nil, err
	}
	if err := c.dropCloneSnapshot(ctx, r); err != nil {
		return nil, err
	}
	top, err := c.accessibleTopology(ctx, rv, rsc, r.hints, req.GetParameters())
	if err != nil {
		return nil, err
	}
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{
		VolumeId:           rv.Name,
		CapacityBytes:      reportedSize(rv, req.GetCapacityRange()),
		AccessibleTopology: top,
		ContentSource:      req.GetVolumeContentSource(),
	}}, nil
}

// waitFormed waits (bounded by ctx) until the controller reports the volume Formed and
// returns it as it is then. created: this call created the RV, so not finding it means
// the informer lags, not that someone deleted it.
func (c *Controller) waitFormed(ctx context.Context, name string, created bool) (*v1.ReplicatedVolume, error) {
	var rv *v1.ReplicatedVolume
	var why string
	err := waitRPC(ctx, func() (bool, error) {
		cur, err := c.getRV(ctx, name)
		if err != nil {
			return false, err
		}
		if cur == nil && created {
			why = "the new volume is not in the informer cache yet"
			return false, nil
		}
		if cur == nil || cur.DeletionTimestamp != nil {
			return false, status.Errorf(codes.Aborted, "volume %q was deleted while it was being created; retry", name)
		}
		rv = cur
		if err := allocationExhausted(cur); err != nil {
			return false, err
		}
		var ok bool
		ok, why = formed(cur)
		return ok, nil
	}, func() string {
		return fmt.Sprintf("volume %q is still forming (%s); a retry waits for it", name, why)
	})
	return rv, err
}

// allocationExhausted is RESOURCE_EXHAUSTED when the controller cannot allocate the
// volume's DRBD port or minor because every value of its range is held by another
// volume: waiting would not help until volumes are deleted or the range widened, so the
// answer says so at once, with the controller's message naming the field, the rule and
// the cap. The volume stays: a retry finds it and is answered again, until a value frees
// up and it forms.
func allocationExhausted(rv *v1.ReplicatedVolume) error {
	c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionAllocated)
	if c == nil || c.Status != metav1.ConditionFalse || (c.Reason != v1.ReasonPortsExhausted && c.Reason != v1.ReasonMinorsExhausted) {
		return nil
	}
	return status.Errorf(codes.ResourceExhausted, "volume %q cannot be allocated: %s", rv.Name, c.Message)
}

// reportedSize is the volume's CapacityBytes unless that exceeds the request's limit (a device
// rounded up past it), when the spec's size, which the request allowed, is reported.
func reportedSize(rv *v1.ReplicatedVolume, cr *csipb.CapacityRange) int64 {
	s := rv.CapacityBytes()
	if lim := cr.GetLimitBytes(); lim > 0 && s > lim {
		return rv.Spec.Size.Value()
	}
	return s
}

// compatible decides whether an existing RV answers a repeated CreateVolume.
func compatible(rv *v1.ReplicatedVolume, r createRequest, cr *csipb.CapacityRange) error {
	if r.hashed && rv.Annotations[v1.AnnotationCSIVolumeName] != r.csiName {
		return status.Errorf(codes.AlreadyExists, "name: volume id %q already belongs to another CreateVolume name", rv.Name)
	}
	if rv.DeletionTimestamp != nil {
		return status.Errorf(codes.Aborted, "name: volume %q is being deleted; retry once it is gone", rv.Name)
	}
	if rv.Spec.ReplicatedStorageClassName != r.rsc {
		return status.Errorf(codes.AlreadyExists, "parameters[%q]: volume %q exists with ReplicatedStorageClass %q, not %q",
			v1.CSIParameterStorageClass, rv.Name, rv.Spec.ReplicatedStorageClassName, r.rsc)
	}
	if !sizeFits(rv.Spec.Size.Value(), cr) {
		return status.Errorf(codes.AlreadyExists, "capacity_range: volume %q exists with size %d, outside [%d, %d]",
			rv.Name, rv.Spec.Size.Value(), cr.GetRequiredBytes(), cr.GetLimitBytes())
	}
	if r.caps.multiNode && rv.Spec.MaxAttachments < 2 {
		return status.Errorf(codes.AlreadyExists, "volume_capabilities: volume %q exists without multi-node access", rv.Name)
	}
	return nil
}

func (c *Controller) createRV(ctx context.Context, r createRequest) error {
	rv := &v1.ReplicatedVolume{
		ObjectMeta: metav1.ObjectMeta{
			// No finalizer here: the controller adds its own and releases it
			// (docs/contract.md, "Objects, names, writers").
			Name: r.rvName,
		},
		Spec: v1.ReplicatedVolumeSpec{
			Size:                       *resource.NewQuantity(r.size, resource.BinarySI),
			ConfigurationMode:          v1.ConfigurationModeAuto,
			ReplicatedStorageClassName: r.rsc,
			MaxAttachments:             1,
			PlacementHints:             r.hints,
			DataSource:                 r.dataSource,
		},
	}
	if r.caps.multiNode {
		rv.Spec.MaxAttachments = 2
	}
	if r.hashed {
		rv.Annotations = map[string]string{v1.AnnotationCSIVolumeName: r.csiName}
	}
	if err := c.Client.Create(ctx, rv, client.FieldOwner(v1.FieldManagerCSI)); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Created meanwhile by someone else (the cache lagged): let the retry decide.
			return status.Errorf(codes.Aborted, "name: volume %q appeared while it was being created; retry", r.rvName)
		}
		if apierrors.IsInvalid(err) {
			return invalid("creating ReplicatedVolume %q: %v", r.rvName, err)
		}
		return internal("creating ReplicatedVolume "+r.rvName, err)
	}
	return nil
}

// agentNodes lists nodes that run an agent, from their Leases.
func (c *Controller) agentNodes(ctx context.Context) ([]string, error) {
	var l coordinationv1.LeaseList
	if err := c.Client.List(ctx, &l, client.InNamespace(c.Namespace)); err != nil {
		return nil, internal("listing agent Leases", err)
	}
	var out []string
	for _, le := range l.Items {
		if n, ok := strings.CutPrefix(le.Name, v1.AgentLeasePrefix); ok && n != "" {
			out = append(out, n)
		}
	}
	return out, nil
}

// accessibleTopology is where the volume can be used (docs/contract.md, "Accessible
// topology"): for volumeAccess Local the nodes with a diskful member; else every node
// with an agent (an Access replica can be made there) plus the members. Kubernetes
// writes this list into the PersistentVolume's node affinity, and a volume provisioned
// under a StorageClass's allowedTopologies must be usable only inside them, so only
// the nodes inside them stay: the allowedTopologies of the claim's StorageClass when
// the request names its claim (external-provisioner's --extra-create-metadata, which
// the chart sets), else the request's requisite segments. Not the requisite segments
// when the claim is named: with --strict-topology they are the one node the scheduler
// picked for the first consumer, which the volume is not confined to. None left is an
// error: an empty list would make the volume usable everywhere.
func (c *Controller) accessibleTopology(ctx context.Context, rv *v1.ReplicatedVolume, rsc *v1.ReplicatedStorageClass, hints *v1.PlacementHints, params map[string]string) ([]*csipb.Topology, error) {
	set := map[string]bool{}
	for _, m := range rv.Status.Datamesh.Members {
		if m.Type == v1.MemberTypeDiskful || volumeAccessOf(rv, rsc) != v1.VolumeAccessLocal {
			set[m.NodeName] = true
		}
	}
	if volumeAccessOf(rv, rsc) != v1.VolumeAccessLocal {
		nodes, err := c.agentNodes(ctx)
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			set[n] = true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	inside, field, within, err := c.insideAllowed(ctx, rv, rsc, hints, params, names)
	if err != nil {
		return nil, err
	}
	if len(inside) == 0 {
		return nil, status.Errorf(codes.ResourceExhausted, "%s: volume %q would be usable on %s, none of them inside %s",
			field, rv.Name, strings.Join(names, ", "), within)
	}
	out := make([]*csipb.Topology, 0, len(inside))
	for _, n := range inside {
		out = append(out, &csipb.Topology{Segments: map[string]string{v1.TopologyKeyNode: n}})
	}
	return out, nil
}

// Parameters external-provisioner adds with --extra-create-metadata.
const (
	paramPVCName      = "csi.storage.k8s.io/pvc/name"
	paramPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
)

// insideAllowed keeps the nodes inside the claim's StorageClass's allowedTopologies
// (matched against the Nodes' labels, which the kubelet sets from NodeGetInfo's
// topology) or, without a named claim, inside the requisite segments; field is the
// request's field that decided, within describes what they were kept inside of.
func (c *Controller) insideAllowed(ctx context.Context, rv *v1.ReplicatedVolume, rsc *v1.ReplicatedStorageClass, hints *v1.PlacementHints, params map[string]string, names []string) (inside []string, field, within string, err error) {
	if pvcName, ns := params[paramPVCName], params[paramPVCNamespace]; pvcName != "" && ns != "" {
		terms, err := c.allowedTopologies(ctx, ns, pvcName)
		if err != nil || len(terms) == 0 {
			return names, "", "", err
		}
		for _, n := range names {
			var node corev1.Node
			if err := c.Client.Get(ctx, client.ObjectKey{Name: n}, &node); err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return nil, "", "", internal("reading Node "+n, err)
			}
			if slices.ContainsFunc(terms, func(t corev1.TopologySelectorTerm) bool { return termMatches(t, node.Labels) }) {
				inside = append(inside, n)
			}
		}
		return inside, fmt.Sprintf("parameters[%q]", paramPVCName), "the allowedTopologies of the StorageClass of PersistentVolumeClaim " + ns + "/" + pvcName, nil
	}
	if hints == nil || len(hints.Requisite) == 0 {
		return names, "", "", nil
	}
	zones, err := c.nodeZones(ctx, rv, rsc, hints.Requisite, names)
	if err != nil {
		return nil, "", "", err
	}
	for _, n := range names {
		if slices.ContainsFunc(hints.Requisite, func(s v1.TopologySegment) bool { return placement.SegmentMatches(s, n, zones[n]) }) {
			inside = append(inside, n)
		}
	}
	return inside, "accessibility_requirements.requisite", "the requisite segments " + describeSegments(hints.Requisite), nil
}

// allowedTopologies are the allowedTopologies of the StorageClass of a claim; none
// when the claim or its class is gone.
func (c *Controller) allowedTopologies(ctx context.Context, ns, pvcName string) ([]corev1.TopologySelectorTerm, error) {
	var pvc corev1.PersistentVolumeClaim
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pvcName}, &pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, internal("reading PersistentVolumeClaim "+ns+"/"+pvcName, err)
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		return nil, nil
	}
	var sc storagev1.StorageClass
	if err := c.Client.Get(ctx, client.ObjectKey{Name: *pvc.Spec.StorageClassName}, &sc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, internal("reading StorageClass "+*pvc.Spec.StorageClassName, err)
	}
	return sc.AllowedTopologies, nil
}

// termMatches: every requirement of the term holds for the labels.
func termMatches(t corev1.TopologySelectorTerm, labels map[string]string) bool {
	for _, r := range t.MatchLabelExpressions {
		if v, ok := labels[r.Key]; !ok || !slices.Contains(r.Values, v) {
			return false
		}
	}
	return true
}

// nodeZones returns the zones of nodes as the volume's members, the class's pool and,
// for the nodes neither knows, the Node's topology.kubernetes.io/zone label say. Only
// a requisite segment that names a zone needs them; without one it reads nothing.
func (c *Controller) nodeZones(ctx context.Context, rv *v1.ReplicatedVolume, rsc *v1.ReplicatedStorageClass, requisite []v1.TopologySegment, nodes []string) (map[string]string, error) {
	zones := map[string]string{}
	if !slices.ContainsFunc(requisite, func(s v1.TopologySegment) bool { return s.Zone != "" }) {
		return zones, nil
	}
	known := map[string]bool{}
	for _, m := range rv.Status.Datamesh.Members {
		zones[m.NodeName], known[m.NodeName] = m.Zone, true
	}
	eligible, err := c.eligibleNodes(ctx, rsc.Spec.StoragePool)
	if err != nil {
		return nil, err
	}
	for _, e := range eligible {
		zones[e.NodeName], known[e.NodeName] = e.Zone, true
	}
	for _, n := range nodes {
		if known[n] {
			continue
		}
		var node corev1.Node
		if err := c.Client.Get(ctx, client.ObjectKey{Name: n}, &node); err != nil && !apierrors.IsNotFound(err) {
			return nil, internal("reading Node "+n, err)
		}
		zones[n] = node.Labels[v1.LabelZone]
	}
	return zones, nil
}

// describeSegments lists topology segments for a message.
func describeSegments(segs []v1.TopologySegment) string {
	var out []string
	for _, s := range segs {
		var parts []string
		if s.NodeName != "" {
			parts = append(parts, v1.TopologyKeyNode+"="+s.NodeName)
		}
		if s.Zone != "" {
			parts = append(parts, v1.LabelZone+"="+s.Zone)
		}
		out = append(out, "{"+strings.Join(parts, ", ")+"}")
	}
	return strings.Join(out, " ")
}

func (c *Controller) DeleteVolume(ctx context.Context, req *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := requireVolumeID(id); err != nil {
		return nil, err
	}
	release, err := c.guard.acquire(id, "DeleteVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	rv, err := c.getRV(ctx, id)
	if err != nil || rv == nil {
		return &csipb.DeleteVolumeResponse{}, err
	}
	rvas, err := c.attachmentsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(rvas) > 0 {
		var nodes []string
		for _, a := range rvas {
			nodes = append(nodes, a.Spec.NodeName)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "volume_id: volume %q is published to node(s) %s; unpublish it first", id, strings.Join(nodes, ", "))
	}
	if err := c.dropUnreadySnapshots(ctx, id); err != nil {
		return nil, err
	}
	if rv.DeletionTimestamp == nil {
		if err := c.Client.Delete(ctx, rv, client.Preconditions{UID: &rv.UID}); err != nil && !apierrors.IsNotFound(err) {
			if apierrors.IsConflict(err) {
				return nil, status.Errorf(codes.Aborted, "volume_id: volume %q was replaced while being deleted; retry", id)
			}
			return nil, internal("deleting ReplicatedVolume "+id, err)
		}
	}
	err = waitRPC(ctx, func() (bool, error) {
		cur, err := c.getRV(ctx, id)
		if cur != nil {
			rv = cur
		}
		return cur == nil, err
	}, func() string {
		return fmt.Sprintf("volume %q is being deleted (%s); a retry waits for it", id, deletionProgress(rv))
	})
	if err != nil {
		return nil, err
	}
	return &csipb.DeleteVolumeResponse{}, nil
}

func deletionProgress(rv *v1.ReplicatedVolume) string {
	return fmt.Sprintf("%d datamesh member(s) left, finalizers %v", len(rv.Status.Datamesh.Members), rv.Finalizers)
}

func (c *Controller) leaseExists(ctx context.Context, node string) (bool, error) {
	var le coordinationv1.Lease
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: v1.AgentLeasePrefix + node}, &le)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, internal("reading the agent Lease of "+node, err)
	}
	return true, nil
}

// ControllerPublishVolume attaches a volume to a node: it checks that the node runs an
// agent and the volume may be attached there, creates the RVA <rv>-<node> (or finds the
// one a previous call made) and waits until the controller reports it Attached
// (docs/contract.md "Attachments").
//
// The answer carries no publish_context. The CO keeps a publish context in the
// VolumeAttachment and hands it to NodeStageVolume later, possibly after the agent
// restarted, the device was re-created or the volume was detached and attached again: a
// device path from it may name a device that is no longer this volume's. NodeStageVolume
// reads the node's own RVR instead, which its agent keeps current, and uses the device
// only once that RVR reports Primary, so the path it stages is never older than the
// promotion it depends on.
func (c *Controller) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	if err := validatePublish(req); err != nil {
		return nil, err
	}
	release, err := c.guard.acquire(id, "ControllerPublishVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	rv, err := c.publishable(ctx, id, node, req.GetVolumeCapability().GetAccessMode().GetMode())
	if err != nil {
		return nil, err
	}
	created, err := c.ensureAttachment(ctx, rv, node, fmt.Sprint(req.GetReadonly()))
	if err != nil {
		return nil, err
	}
	if err := c.waitAttached(ctx, id, node, created); err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{}, nil
}

// validatePublish checks the request's own fields.
func validatePublish(req *csipb.ControllerPublishVolumeRequest) error {
	if err := requireVolumeID(req.GetVolumeId()); err != nil {
		return err
	}
	if req.GetNodeId() == "" {
		return invalid("node_id: required")
	}
	return checkCapability("volume_capability", req.GetVolumeCapability())
}

// publishable returns the volume if it may be attached to node at all: it exists and is
// not being deleted, an agent runs on the node, and a multi-node access mode meets a
// volume created for it.
func (c *Controller) publishable(ctx context.Context, id, node string, mode csipb.VolumeCapability_AccessMode_Mode) (*v1.ReplicatedVolume, error) {
	rv, err := c.existingRV(ctx, id)
	if err != nil {
		return nil, err
	}
	if len(validation.IsDNS1123Subdomain(node)) > 0 {
		return nil, status.Errorf(codes.NotFound, "node_id: %q is not a node name, so no meshvol agent runs there", node)
	}
	if ok, err := c.leaseExists(ctx, node); err != nil {
		return nil, err
	} else if !ok {
		return nil, status.Errorf(codes.NotFound, "node_id: no meshvol agent runs on node %q (no Lease %s/%s%s)", node, c.Namespace, v1.AgentLeasePrefix, node)
	}
	if rv.DeletionTimestamp != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume_id: volume %q is being deleted", id)
	}
	if mode == csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER && rv.Spec.MaxAttachments < 2 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume_capability.access_mode: volume %q was not created for multi-node access", id)
	}
	return rv, nil
}

// ensureAttachment finds the volume's RVA on node, or creates it if the volume's other
// attachments leave room for one. created says whether this call created it (the
// informer may not show it yet). ro is the request's readonly flag, kept on the RVA so
// that a retry with a different flag is refused.
func (c *Controller) ensureAttachment(ctx context.Context, rv *v1.ReplicatedVolume, node, ro string) (created bool, err error) {
	id := rv.Name
	rvas, err := c.attachmentsOf(ctx, id)
	if err != nil {
		return false, err
	}
	var others []string
	for i := range rvas {
		a := &rvas[i]
		if a.Spec.NodeName != node {
			others = append(others, a.Spec.NodeName)
			continue
		}
		if a.DeletionTimestamp != nil {
			return false, status.Errorf(codes.Aborted, "volume %q is being unpublished from node %q; retry", id, node)
		}
		if a.Annotations[annotationReadonly] != ro {
			return false, status.Errorf(codes.AlreadyExists, "readonly: volume %q is published to node %q with readonly=%s", id, node, a.Annotations[annotationReadonly])
		}
		return false, nil
	}
	limit := max(int(rv.Spec.MaxAttachments), 1)
	if len(others) >= limit {
		return false, status.Errorf(codes.FailedPrecondition, "node_id: volume %q is already published to node(s) %s and allows %d attachment(s)",
			id, strings.Join(others, ", "), limit)
	}
	name := v1.AttachmentName(id, node)
	rva := &v1.ReplicatedVolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{v1.LabelVolume: id, v1.LabelNode: node},
			Annotations: map[string]string{annotationReadonly: ro},
		},
		Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: id, NodeName: node},
	}
	if err := c.Client.Create(ctx, rva, client.FieldOwner(v1.FieldManagerCSI)); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, status.Errorf(codes.Aborted, "ReplicatedVolumeAttachment %q appeared meanwhile; retry", name)
		}
		return false, internal("creating ReplicatedVolumeAttachment "+name, err)
	}
	return true, nil
}

// waitAttached waits (bounded by ctx) until the controller reports the volume's RVA on
// node Attached, with the device the attached replica reports, so that NodeStageVolume
// finds a Primary to stage. created: this call created the RVA, so not finding it
// means the informer lags, not that someone deleted it.
func (c *Controller) waitAttached(ctx context.Context, id, node string, created bool) error {
	name := v1.AttachmentName(id, node)
	var last v1.ReplicatedVolumeAttachmentStatus
	return waitRPC(ctx, func() (bool, error) {
		var a v1.ReplicatedVolumeAttachment
		if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &a); err != nil {
			if apierrors.IsNotFound(err) && created {
				return false, nil // the informer has not seen our create yet
			}
			if apierrors.IsNotFound(err) {
				return false, status.Errorf(codes.Aborted, "ReplicatedVolumeAttachment %q was deleted while publishing; retry", name)
			}
			return false, internal("reading ReplicatedVolumeAttachment "+name, err)
		}
		last = a.Status
		return a.Status.Phase == v1.AttachmentAttached && a.Status.DevicePath != "", nil
	}, func() string {
		return fmt.Sprintf("volume %q is not attached to node %q yet (%s); a retry waits for it", id, node, attachProgress(last))
	})
}

func attachProgress(st v1.ReplicatedVolumeAttachmentStatus) string {
	msg := "phase " + string(st.Phase)
	if st.Phase == "" {
		msg = "the controller has not picked it up"
	}
	for _, cnd := range st.Conditions {
		if cnd.Type == v1.ConditionAttached && cnd.Message != "" {
			msg += ": " + cnd.Message
		}
	}
	return msg
}

func (c *Controller) ControllerUnpublishVolume(ctx context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	id, node := req.GetVolumeId(), req.GetNodeId()
	if err := requireVolumeID(id); err != nil {
		return nil, err
	}
	release, err := c.guard.acquire(id, "ControllerUnpublishVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	rvas, err := c.attachmentsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	var gone []string
	for i := range rvas {
		a := &rvas[i]
		if node != "" && a.Spec.NodeName != node {
			continue
		}
		gone = append(gone, a.Name)
		if a.DeletionTimestamp == nil {
			if err := c.Client.Delete(ctx, a); err != nil && !apierrors.IsNotFound(err) {
				return nil, internal("deleting ReplicatedVolumeAttachment "+a.Name, err)
			}
		}
	}
	var left string
	err = waitRPC(ctx, func() (bool, error) {
		for _, n := range gone {
			var a v1.ReplicatedVolumeAttachment
			err := c.Client.Get(ctx, client.ObjectKey{Name: n}, &a)
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return false, internal("reading ReplicatedVolumeAttachment "+n, err)
			}
			left = n + ": " + attachProgress(a.Status)
			return false, nil
		}
		return true, nil
	}, func() string { return fmt.Sprintf("volume %q is still detaching (%s); a retry waits for it", id, left) })
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (c *Controller) ControllerExpandVolume(ctx context.Context, req *csipb.ControllerExpandVolumeRequest) (*csipb.ControllerExpandVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := requireVolumeID(id); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, invalid("capacity_range: required")
	}
	if req.GetVolumeCapability() != nil {
		if err := checkCapability("volume_capability", req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	want, err := requiredSize(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	release, err := c.guard.acquire(id, "ControllerExpandVolume")
	if err != nil {
		return nil, err
	}
	defer release()
	rv, err := c.existingRV(ctx, id)
	if err != nil {
		return nil, err
	}
	if cur := rv.Spec.Size.Value(); cur >= want {
		want = cur
	} else if err := c.checkGrowth(ctx, rv, want); err != nil {
		return nil, err
	} else if err := c.applySize(ctx, id, want); err != nil {
		return nil, err
	}
	var why string
	err = waitRPC(ctx, func() (bool, error) {
		cur, err := c.getRV(ctx, id)
		if err != nil || cur == nil {
			if cur == nil && err == nil {
				err = status.Errorf(codes.NotFound, "volume_id: volume %q was deleted while expanding", id)
			}
			return false, err
		}
		rv = cur
		var ok bool
		ok, why, err = c.grown(ctx, cur, want)
		return ok, err
	}, func() string {
		return fmt.Sprintf("volume %q is still growing to %d bytes (%s); a retry waits for it", id, want, why)
	})
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerExpandVolumeResponse{
		CapacityBytes:         rv.CapacityBytes(),
		NodeExpansionRequired: req.GetVolumeCapability().GetBlock() == nil,
	}, nil
}

// applySize raises spec.size with a server-side apply of that one field.
func (c *Controller) applySize(ctx context.Context, name string, size int64) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(v1.SchemeGroupVersion.String())
	u.SetKind("ReplicatedVolume")
	u.SetName(name)
	if err := unstructured.SetNestedField(u.Object, resource.NewQuantity(size, resource.BinarySI).String(), "spec", "size"); err != nil {
		return internal("building the size patch", err)
	}
	err := c.Client.Patch(ctx, u, client.Apply, client.FieldOwner(v1.FieldManagerCSI), client.ForceOwnership)
	if apierrors.IsInvalid(err) {
		return invalid("capacity_range: %v", err)
	}
	if err != nil {
		return internal("raising the size of ReplicatedVolume "+name, err)
	}
	return nil
}

// grown: the controller has published a DRBD size of at least want and every
// diskful member has confirmed the datamesh revision (docs/contract.md "CSI"). An
// agent confirms a revision only once its DRBD device is at least the datamesh's
// size, so a confirmed revision means the device grew, not just the backing
// volume under it. If not, why says what it waits for, in words an operator can
// act on: the transition in flight, or the replica and its own account.
func (c *Controller) grown(ctx context.Context, rv *v1.ReplicatedVolume, want int64) (bool, string, error) {
	st := &rv.Status
	if s := st.Datamesh.Size; s == nil || s.Value() < want {
		if len(st.DatameshTransitions) > 0 {
			return false, "the controller publishes the new size once no datamesh transition is in flight; in flight: " +
				transitionsInFlight(st.DatameshTransitions), nil
		}
		return false, "the controller has not published the new DRBD size yet", nil
	}
	for _, m := range st.Datamesh.Members {
		if !m.Type.HasDisk() {
			continue
		}
		var r v1.ReplicatedVolumeReplica
		if err := c.Client.Get(ctx, client.ObjectKey{Name: m.Name}, &r); err != nil {
			if apierrors.IsNotFound(err) {
				return false, "replica " + m.Name + " is not visible yet", nil
			}
			return false, "", internal("reading ReplicatedVolumeReplica "+m.Name, err)
		}
		if r.Status.DatameshRevision >= st.DatameshRevision {
			continue
		}
		why := fmt.Sprintf("replica %s on node %s has not confirmed datamesh revision %d (its DRBD device at %s)",
			m.Name, m.NodeName, st.DatameshRevision, st.Datamesh.Size.String())
		for _, t := range []string{v1.ConditionAgentReady, v1.ConditionDRBDConfigured} {
			if cond := meta.FindStatusCondition(r.Status.Conditions, t); cond != nil && cond.Status != metav1.ConditionTrue {
				return false, why + ": " + cond.Message, nil
			}
		}
		return false, why, nil
	}
	return true, "", nil
}

// transitionsInFlight names each transition and the step it is at.
func transitionsInFlight(ts []v1.DatameshTransition) string {
	var out []string
	for _, t := range ts {
		s := string(t.Type)
		if t.ReplicaName != "" {
			s += " of " + t.ReplicaName
		}
		for _, step := range t.Steps {
			if step.Status != v1.StepCompleted {
				s += fmt.Sprintf(" (step %q", step.Name)
				if step.Message != "" {
					s += ": " + step.Message
				}
				s += ")"
				break
			}
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}
