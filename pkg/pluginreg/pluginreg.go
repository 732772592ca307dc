// Package pluginreg registers a CSI driver with the kubelet of its node by
// serving the kubelet's plugin registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1) — the job
// node-driver-registrar does as a sidecar, done in the node plugin's own
// process.
//
// The kubelet watches its plugins_registry directory (by default
// /var/lib/kubelet/plugins_registry). When a socket appears there it calls
// GetInfo on it, learns the driver's name, its CSI endpoint and the CSI
// versions it speaks, calls the driver's NodeGetInfo through that endpoint,
// writes the driver into the node's CSINode object, and reports the outcome
// through NotifyRegistrationStatus. When the socket goes away the kubelet
// deregisters the driver. So the socket must exist exactly as long as the
// CSI endpoint serves: Serve creates it, and removes it when it returns.
package pluginreg

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DefaultDir is the kubelet's plugin registration directory with the
// kubelet's default --root-dir.
const DefaultDir = "/var/lib/kubelet/plugins_registry"

// SupportedVersions are the CSI spec versions the kubelet is told the driver
// speaks. The kubelet's CSI plugin handler accepts any 1.x.
var SupportedVersions = []string{"1.0.0"}

// Options say what to register and where.
type Options struct {
	// Dir is the kubelet's plugins_registry directory (DefaultDir unless the
	// kubelet runs with another --root-dir). It must exist: the kubelet
	// creates it, and a missing directory means the path is wrong.
	Dir string
	// DriverName is the CSI driver's name (the CSIDriver object's name).
	DriverName string
	// Endpoint is the path of the driver's CSI socket as the kubelet sees it
	// (the kubelet dials it; in a container this is the host path).
	Endpoint string
	// OnStatus, if set, is called with each registration status the kubelet
	// reports: registered, or not with the kubelet's reason.
	OnStatus func(registered bool, reason string)
}

// SocketPath is where the registration socket of a driver lives in dir: the
// name node-driver-registrar uses, so tools that look for it find it.
func SocketPath(dir, driverName string) string {
	return filepath.Join(dir, driverName+"-reg.sock")
}

// Server is a running registration server.
type Server struct {
	opts   Options
	path   string
	lis    net.Listener
	grpc   *grpc.Server
	mu     sync.Mutex
	status *registerapi.RegistrationStatus

	registerapi.UnimplementedRegistrationServer
}

// Listen validates opts and creates the registration socket. A stale socket
// left by an earlier process of the same driver is replaced; any other file
// at that path is an error. The kubelet may call the server as soon as the
// socket exists, so call Serve right after.
func Listen(opts Options) (*Server, error) {
	switch {
	case opts.Dir == "":
		return nil, errors.New("pluginreg: Dir (the kubelet's plugins_registry directory) is empty")
	case opts.DriverName == "":
		return nil, errors.New("pluginreg: DriverName is empty")
	case opts.Endpoint == "":
		return nil, errors.New("pluginreg: Endpoint (the CSI socket path) is empty")
	case !filepath.IsAbs(opts.Endpoint):
		return nil, fmt.Errorf("pluginreg: Endpoint %q must be an absolute path: the kubelet dials it from its own working directory", opts.Endpoint)
	}
	if st, err := os.Stat(opts.Dir); err != nil {
		return nil, fmt.Errorf("pluginreg: the kubelet's registration directory: %w (is the kubelet's --root-dir somewhere else?)", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("pluginreg: %s is not a directory", opts.Dir)
	}
	path := SocketPath(opts.Dir, opts.DriverName)
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("pluginreg: %s exists and is not a socket; refusing to replace it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("pluginreg: removing the stale socket: %w", err)
		}
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("pluginreg: %w", err)
	}
	s := &Server{opts: opts, path: path, lis: lis, grpc: grpc.NewServer()}
	registerapi.RegisterRegistrationServer(s.grpc, s)
	return s, nil
}

// Path is the registration socket's path.
func (s *Server) Path() string { return s.path }

// Serve answers the kubelet until ctx ends, then stops and removes the
// socket, which deregisters the driver. It returns nil when ctx ended it.
func (s *Server) Serve(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- s.grpc.Serve(s.lis) }()
	var err error
	select {
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	case err = <-done:
		err = fmt.Errorf("pluginreg: serving %s: %w", s.path, err)
	}
	// grpc closes the listener, and Go's unix listener unlinks its socket
	// on Close; remove it anyway in case the close raced a failure.
	if rmErr := os.Remove(s.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
		err = fmt.Errorf("pluginreg: %w", rmErr)
	}
	return err
}

// Status is the last registration status the kubelet reported: registered
// and the kubelet's error message when not; ok is false before the first
// report.
func (s *Server) Status() (registered bool, reason string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status == nil {
		return false, "", false
	}
	return s.status.PluginRegistered, s.status.Error, true
}

// GetInfo tells the kubelet what the socket registers.
func (s *Server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.opts.DriverName,
		Endpoint:          s.opts.Endpoint,
		SupportedVersions: SupportedVersions,
	}, nil
}

// NotifyRegistrationStatus records the kubelet's verdict. A refusal is not
// fatal here: the kubelet retries when the socket is re-created, and the
// node plugin decides what to do through OnStatus.
func (s *Server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.mu.Lock()
	s.status = st
	s.mu.Unlock()
	if s.opts.OnStatus != nil {
		s.opts.OnStatus(st.PluginRegistered, st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
