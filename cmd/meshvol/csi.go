package main

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// csiEndpointUsage is the help text of --csi-endpoint on both subcommands.
const csiEndpointUsage = "serve the CSI services on this unix socket (unix:///csi/csi.sock or a path); empty serves none"

// serveCSI runs run in the background when endpoint is set. If the CSI server fails,
// cancel stops the rest of the process too: a plugin without its socket is of no use
// to the kubelet or the sidecars. The returned wait gives the server's error.
func serveCSI(ctx context.Context, cancel context.CancelFunc, endpoint string, run func(context.Context) error) (wait func() error) {
	if endpoint == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		err := run(ctx)
		if err != nil && !errors.Is(err, context.Canceled) {
			cancel()
		} else {
			err = nil
		}
		done <- err
	}()
	return func() error { return <-done }
}

// csiScheme knows the built-in kinds (Leases, Nodes) and meshvol's.
func csiScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1.AddToScheme(s))
	return s
}
