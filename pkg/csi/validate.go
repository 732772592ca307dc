package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Request validation: pure functions of the request, so the fuzz target can drive
// them. Each error is InvalidArgument (or OutOfRange for sizes, as the spec asks) and
// names the field.

const (
	// DefaultVolumeSize is what a CreateVolume without capacity_range gets.
	DefaultVolumeSize int64 = 1 << 30
	// sizeAlign: volumes are whole MiB, which every pool type and DRBD (512-byte
	// sectors) and both filesystems can represent exactly.
	sizeAlign int64 = 1 << 20
	// maxVolumeSize bounds a request well inside DRBD's limit (1 PiB per device with
	// 7 bitmap slots is far more than any pool here), so that arithmetic never overflows.
	maxVolumeSize int64 = 1 << 50

	fsExt4 = "ext4"
	fsXFS  = "xfs"
	// minXFSSize: mkfs.xfs (xfsprogs 5.19 on) refuses a file system under 300 MiB
	// ("Filesystem must be larger than 300MB"), so NodeStage could never format a
	// smaller xfs volume.
	minXFSSize int64 = 300 << 20
)

// Parameters the external-provisioner adds with --extra-create-metadata; they describe
// the claim and are ignored rather than refused.
const provisionerParamPrefix = "csi.storage.k8s.io/"

func invalid(format string, a ...any) error {
	return status.Errorf(codes.InvalidArgument, format, a...)
}

// requireVolumeID checks a volume_id field.
func requireVolumeID(id string) error {
	if id == "" {
		return invalid("volume_id: required")
	}
	return nil
}

// rvNameFor maps a CreateVolume name to the RV name (the volume id). A valid DNS label
// of at most 63 characters is used as it is (the usual pvc-<uid>); anything else gets a
// stable hash, and the original name is kept in an annotation.
func rvNameFor(name string) (rv string, hashed bool) {
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name, false
	}
	sum := sha256.Sum256([]byte(name))
	return v1.CSIVolumeNamePrefix + hex.EncodeToString(sum[:])[:40], true
}

// requiredSize turns a capacity_range into the volume's size: required_bytes (or the
// default, capped by limit_bytes) rounded up to whole MiB, never above limit_bytes.
func requiredSize(cr *csipb.CapacityRange) (int64, error) {
	if cr == nil {
		return DefaultVolumeSize, nil
	}
	req, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if req < 0 {
		return 0, invalid("capacity_range.required_bytes: must not be negative, got %d", req)
	}
	if lim < 0 {
		return 0, invalid("capacity_range.limit_bytes: must not be negative, got %d", lim)
	}
	if lim > 0 && req > lim {
		return 0, invalid("capacity_range: required_bytes %d exceeds limit_bytes %d", req, lim)
	}
	if req > maxVolumeSize {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range.required_bytes: %d exceeds the largest volume, %d", req, maxVolumeSize)
	}
	size := req
	if size == 0 {
		size = DefaultVolumeSize
		if lim > 0 && lim < size {
			size = lim
		}
	}
	size = (size + sizeAlign - 1) / sizeAlign * sizeAlign
	if lim > 0 && size > lim {
		return 0, status.Errorf(codes.OutOfRange, "capacity_range: volumes are whole MiB; %d rounds up to %d, above limit_bytes %d", req, size, lim)
	}
	return size, nil
}

// sizeFits says whether an existing volume of size satisfies a capacity_range.
func sizeFits(size int64, cr *csipb.CapacityRange) bool {
	if cr == nil {
		return true
	}
	if cr.GetRequiredBytes() > 0 && size < cr.GetRequiredBytes() {
		return false
	}
	if cr.GetLimitBytes() > 0 && size > cr.GetLimitBytes() {
		return false
	}
	return true
}

// capsSummary is what CreateVolume learns from the capabilities.
type capsSummary struct {
	block, mount bool
	// multiNode: a MULTI_NODE_MULTI_WRITER block capability, the live-migration case;
	// the volume then allows two attachments.
	multiNode bool
	// xfs: a mount capability asks for xfs, which needs minXFSSize.
	xfs bool
}

// checkCapabilities validates volume_capabilities: each names an access type (block
// or mount with ext4/xfs) and an access mode meshvol serves. field is the request's
// field name for messages.
func checkCapabilities(field string, caps []*csipb.VolumeCapability) (capsSummary, error) {
	var s capsSummary
	if len(caps) == 0 {
		return s, invalid("%s: at least one capability is required", field)
	}
	for i, c := range caps {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := checkCapability(f, c); err != nil {
			return s, err
		}
		if c.GetBlock() != nil {
			s.block = true
		} else {
			s.mount = true
			s.xfs = s.xfs || c.GetMount().GetFsType() == fsXFS
		}
		if c.GetAccessMode().GetMode() == csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER {
			s.multiNode = true
		}
	}
	return s, nil
}

// checkCapability validates one capability, naming field in its error.
func checkCapability(field string, c *csipb.VolumeCapability) error {
	if c == nil {
		return invalid("%s: required", field)
	}
	if c.GetAccessMode() == nil {
		return invalid("%s.access_mode: required", field)
	}
	mode := c.GetAccessMode().GetMode()
	switch {
	case c.GetBlock() != nil:
	case c.GetMount() != nil:
		if fs := c.GetMount().GetFsType(); fs != "" && fs != fsExt4 && fs != fsXFS {
			return invalid("%s.mount.fs_type: %q is not supported; use ext4 or xfs", field, fs)
		}
		for j, fl := range c.GetMount().GetMountFlags() {
			if fl == "" || strings.ContainsAny(fl, "\x00\n") {
				return invalid("%s.mount.mount_flags[%d]: %q is not a mount option", field, j, fl)
			}
		}
	default:
		return invalid("%s.access_type: block or mount is required", field)
	}
	switch mode {
	case csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
		if c.GetBlock() == nil {
			return invalid("%s.access_mode: MULTI_NODE_MULTI_WRITER needs a block volume (two attachments exist only for live migration; no filesystem survives two writers)", field)
		}
	case csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, csipb.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER:
		return invalid("%s.access_mode: %s is not supported: a DRBD device is usable only where it is Primary", field, mode)
	default:
		return invalid("%s.access_mode: unknown mode %d", field, int32(mode))
	}
	return nil
}

// checkParameters returns the RSC a CreateVolume's parameters name. The one key it
// takes is replicatedStorageClassName; the provisioner's own csi.storage.k8s.io/ keys
// are ignored; anything else is InvalidArgument naming the key, so a typo in a
// StorageClass fails loudly instead of provisioning with defaults.
func checkParameters(params map[string]string) (string, error) {
	keys := make([]string, 0, len(params))
	for k := range params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != v1.CSIParameterStorageClass && !strings.HasPrefix(k, provisionerParamPrefix) {
			return "", invalid("parameters[%q]: unknown key; the only parameter is %s", k, v1.CSIParameterStorageClass)
		}
	}
	rsc, ok := params[v1.CSIParameterStorageClass]
	if !ok || rsc == "" {
		return "", invalid("parameters[%q]: required: name the ReplicatedStorageClass", v1.CSIParameterStorageClass)
	}
	if errs := validation.IsDNS1123Subdomain(rsc); len(errs) > 0 {
		return "", invalid("parameters[%q]: %q is not a valid object name: %s", v1.CSIParameterStorageClass, rsc, errs[0])
	}
	return rsc, nil
}

// segmentFromCSI converts a topology segment; only meshvol's two keys are meaningful.
func segmentFromCSI(field string, t *csipb.Topology) (v1.TopologySegment, error) {
	var s v1.TopologySegment
	if t == nil || len(t.GetSegments()) == 0 {
		return s, invalid("%s: empty topology segment", field)
	}
	for k, v := range t.GetSegments() {
		switch k {
		case v1.TopologyKeyNode:
			if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
				return s, invalid("%s.segments[%q]: %q is not a node name: %s", field, k, v, errs[0])
			}
			s.NodeName = v
		case v1.LabelZone:
			if v == "" || len(v) > 253 {
				return s, invalid("%s.segments[%q]: a zone of 1 to 253 characters is required", field, k)
			}
			s.Zone = v
		default:
			return s, invalid("%s.segments: unknown topology key %q; meshvol uses %s and %s", field, k, v1.TopologyKeyNode, v1.LabelZone)
		}
	}
	return s, nil
}

// placementHints converts accessibility_requirements into the RV's hints (nil if none).
func placementHints(tr *csipb.TopologyRequirement) (*v1.PlacementHints, error) {
	if tr == nil || (len(tr.GetRequisite()) == 0 && len(tr.GetPreferred()) == 0) {
		return nil, nil
	}
	const max = 64 // the CRD's MaxItems
	if len(tr.GetRequisite()) > max || len(tr.GetPreferred()) > max {
		return nil, invalid("accessibility_requirements: at most %d requisite and %d preferred segments", max, max)
	}
	h := &v1.PlacementHints{}
	for i, t := range tr.GetRequisite() {
		s, err := segmentFromCSI(fmt.Sprintf("accessibility_requirements.requisite[%d]", i), t)
		if err != nil {
			return nil, err
		}
		h.Requisite = append(h.Requisite, s)
	}
	for i, t := range tr.GetPreferred() {
		s, err := segmentFromCSI(fmt.Sprintf("accessibility_requirements.preferred[%d]", i), t)
		if err != nil {
			return nil, err
		}
		h.Preferred = append(h.Preferred, s)
	}
	if len(h.Preferred) == 0 {
		// Requisite alone says the workload runs inside these segments; the spec leaves
		// the choice among them to the plugin. Placement prefers Diskful replicas in the
		// preferred segments (only volumeAccess Local reads requisite), so without this
		// a volume could get no local data where its consumer is, only a TieBreaker.
		h.Preferred = slices.Clone(h.Requisite)
	}
	return h, nil
}

// createRequest is a validated CreateVolume.
type createRequest struct {
	rvName, csiName string
	hashed          bool
	size            int64
	rsc             string
	caps            capsSummary
	hints           *v1.PlacementHints
	// source is the volume_content_source, nil for an empty volume.
	source *contentSourceRequest
	// dataSource is what the source resolves to (CreateVolume fills it in).
	dataSource *v1.VolumeDataSource
}

// contentSourceRequest is a validated volume_content_source: a snapshot or a volume.
type contentSourceRequest struct {
	snapshot, volume string
}

func contentSource(cs *csipb.VolumeContentSource) (*contentSourceRequest, error) {
	if cs == nil {
		return nil, nil
	}
	switch {
	case cs.GetSnapshot() != nil:
		if cs.GetSnapshot().GetSnapshotId() == "" {
			return nil, invalid("volume_content_source.snapshot.snapshot_id: required")
		}
		return &contentSourceRequest{snapshot: cs.GetSnapshot().GetSnapshotId()}, nil
	case cs.GetVolume() != nil:
		if cs.GetVolume().GetVolumeId() == "" {
			return nil, invalid("volume_content_source.volume.volume_id: required")
		}
		return &contentSourceRequest{volume: cs.GetVolume().GetVolumeId()}, nil
	}
	return nil, invalid("volume_content_source: must name a snapshot or a volume")
}

// validateCreate checks everything CreateVolume can check without the API.
func validateCreate(req *csipb.CreateVolumeRequest) (createRequest, error) {
	var r createRequest
	if req.GetName() == "" {
		return r, invalid("name: required")
	}
	if len(req.GetName()) > 1024 {
		return r, invalid("name: at most 1024 bytes, got %d", len(req.GetName()))
	}
	var err error
	if r.source, err = contentSource(req.GetVolumeContentSource()); err != nil {
		return r, err
	}
	if r.caps, err = checkCapabilities("volume_capabilities", req.GetVolumeCapabilities()); err != nil {
		return r, err
	}
	if r.size, err = requiredSize(req.GetCapacityRange()); err != nil {
		return r, err
	}
	if r.caps.xfs && r.size < minXFSSize {
		// A volume may be larger than required_bytes (CSI: capacity_range is a
		// minimum and a limit), so a small xfs volume is made big enough to format.
		if lim := req.GetCapacityRange().GetLimitBytes(); lim > 0 && lim < minXFSSize {
			return r, status.Errorf(codes.OutOfRange, "capacity_range.limit_bytes: an xfs file system needs at least %d bytes (300 MiB, mkfs.xfs refuses less), above limit_bytes %d", minXFSSize, lim)
		}
		r.size = minXFSSize
	}
	if r.rsc, err = checkParameters(req.GetParameters()); err != nil {
		return r, err
	}
	if r.hints, err = placementHints(req.GetAccessibilityRequirements()); err != nil {
		return r, err
	}
	r.csiName = req.GetName()
	r.rvName, r.hashed = rvNameFor(req.GetName())
	return r, nil
}
