package localcluster

import (
	"context"
	"time"

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

// ElectedController is the ControllerFunc of a controller that takes part in leader
// election (Options.ControllerReplicas of them run side by side, one leads), with the
// election's Lease timed by leaseDuration (renewal deadline two thirds of it, retries
// a fifth). A stopped instance keeps its Lease, as a crashed leader does: the next
// leader takes over once it expires (Cluster.KillLeader).
func ElectedController(opts controller.Options, leaseDuration time.Duration) ControllerFunc {
	return func(ctx context.Context, cfg *rest.Config) error {
		mgr, err := controller.NewManager(cfg, opts, controller.ManagerOptions{
			LeaderElection: true, LeaseDuration: leaseDuration,
			RenewDeadline: leaseDuration * 2 / 3, RetryPeriod: leaseDuration / 5, KeepLeaseOnStop: true,
		})
		if err != nil {
			return err
		}
		if r, ok := ctx.Value(replicaKey{}).(*controllerReplica); ok {
			go func() {
				select {
				case <-mgr.Elected():
					r.elected.Store(true)
				case <-ctx.Done():
				}
			}()
		}
		return mgr.Start(ctx)
	}
}
