package csi

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/placement"
)

// GetCapacity answers for the class the parameters name, inside the requested
// segment: maximum_volume_size is the largest volume the pool can place now (the
// layout's D-th largest free space, after DRBD metadata, with volumeAccess Local one
// of them inside the segment); available_capacity is the pool's usable free space in
// the segment's reach divided by the number of copies. Without parameters the answer
// is 0: CreateVolume needs a class.
func (c *Controller) GetCapacity(ctx context.Context, req *csipb.GetCapacityRequest) (*csipb.GetCapacityResponse, error) {
	for i, vc := range req.GetVolumeCapabilities() {
		if err := checkCapability(fmt.Sprintf("volume_capabilities[%d]", i), vc); err != nil {
			return nil, err
		}
	}
	var seg *v1.TopologySegment
	if t := req.GetAccessibleTopology(); t != nil {
		s, err := segmentFromCSI("accessible_topology", t)
		if err != nil {
			return nil, err
		}
		seg = &s
	}
	if len(req.GetParameters()) == 0 {
		return &csipb.GetCapacityResponse{AvailableCapacity: 0, MaximumVolumeSize: wrapperspb.Int64(0)}, nil
	}
	rscName, err := checkParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	rsc, err := c.getRSC(ctx, rscName)
	if err != nil {
		return nil, err
	}
	l, err := classLayout(rsc)
	if err != nil {
		return nil, err
	}
	nodes, err := c.poolNodes(ctx, rsc)
	if err != nil {
		return nil, err
	}
	local := rsc.Spec.VolumeAccess == v1.VolumeAccessLocal
	var all []int64
	var sum, bestInSeg int64
	for _, n := range nodes {
		if !n.known {
			continue
		}
		all = append(all, n.usable)
		in := seg == nil || placement.SegmentMatches(*seg, n.name, n.zone)
		if in && n.usable > bestInSeg {
			bestInSeg = n.usable
		}
		if !local || in {
			sum += n.usable
		}
	}
	need := l.DiskfulCount()
	var maxVol int64
	if len(all) >= need {
		sort.Slice(all, func(i, j int) bool { return all[i] > all[j] })
		maxVol = all[need-1]
		if local && bestInSeg < maxVol {
			// A Local volume is reachable from the segment only through a diskful
			// replica inside it.
			maxVol = bestInSeg
		}
	}
	avail := sum / int64(need)
	if maxVol == 0 {
		avail = 0
	}
	if maxVol > avail {
		maxVol = avail
	}
	return &csipb.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(maxVol)}, nil
}

// listTokenPrefix marks a ListVolumes token: a token is the name of the last volume
// returned, so volumes created or deleted between pages neither repeat nor vanish.
const listTokenPrefix = "after:"

func (c *Controller) ListVolumes(ctx context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries: must not be negative, got %d", req.GetMaxEntries())
	}
	after := ""
	if tok := req.GetStartingToken(); tok != "" {
		name, ok := strings.CutPrefix(tok, listTokenPrefix)
		if !ok || len(validation.IsDNS1123Label(name)) > 0 {
			return nil, status.Errorf(codes.Aborted, "starting_token: %q is not a token ListVolumes returned", tok)
		}
		after = name
	}
	var l v1.ReplicatedVolumeList
	if err := c.Client.List(ctx, &l); err != nil {
		return nil, internal("listing ReplicatedVolumes", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	var atts v1.ReplicatedVolumeAttachmentList
	if err := c.Client.List(ctx, &atts); err != nil {
		return nil, internal("listing ReplicatedVolumeAttachments", err)
	}
	published := map[string][]string{}
	for _, a := range atts.Items {
		published[a.Spec.ReplicatedVolumeName] = append(published[a.Spec.ReplicatedVolumeName], a.Spec.NodeName)
	}
	resp := &csipb.ListVolumesResponse{}
	for i := range l.Items {
		rv := &l.Items[i]
		if rv.Name <= after {
			continue
		}
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = listTokenPrefix + resp.Entries[len(resp.Entries)-1].Volume.VolumeId
			break
		}
		resp.Entries = append(resp.Entries, &csipb.ListVolumesResponse_Entry{
			Volume: &csipb.Volume{VolumeId: rv.Name, CapacityBytes: rv.CapacityBytes()},
			Status: &csipb.ListVolumesResponse_VolumeStatus{
				PublishedNodeIds: sorted(published[rv.Name]),
				VolumeCondition:  volumeCondition(rv),
			},
		})
	}
	return resp, nil
}

func sorted(s []string) []string { sort.Strings(s); return s }

// volumeCondition reads the volume's health from its status: not formed, being
// deleted, or a Ready condition that is False make it abnormal, with their message.
func volumeCondition(rv *v1.ReplicatedVolume) *csipb.VolumeCondition {
	if rv.DeletionTimestamp != nil {
		return &csipb.VolumeCondition{Abnormal: true, Message: "the volume is being deleted"}
	}
	if ok, why := formed(rv); !ok {
		return &csipb.VolumeCondition{Abnormal: true, Message: "the volume is not formed yet: " + why}
	}
	if cnd := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionReady); cnd != nil && cnd.Status != "True" {
		return &csipb.VolumeCondition{Abnormal: true, Message: cnd.Reason + ": " + cnd.Message}
	}
	msg := "formed"
	if rv.Status.Layout != "" {
		msg += ", layout " + rv.Status.Layout
	}
	if rv.Status.ReadyMembers != "" {
		msg += ", " + rv.Status.ReadyMembers + " members in sync"
	}
	if rv.Status.Phase != "" {
		msg += ", phase " + string(rv.Status.Phase)
	}
	return &csipb.VolumeCondition{Abnormal: false, Message: msg}
}

func (c *Controller) ControllerGetVolume(ctx context.Context, req *csipb.ControllerGetVolumeRequest) (*csipb.ControllerGetVolumeResponse, error) {
	id := req.GetVolumeId()
	if err := requireVolumeID(id); err != nil {
		return nil, err
	}
	rv, err := c.existingRV(ctx, id)
	if err != nil {
		return nil, err
	}
	rvas, err := c.attachmentsOf(ctx, id)
	if err != nil {
		return nil, err
	}
	var nodes []string
	for _, a := range rvas {
		nodes = append(nodes, a.Spec.NodeName)
	}
	return &csipb.ControllerGetVolumeResponse{
		Volume: &csipb.Volume{VolumeId: rv.Name, CapacityBytes: rv.CapacityBytes()},
		Status: &csipb.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: nodes, VolumeCondition: volumeCondition(rv)},
	}, nil
}

// ValidateVolumeCapabilities confirms what CreateVolume would have accepted for this
// volume: the access types and modes meshvol serves, multi-node block access only on a
// volume created for it, and the same class when parameters are given.
func (c *Controller) ValidateVolumeCapabilities(ctx context.Context, req *csipb.ValidateVolumeCapabilitiesRequest) (*csipb.ValidateVolumeCapabilitiesResponse, error) {
	id := req.GetVolumeId()
	if err := requireVolumeID(id); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities: at least one capability is required")
	}
	for i, vc := range req.GetVolumeCapabilities() {
		if vc == nil || vc.GetAccessMode() == nil || (vc.GetBlock() == nil && vc.GetMount() == nil) {
			return nil, invalid("volume_capabilities[%d]: access_type and access_mode are required", i)
		}
	}
	rv, err := c.existingRV(ctx, id)
	if err != nil {
		return nil, err
	}
	for i, vc := range req.GetVolumeCapabilities() {
		f := "volume_capabilities[" + strconv.Itoa(i) + "]"
		if err := checkCapability(f, vc); err != nil {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
		if vc.GetAccessMode().GetMode() == csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER && rv.Spec.MaxAttachments < 2 {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: f + ".access_mode: the volume was not created for multi-node access"}, nil
		}
	}
	if len(req.GetParameters()) > 0 {
		rsc, err := checkParameters(req.GetParameters())
		if err != nil {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
		if rsc != rv.Spec.ReplicatedStorageClassName {
			return &csipb.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("parameters[%q]: the volume's class is %q", v1.CSIParameterStorageClass, rv.Spec.ReplicatedStorageClassName)}, nil
		}
	}
	return &csipb.ValidateVolumeCapabilitiesResponse{Confirmed: &csipb.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
