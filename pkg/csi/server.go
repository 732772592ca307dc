package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// Services are what one process serves; Controller or Node may be nil.
type Services struct {
	Identity   csipb.IdentityServer
	Controller csipb.ControllerServer
	Node       csipb.NodeServer
}

// Listen opens the unix socket of endpoint, "unix:///path/csi.sock" or a plain path,
// removing a stale socket file a previous run left behind (never any other kind of
// file).
func Listen(endpoint string) (net.Listener, error) {
	path, err := socketPath(endpoint)
	if err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("csi endpoint %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("csi endpoint %s: removing the stale socket: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("csi endpoint %s: %w", path, err)
	}
	return net.Listen("unix", path)
}

func socketPath(endpoint string) (string, error) {
	p := endpoint
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		p = strings.TrimPrefix(endpoint, "unix://")
	case strings.Contains(endpoint, "://"):
		return "", fmt.Errorf("csi endpoint %q: only unix sockets are served (unix:///path or /path)", endpoint)
	}
	if p == "" || !filepath.IsAbs(p) {
		return "", fmt.Errorf("csi endpoint %q: the socket path must be absolute", endpoint)
	}
	return p, nil
}

// NewServer returns a gRPC server with the services registered and every call logged
// (method, volume, duration, code) at V(1), failures at V(0).
func NewServer(s Services, log logr.Logger) *grpc.Server {
	srv := grpc.NewServer(grpc.UnaryInterceptor(logInterceptor(log)))
	if s.Identity != nil {
		csipb.RegisterIdentityServer(srv, s.Identity)
	}
	if s.Controller != nil {
		csipb.RegisterControllerServer(srv, s.Controller)
	}
	if s.Node != nil {
		csipb.RegisterNodeServer(srv, s.Node)
	}
	return srv
}

// Serve serves s on endpoint until ctx ends, then stops gracefully (in-flight calls
// finish or see their contexts cancelled) and removes the socket. It is what
// `meshvol controller` and `meshvol node` call for --csi-endpoint.
func Serve(ctx context.Context, endpoint string, s Services, log logr.Logger) error {
	lis, err := Listen(endpoint)
	if err != nil {
		return err
	}
	srv := NewServer(s, log)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() { srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			srv.Stop()
		}
	}()
	log.Info("serving CSI", "endpoint", endpoint, "controller", s.Controller != nil, "node", s.Node != nil)
	err = srv.Serve(lis)
	<-done
	if path, perr := socketPath(endpoint); perr == nil {
		_ = os.Remove(path)
	}
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

type volumeIDer interface{ GetVolumeId() string }

func logInterceptor(log logr.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := handler(ctx, req)
		kv := []any{"method", info.FullMethod, "duration", time.Since(start).Round(time.Millisecond)}
		if v, ok := req.(volumeIDer); ok && v.GetVolumeId() != "" {
			kv = append(kv, "volume", v.GetVolumeId())
		}
		if err != nil {
			st, _ := status.FromError(err)
			log.Info("CSI call failed", append(kv, "code", st.Code().String(), "message", st.Message())...)
		} else {
			log.V(1).Info("CSI call", kv...)
		}
		return resp, err
	}
}
