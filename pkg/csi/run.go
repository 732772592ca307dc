package csi

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// ControllerOptions configure RunController.
type ControllerOptions struct {
	// Endpoint is --csi-endpoint, e.g. unix:///csi/csi.sock.
	Endpoint string
	Config   *rest.Config
	Scheme   *runtime.Scheme
	// Namespace is the controller's namespace (agent Leases live there).
	Namespace string
	Log       logr.Logger
}

// RunController serves the Identity and Controller services until ctx ends. It is
// what `meshvol controller --csi-endpoint` runs beside the controller.
func RunController(ctx context.Context, o ControllerOptions) error {
	cl, err := NewControllerClient(ctx, o.Config, o.Scheme, o.Namespace)
	if err != nil {
		return fmt.Errorf("csi controller service: %w", err)
	}
	ready := apiserverReady(o.Config, cl)
	return Serve(ctx, o.Endpoint, Services{
		Identity:   &Identity{Ready: ready},
		Controller: &Controller{Client: cl, Namespace: o.Namespace},
	}, o.Log.WithName("csi"))
}

// NodeOptions configure RunNode.
type NodeOptions struct {
	Endpoint   string
	Config     *rest.Config
	Scheme     *runtime.Scheme
	NodeName   string
	Zone       string
	MaxVolumes int64
	// AgentReady reports whether the agent of this process runs (its first reconcile
	// done, its Lease renewed); nil means the agent does not say.
	AgentReady func(context.Context) error
	Log        logr.Logger
}

// RunNode serves the Identity and Node services until ctx ends. It is what
// `meshvol node --csi-endpoint` runs beside the agent.
func RunNode(ctx context.Context, o NodeOptions) error {
	if o.NodeName == "" {
		return fmt.Errorf("csi node service: the node name is required")
	}
	cl, err := NewNodeClient(ctx, o.Config, o.Scheme, o.NodeName)
	if err != nil {
		return fmt.Errorf("csi node service: %w", err)
	}
	api := apiserverReady(o.Config, cl)
	ready := func(ctx context.Context) error {
		if err := api(ctx); err != nil {
			return err
		}
		if o.AgentReady != nil {
			return o.AgentReady(ctx)
		}
		return nil
	}
	return Serve(ctx, o.Endpoint, Services{
		Identity: &Identity{Ready: ready},
		Node:     &Node{NodeName: o.NodeName, Zone: o.Zone, MaxVolumes: o.MaxVolumes, Client: cl},
	}, o.Log.WithName("csi"))
}

// apiserverReady: the apiserver answers /readyz and the informers have synced.
func apiserverReady(cfg *rest.Config, cl *CachedClient) func(context.Context) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	return func(ctx context.Context) error {
		if err != nil {
			return err
		}
		if _, err := dc.RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
			return fmt.Errorf("apiserver /readyz: %w", err)
		}
		return cl.Synced(ctx)
	}
}
