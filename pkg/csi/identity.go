package csi

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/types/known/wrapperspb"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/version"
)

// Identity is the CSI Identity service of either process.
type Identity struct {
	csipb.UnimplementedIdentityServer
	// Ready reports whether the process can serve: the apiserver answers and its
	// caches have synced, and for the node the agent runs. Nil means always ready.
	Ready func(context.Context) error
}

func (i *Identity) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	return &csipb.GetPluginInfoResponse{Name: v1.CSIDriverName, VendorVersion: version.Get().Version}, nil
}

// GetPluginCapabilities answers for the plugin as a whole, the same from the node
// process as from the controller process: the spec asks every instance to return "the
// grand sum of all capabilities of all instances ... regardless of which RPCs an
// instance is serving". A node process that left CONTROLLER_SERVICE out would tell a
// CO (csi-sanity does exactly this) that no ControllerPublish is needed before
// NodeStage, and NodeStage would wait for a Primary that nobody asked for.
func (i *Identity) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	svc := func(t csipb.PluginCapability_Service_Type) *csipb.PluginCapability {
		return &csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: t}}}
	}
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: []*csipb.PluginCapability{
		svc(csipb.PluginCapability_Service_CONTROLLER_SERVICE),
		svc(csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		{Type: &csipb.PluginCapability_VolumeExpansion_{VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{
			Type: csipb.PluginCapability_VolumeExpansion_ONLINE}}},
	}}, nil
}

// Probe answers ready=false (not an error) while a dependency is down: the spec keeps
// errors for a plugin that cannot answer at all, and the CO polls until ready.
func (i *Identity) Probe(ctx context.Context, _ *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	if i.Ready != nil {
		if err := i.Ready(ctx); err != nil {
			return &csipb.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
		}
	}
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
