package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-logr/logr"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/pluginreg"
)

// serveRegistration registers the node's CSI service with the kubelet
// (pkg/pluginreg) once the CSI socket accepts connections — the kubelet
// calls NodeGetInfo as soon as the registration socket appears — and keeps
// the registration socket until ctx ends. kubeletPath is the CSI socket's
// path as the kubelet sees it (in a container it differs from the
// endpoint this process listens on). An empty dir registers nothing.
func serveRegistration(ctx context.Context, dir, endpoint, kubeletPath string, log logr.Logger) (wait func() error) {
	if dir == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			local := strings.TrimPrefix(endpoint, "unix://")
			if kubeletPath == "" {
				kubeletPath = local
			}
			for {
				c, err := net.DialTimeout("unix", local, time.Second)
				if err == nil {
					c.Close()
					break
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(100 * time.Millisecond):
				}
			}
			s, err := pluginreg.Listen(pluginreg.Options{
				Dir:        dir,
				DriverName: v1.CSIDriverName,
				Endpoint:   kubeletPath,
				OnStatus: func(ok bool, reason string) {
					if ok {
						log.Info("registered with the kubelet", "socket", pluginreg.SocketPath(dir, v1.CSIDriverName))
					} else {
						log.Error(errors.New(reason), "the kubelet refused the registration; trying again")
					}
				},
			})
			if err != nil {
				return err
			}
			return s.Serve(ctx)
		}()
	}()
	return func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("kubelet registration: %w", err)
		}
		return nil
	}
}
