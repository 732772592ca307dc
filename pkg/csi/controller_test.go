package csi

import (
	"context"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

func params(rsc string) map[string]string { return map[string]string{v1.CSIParameterStorageClass: rsc} }

func createVol(name, rsc string, size int64, caps ...*csipb.VolumeCapability) *csipb.CreateVolumeRequest {
	if len(caps) == 0 {
		caps = []*csipb.VolumeCapability{mountCap("ext4", snw)}
	}
	return &csipb.CreateVolumeRequest{Name: name, Parameters: params(rsc), VolumeCapabilities: caps,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: size}}
}

func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// TestControllerService drives every RPC of the controller service through its gRPC
// socket against a real apiserver, with the test playing the controller. Each row is
// one code path; rows run in order because later ones use what earlier ones made.
func TestControllerService(t *testing.T) {
	ctx := context.Background()
	pfx := testenvName(t)
	n1, n2, n3 := pfx+"-n1", pfx+"-n2", pfx+"-n3"
	pool := pfx + "-pool"
	setupPool(t, ctx, pool, map[string]int64{n1: 10 * gib, n2: 5 * gib, n3: 1 * gib})
	r1, r2, r3, local, slow, full := pfx+"-r1", pfx+"-r2", pfx+"-r3", pfx+"-local", "slow-"+pfx, "full-"+pfx
	makeRSC(t, ctx, r1, pool, v1.ReplicationNone, v1.VolumeAccessPreferablyLocal)
	makeRSC(t, ctx, r2, pool, v1.ReplicationAvailability, v1.VolumeAccessAny)
	makeRSC(t, ctx, r3, pool, v1.ReplicationConsistencyAndAvailability, v1.VolumeAccessAny)
	makeRSC(t, ctx, local, pool, v1.ReplicationNone, v1.VolumeAccessLocal)
	makeRSC(t, ctx, slow, pool, v1.ReplicationNone, v1.VolumeAccessAny)
	makeRSC(t, ctx, full, pool, v1.ReplicationNone, v1.VolumeAccessAny)
	play := startPlayController(t, []string{n1, n2, n3})

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cl, err := NewControllerClient(cctx, env.Config, env.Scheme, v1.DefaultNamespace)
	must(t, err)
	conn := serve(t, Services{
		Identity:   &Identity{Ready: apiserverReady(env.Config, cl)},
		Controller: &Controller{Client: cl, Namespace: v1.DefaultNamespace},
	})
	cs := csipb.NewControllerClient(conn)
	ids := csipb.NewIdentityClient(conn)

	va := pfx + "-a"
	upper := "Sanity-" + strings.ToUpper(pfx)
	var upperID string
	vslow := pfx + "-slow"

	rows := []codeRow{
		{"Probe ready", func(ctx context.Context) error {
			r, err := ids.Probe(ctx, &csipb.ProbeRequest{})
			if err == nil && !r.GetReady().GetValue() {
				return errors.New("not ready")
			}
			return err
		}, codes.OK, ""},
		{"GetPluginInfo", func(ctx context.Context) error {
			r, err := ids.GetPluginInfo(ctx, &csipb.GetPluginInfoRequest{})
			if err == nil && r.GetName() != v1.CSIDriverName {
				return errors.New("name " + r.GetName())
			}
			return err
		}, codes.OK, ""},
		{"GetPluginCapabilities", func(ctx context.Context) error {
			r, err := ids.GetPluginCapabilities(ctx, &csipb.GetPluginCapabilitiesRequest{})
			if err == nil && len(r.GetCapabilities()) != 3 {
				return errors.New("want controller service, accessibility and online expansion")
			}
			return err
		}, codes.OK, ""},
		{"Create: invalid request", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol("", r1, mib))
			return err
		}, codes.InvalidArgument, "name"},
		{"Create: class does not exist", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol(va, pfx+"-nope", 64*mib))
			return err
		}, codes.InvalidArgument, `parameters["replicatedStorageClassName"]`},
		{"Create: the port range is full", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol(pfx+"-full", full, 64*mib))
			return err
		}, codes.ResourceExhausted, "status.datamesh.port: no free DRBD port"},
		{"Create: formed, real size and topology", func(ctx context.Context) error {
			req := createVol(va, r1, 64*mib)
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Preferred: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: n2}}}}
			r, err := cs.CreateVolume(ctx, req)
			if err != nil {
				return err
			}
			if r.Volume.VolumeId != va || r.Volume.CapacityBytes != 64*mib {
				return errors.New("got " + r.String())
			}
			if got := topoNodes(r.Volume.AccessibleTopology); strings.Join(got, ",") != strings.Join([]string{n1, n2, n3}, ",") {
				return errors.New("PreferablyLocal volume is reachable from every agent's node, got " + strings.Join(got, ","))
			}
			var rv v1.ReplicatedVolume
			must(t, env.Client.Get(ctx, client.ObjectKey{Name: va}, &rv))
			if rv.Spec.PlacementHints == nil || rv.Spec.PlacementHints.Preferred[0].NodeName != n2 || rv.Spec.ReplicatedStorageClassName != r1 ||
				rv.Spec.MaxAttachments != 1 {
				return errors.New("RV spec not as contract says")
			}
			return nil
		}, codes.OK, ""},
		{"Create: idempotent", func(ctx context.Context) error {
			r, err := cs.CreateVolume(ctx, createVol(va, r1, 64*mib))
			if err == nil && r.Volume.VolumeId != va {
				return errors.New("another volume")
			}
			return err
		}, codes.OK, ""},
		{"Create: same name, other size", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol(va, r1, 128*mib))
			return err
		}, codes.AlreadyExists, "capacity_range"},
		{"Create: same name, other class", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol(va, r2, 64*mib))
			return err
		}, codes.AlreadyExists, "parameters"},
		{"Create: a name that is not an RV name is hashed", func(ctx context.Context) error {
			r, err := cs.CreateVolume(ctx, createVol(upper, r2, 8*mib))
			if err != nil {
				return err
			}
			upperID = r.Volume.VolumeId
			r2nd, err := cs.CreateVolume(ctx, createVol(upper, r2, 8*mib))
			if err == nil && (r2nd.Volume.VolumeId != upperID || !strings.HasPrefix(upperID, v1.CSIVolumeNamePrefix)) {
				return errors.New("ids " + upperID + " " + r2nd.Volume.VolumeId)
			}
			return err
		}, codes.OK, ""},
		{"Create: Local topology is the diskful nodes", func(ctx context.Context) error {
			r, err := cs.CreateVolume(ctx, createVol(pfx+"-loc", local, 8*mib))
			if err == nil && strings.Join(topoNodes(r.Volume.AccessibleTopology), ",") != n1 {
				return errors.New("got " + strings.Join(topoNodes(r.Volume.AccessibleTopology), ","))
			}
			return err
		}, codes.OK, ""},
		// A StorageClass's allowedTopologies reach CreateVolume as requisite segments
		// (external-provisioner): the PersistentVolume's node affinity, which is this
		// list, must keep the volume inside them whatever its volumeAccess.
		{"Create: requisite node narrows the topology (no claim named)", func(ctx context.Context) error {
			req := createVol(pfx+"-allowed", r1, 8*mib)
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: n2}}}}
			r, err := cs.CreateVolume(ctx, req)
			if err == nil && strings.Join(topoNodes(r.Volume.AccessibleTopology), ",") != n2 {
				return errors.New("PreferablyLocal under requisite " + n2 + ": got " + strings.Join(topoNodes(r.Volume.AccessibleTopology), ","))
			}
			return err
		}, codes.OK, ""},
		{"Create: requisite zones narrow the topology", func(ctx context.Context) error {
			req := createVol(pfx+"-allowed-zones", r2, 8*mib)
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{
				{Segments: map[string]string{v1.LabelZone: "zone-" + n1}}, {Segments: map[string]string{v1.LabelZone: "zone-" + n3}}}}
			r, err := cs.CreateVolume(ctx, req)
			if err == nil && strings.Join(topoNodes(r.Volume.AccessibleTopology), ",") != n1+","+n3 {
				return errors.New("Any under requisite zones of " + n1 + " and " + n3 + ": got " + strings.Join(topoNodes(r.Volume.AccessibleTopology), ","))
			}
			return err
		}, codes.OK, ""},
		{"Create: Local topology is the diskful nodes inside requisite", func(ctx context.Context) error {
			req := createVol(pfx+"-loc-req", local, 8*mib)
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{
				{Segments: map[string]string{v1.TopologyKeyNode: n1}}, {Segments: map[string]string{v1.TopologyKeyNode: n2}}}}
			r, err := cs.CreateVolume(ctx, req)
			if err == nil && strings.Join(topoNodes(r.Volume.AccessibleTopology), ",") != n1 {
				return errors.New("got " + strings.Join(topoNodes(r.Volume.AccessibleTopology), ","))
			}
			return err
		}, codes.OK, ""},
		// The play controller puts a Local volume's diskful replica on n1 whatever the
		// request says: a volume usable nowhere inside requisite is refused, not
		// returned with an empty (unrestricted) topology.
		{"Create: no node inside requisite", func(ctx context.Context) error {
			req := createVol(pfx+"-loc-out", local, 8*mib)
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: n3}}}}
			_, err := cs.CreateVolume(ctx, req)
			return err
		}, codes.ResourceExhausted, "accessibility_requirements.requisite"},
		// Through external-provisioner with --extra-create-metadata the request names
		// its claim: the claim's StorageClass's allowedTopologies decide, matched
		// against the Nodes' labels, and a requisite of the one node the scheduler
		// picked (--strict-topology under WaitForFirstConsumer) confines nothing.
		{"Create: the claim's allowedTopologies narrow the topology", func(ctx context.Context) error {
			claimWithClass(t, ctx, pfx+"-claim-allowed", []string{n1, n3}, n1, n2, n3)
			req := createVol(pfx+"-claim-allowed", r1, 8*mib)
			req.Parameters[paramPVCName], req.Parameters[paramPVCNamespace] = pfx+"-claim-allowed", "default"
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: n3}}}}
			r, err := cs.CreateVolume(ctx, req)
			if err == nil && strings.Join(topoNodes(r.Volume.AccessibleTopology), ",") != n1+","+n3 {
				return errors.New("allowedTopologies " + n1 + ", " + n3 + ": got " + strings.Join(topoNodes(r.Volume.AccessibleTopology), ","))
			}
			return err
		}, codes.OK, ""},
		{"Create: a picked node's requisite does not confine a named claim's volume", func(ctx context.Context) error {
			claimWithClass(t, ctx, pfx+"-claim-any", nil, n1, n2, n3)
			req := createVol(pfx+"-claim-any", r1, 8*mib)
			req.Parameters[paramPVCName], req.Parameters[paramPVCNamespace] = pfx+"-claim-any", "default"
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: n2}}}}
			r, err := cs.CreateVolume(ctx, req)
			if err == nil && strings.Join(topoNodes(r.Volume.AccessibleTopology), ",") != strings.Join([]string{n1, n2, n3}, ",") {
				return errors.New("no allowedTopologies: got " + strings.Join(topoNodes(r.Volume.AccessibleTopology), ","))
			}
			return err
		}, codes.OK, ""},
		{"Create: 3D does not fit", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol(pfx+"-big3", r3, 2*gib))
			return err
		}, codes.ResourceExhausted, "capacity"},
		{"Create: 2D does not fit", func(ctx context.Context) error {
			_, err := cs.CreateVolume(ctx, createVol(pfx+"-big2", r2, 6*gib))
			return err
		}, codes.ResourceExhausted, "2D+1TB"},
		{"Create: Local, requisite node too small", func(ctx context.Context) error {
			req := createVol(pfx+"-req", local, 2*gib)
			req.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: []*csipb.Topology{{Segments: map[string]string{v1.TopologyKeyNode: n3}}}}
			_, err := cs.CreateVolume(ctx, req)
			return err
		}, codes.ResourceExhausted, "accessibility_requirements.requisite"},
		{"Create: still forming at the deadline", func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err := cs.CreateVolume(ctx, createVol(vslow, slow, 8*mib))
			return err
		}, codes.DeadlineExceeded, ""},
		{"Create: a second call while one waits is Aborted; the first finishes", func(ctx context.Context) error {
			first := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				_, err := cs.CreateVolume(ctx, createVol(vslow, slow, 8*mib))
				first <- err
			}()
			var err error
			for i := 0; i < 100; i++ {
				time.Sleep(20 * time.Millisecond)
				ctx2, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err = cs.CreateVolume(ctx2, createVol(vslow, slow, 8*mib))
				cancel()
				if status.Code(err) == codes.Aborted {
					break
				}
			}
			play.release(vslow)
			if ferr := <-first; ferr != nil {
				return errors.New("the first call failed: " + ferr.Error())
			}
			return err
		}, codes.Aborted, "already in progress"},
		{"Publish: unknown volume", func(ctx context.Context) error {
			_, err := cs.ControllerPublishVolume(ctx, publishReq(pfx+"-nope", n1, false))
			return err
		}, codes.NotFound, "volume_id"},
		{"Publish: unknown node", func(ctx context.Context) error {
			_, err := cs.ControllerPublishVolume(ctx, publishReq(va, pfx+"-nonode", false))
			return err
		}, codes.NotFound, "node_id"},
		{"Publish: no capability", func(ctx context.Context) error {
			req := publishReq(va, n1, false)
			req.VolumeCapability = nil
			_, err := cs.ControllerPublishVolume(ctx, req)
			return err
		}, codes.InvalidArgument, "volume_capability"},
		{"Publish: attached, no device path in publish_context", func(ctx context.Context) error {
			// NodeStage reads the device from its node's RVR once it is Primary; a path
			// handed through the CO could be stale by then (ControllerPublishVolume).
			r, err := cs.ControllerPublishVolume(ctx, publishReq(va, n1, false))
			if err == nil && len(r.PublishContext) != 0 {
				return errors.New("publish_context " + r.String())
			}
			var rva v1.ReplicatedVolumeAttachment
			must(t, env.Client.Get(ctx, client.ObjectKey{Name: v1.AttachmentName(va, n1)}, &rva))
			if rva.Labels[v1.LabelVolume] != va || rva.Labels[v1.LabelNode] != n1 {
				return errors.New("RVA labels missing")
			}
			if rva.Status.Phase != v1.AttachmentAttached || rva.Status.DevicePath == "" {
				return errors.New("answered before the RVA was Attached with a device: " + rva.Status.DevicePath)
			}
			return err
		}, codes.OK, ""},
		{"Publish: idempotent", func(ctx context.Context) error {
			_, err := cs.ControllerPublishVolume(ctx, publishReq(va, n1, false))
			return err
		}, codes.OK, ""},
		{"Publish: same node, other readonly", func(ctx context.Context) error {
			_, err := cs.ControllerPublishVolume(ctx, publishReq(va, n1, true))
			return err
		}, codes.AlreadyExists, "readonly"},
		{"Publish: second node without multiattach", func(ctx context.Context) error {
			_, err := cs.ControllerPublishVolume(ctx, publishReq(va, n2, false))
			return err
		}, codes.FailedPrecondition, "node_id"},
		{"Publish: RWX on a volume not made for it", func(ctx context.Context) error {
			req := publishReq(va, n2, false)
			req.VolumeCapability = blockCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
			_, err := cs.ControllerPublishVolume(ctx, req)
			return err
		}, codes.FailedPrecondition, "access_mode"},
		{"Publish: RWX block volume on two nodes", func(ctx context.Context) error {
			rwx := blockCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
			if _, err := cs.CreateVolume(ctx, createVol(pfx+"-rwx", r2, 8*mib, rwx)); err != nil {
				return err
			}
			for _, n := range []string{n1, n2} {
				req := publishReq(pfx+"-rwx", n, false)
				req.VolumeCapability = rwx
				if _, err := cs.ControllerPublishVolume(ctx, req); err != nil {
					return err
				}
			}
			_, err := cs.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: pfx + "-rwx"})
			return err
		}, codes.OK, ""},
		{"Delete: refused while published", func(ctx context.Context) error {
			_, err := cs.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: va})
			return err
		}, codes.FailedPrecondition, n1},
		{"GetVolume: published nodes and condition", func(ctx context.Context) error {
			r, err := cs.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: va})
			if err == nil && (strings.Join(r.Status.PublishedNodeIds, ",") != n1 || r.Status.VolumeCondition.Abnormal) {
				return errors.New("got " + r.String())
			}
			return err
		}, codes.OK, ""},
		{"GetVolume: unknown", func(ctx context.Context) error {
			_, err := cs.ControllerGetVolume(ctx, &csipb.ControllerGetVolumeRequest{VolumeId: pfx + "-nope"})
			return err
		}, codes.NotFound, "volume_id"},
		{"Unpublish: detached and gone", func(ctx context.Context) error {
			_, err := cs.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: va, NodeId: n1})
			if err == nil {
				var l v1.ReplicatedVolumeAttachmentList
				must(t, env.Client.List(ctx, &l, client.MatchingLabels{v1.LabelVolume: va}))
				if len(l.Items) != 0 {
					return errors.New("RVA left")
				}
			}
			return err
		}, codes.OK, ""},
		{"Unpublish: idempotent", func(ctx context.Context) error {
			_, err := cs.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: va, NodeId: n1})
			return err
		}, codes.OK, ""},
		{"Unpublish: no volume id", func(ctx context.Context) error {
			_, err := cs.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{NodeId: n1})
			return err
		}, codes.InvalidArgument, "volume_id"},
		{"Expand: grown on every diskful replica", func(ctx context.Context) error {
			r, err := cs.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: va,
				CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 * mib}, VolumeCapability: mountCap("", snw)})
			if err == nil && (r.CapacityBytes != 128*mib || !r.NodeExpansionRequired) {
				return errors.New("got " + r.String())
			}
			return err
		}, codes.OK, ""},
		{"Expand: a smaller size is the current one", func(ctx context.Context) error {
			r, err := cs.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: va,
				CapacityRange: &csipb.CapacityRange{RequiredBytes: 8 * mib}, VolumeCapability: blockCap(snw)})
			if err == nil && (r.CapacityBytes != 128*mib || r.NodeExpansionRequired) {
				return errors.New("got " + r.String())
			}
			return err
		}, codes.OK, ""},
		{"Expand: unknown volume", func(ctx context.Context) error {
			_, err := cs.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: pfx + "-nope",
				CapacityRange: &csipb.CapacityRange{RequiredBytes: 8 * mib}})
			return err
		}, codes.NotFound, "volume_id"},
		{"Expand: no capacity range", func(ctx context.Context) error {
			_, err := cs.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: va})
			return err
		}, codes.InvalidArgument, "capacity_range"},
		{"List: pages of one cover every volume once", func(ctx context.Context) error {
			var got []string
			tok := ""
			for i := 0; i < 1000; i++ {
				r, err := cs.ListVolumes(ctx, &csipb.ListVolumesRequest{MaxEntries: 1, StartingToken: tok})
				if err != nil {
					return err
				}
				for _, e := range r.Entries {
					got = append(got, e.Volume.VolumeId)
				}
				if tok = r.NextToken; tok == "" {
					break
				}
			}
			var l v1.ReplicatedVolumeList
			must(t, env.Client.List(ctx, &l))
			var want []string
			for _, rv := range l.Items {
				want = append(want, rv.Name)
			}
			sort.Strings(want)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				return errors.New("pages gave " + strings.Join(got, ",") + "; want " + strings.Join(want, ","))
			}
			return nil
		}, codes.OK, ""},
		{"List: a token it never gave", func(ctx context.Context) error {
			_, err := cs.ListVolumes(ctx, &csipb.ListVolumesRequest{StartingToken: "invalid-token"})
			return err
		}, codes.Aborted, "starting_token"},
		{"Validate: confirmed", func(ctx context.Context) error {
			r, err := cs.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: va,
				VolumeCapabilities: []*csipb.VolumeCapability{mountCap("xfs", snw)}, Parameters: params(r1)})
			if err == nil && r.Confirmed == nil {
				return errors.New("not confirmed: " + r.Message)
			}
			return err
		}, codes.OK, ""},
		{"Validate: ROX is not confirmed", func(ctx context.Context) error {
			r, err := cs.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: va,
				VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}})
			if err == nil && (r.Confirmed != nil || !strings.Contains(r.Message, "access_mode")) {
				return errors.New("confirmed ROX")
			}
			return err
		}, codes.OK, ""},
		{"Validate: other class is not confirmed", func(ctx context.Context) error {
			r, err := cs.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: va,
				VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", snw)}, Parameters: params(r2)})
			if err == nil && r.Confirmed != nil {
				return errors.New("confirmed another class")
			}
			return err
		}, codes.OK, ""},
		{"Validate: unknown volume", func(ctx context.Context) error {
			_, err := cs.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: pfx + "-nope",
				VolumeCapabilities: []*csipb.VolumeCapability{mountCap("", snw)}})
			return err
		}, codes.NotFound, "volume_id"},
		{"Validate: no capabilities", func(ctx context.Context) error {
			_, err := cs.ValidateVolumeCapabilities(ctx, &csipb.ValidateVolumeCapabilitiesRequest{VolumeId: va})
			return err
		}, codes.InvalidArgument, "volume_capabilities"},
		{"GetCapacity: 2D+1TB is bounded by the second largest node", func(ctx context.Context) error {
			return wantCapacity(ctx, cs, &csipb.GetCapacityRequest{Parameters: params(r2)},
				usable(5*gib), (usable(10*gib)+usable(5*gib)+usable(1*gib))/2)
		}, codes.OK, ""},
		{"GetCapacity: 3D by the smallest", func(ctx context.Context) error {
			return wantCapacity(ctx, cs, &csipb.GetCapacityRequest{Parameters: params(r3)},
				usable(1*gib), (usable(10*gib)+usable(5*gib)+usable(1*gib))/3)
		}, codes.OK, ""},
		{"GetCapacity: Local inside one node's segment", func(ctx context.Context) error {
			return wantCapacity(ctx, cs, &csipb.GetCapacityRequest{Parameters: params(local),
				AccessibleTopology: &csipb.Topology{Segments: map[string]string{v1.TopologyKeyNode: n3}}},
				usable(1*gib), usable(1*gib))
		}, codes.OK, ""},
		{"GetCapacity: no class, nothing to promise", func(ctx context.Context) error {
			return wantCapacity(ctx, cs, &csipb.GetCapacityRequest{}, 0, 0)
		}, codes.OK, ""},
		{"GetCapacity: unknown parameter", func(ctx context.Context) error {
			_, err := cs.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: map[string]string{"pool": "x"}})
			return err
		}, codes.InvalidArgument, `parameters["pool"]`},
		{"Delete: gone, with its replicas", func(ctx context.Context) error {
			_, err := cs.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: va})
			if err == nil {
				var rv v1.ReplicatedVolume
				if err := env.Client.Get(ctx, client.ObjectKey{Name: va}, &rv); err == nil {
					return errors.New("RV still there")
				}
			}
			return err
		}, codes.OK, ""},
		{"Delete: unknown volume succeeds", func(ctx context.Context) error {
			_, err := cs.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: "reallyfakevolumeid"})
			return err
		}, codes.OK, ""},
		{"Delete: no volume id", func(ctx context.Context) error {
			_, err := cs.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{})
			return err
		}, codes.InvalidArgument, "volume_id"},
	}
	runCodeRows(t, rows, 30*time.Second)
	_ = upperID
}

func usable(free int64) int64 { return drbd.UsableBytes(free, v1.DRBDMaxPeers) }

func wantCapacity(ctx context.Context, cs csipb.ControllerClient, req *csipb.GetCapacityRequest, maxVol, avail int64) error {
	r, err := cs.GetCapacity(ctx, req)
	if err != nil {
		return err
	}
	if r.MaximumVolumeSize.GetValue() != maxVol || r.AvailableCapacity != avail {
		return errors.New("got " + r.String())
	}
	return nil
}

func publishReq(vol, node string, ro bool) *csipb.ControllerPublishVolumeRequest {
	return &csipb.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: node, Readonly: ro, VolumeCapability: mountCap("ext4", snw)}
}

func topoNodes(ts []*csipb.Topology) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Segments[v1.TopologyKeyNode])
	}
	sort.Strings(out)
	return out
}

// testenvName is a short unique prefix for this test's objects (node and pool names
// get suffixes, RV names must stay DNS labels of at most 63 characters).
func testenvName(t *testing.T) string {
	return "t" + strings.TrimPrefix(strings.ReplaceAll(time.Now().Format("150405.000000"), ".", ""), "0")
}

var _ = logr.Discard

// claimWithClass creates a claim named name in "default" whose StorageClass (of the
// same name) allows the nodes allowed by topology.meshvol.io/node (none: anywhere),
// and Node objects for nodes labelled as the kubelet labels them from NodeGetInfo.
func claimWithClass(t *testing.T, ctx context.Context, name string, allowed []string, nodes ...string) {
	t.Helper()
	for _, n := range nodes {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{v1.TopologyKeyNode: n, v1.LabelZone: "zone-" + n}}}
		if err := env.Client.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: v1.CSIDriverName}
	if len(allowed) > 0 {
		sc.AllowedTopologies = []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{{Key: v1.TopologyKeyNode, Values: allowed}}}}
	}
	must(t, env.Client.Create(ctx, sc))
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc.Name, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}}}}
	must(t, env.Client.Create(ctx, pvc))
}
