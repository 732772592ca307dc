package csi

import (
	"context"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// Every instance answers GetPluginCapabilities for the plugin as a whole: the node
// process advertises the controller service too, or a CO that asks the node socket
// (csi-sanity does) skips ControllerPublish before NodeStage.
func TestPluginCapabilitiesSameOnEveryInstance(t *testing.T) {
	r, err := (&Identity{}).GetPluginCapabilities(context.Background(), &csipb.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var svc []csipb.PluginCapability_Service_Type
	online := false
	for _, c := range r.GetCapabilities() {
		if s := c.GetService(); s != nil {
			svc = append(svc, s.GetType())
		}
		if c.GetVolumeExpansion().GetType() == csipb.PluginCapability_VolumeExpansion_ONLINE {
			online = true
		}
	}
	want := []csipb.PluginCapability_Service_Type{csipb.PluginCapability_Service_CONTROLLER_SERVICE,
		csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS}
	if len(svc) != len(want) || svc[0] != want[0] || svc[1] != want[1] || !online {
		t.Fatalf("capabilities %v, online expansion %v; want services %v and online expansion", svc, online, want)
	}
}
