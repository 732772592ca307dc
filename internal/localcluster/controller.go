package localcluster

import (
	"context"

	"k8s.io/client-go/rest"

	"github.com/meshvol/meshvol/pkg/controller"
)

// Controller is the ControllerFunc that runs meshvol's controller
// (pkg/controller) with opts, as `meshvol controller` does, without leader
// election, metrics or probes.
func Controller(opts controller.Options) ControllerFunc {
	return func(ctx context.Context, cfg *rest.Config) error {
		mgr, err := controller.NewManager(cfg, opts, controller.ManagerOptions{})
		if err != nil {
			return err
		}
		return mgr.Start(ctx)
	}
}
