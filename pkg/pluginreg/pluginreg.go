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
	"time"

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
	// RetryDelay is how long after a refusal the socket is re-created, which
	// makes the kubelet try again; it doubles up to a minute while the
	// kubelet keeps refusing. Default 1 s.
	RetryDelay time.Duration
}

// SocketPath is where the registration socket of a driver lives in dir: the
// name node-driver-registrar uses, so tools that look for it find it.
func SocketPath(dir, driverName string) string {
	return filepath.Join(dir, driverName+"-reg.sock")
}

// Server is a running registration server.
type Server struct {
	opts    Options
	path    string
	lis     net.Listener
	grpc    *grpc.Server
	refused chan struct{}
	mu      sync.Mutex
	status  *registerapi.RegistrationStatus

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
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = time.Second
	}
	s := &Server{opts: opts, path: path, refused: make(chan struct{}, 1)}
	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) listen() error {
	lis, err := net.Listen("unix", s.path)
	if err != nil {
		return fmt.Errorf("pluginreg: %w", err)
	}
	s.lis, s.grpc = lis, grpc.NewServer()
	registerapi.RegisterRegistrationServer(s.grpc, s)
	return nil
}

// Path is the registration socket's path.
func (s *Server) Path() string { return s.path }

// Serve answers the kubelet until ctx ends, then stops and removes the
// socket, which deregisters the driver. It returns nil when ctx ended it.
//
// A kubelet that refuses the registration (its NodeGetInfo call failed,
// say, because the CSI socket was not serving yet) does not try again on
// its own: it keeps the socket as known and waits for it to change. So
// after a refusal Serve removes the socket and creates it anew after
// RetryDelay (doubling while refusals go on), as node-driver-registrar's
// restart would.
func (s *Server) Serve(ctx context.Context) error {
	delay := s.opts.RetryDelay
	for {
		done := make(chan error, 1)
		go func(g *grpc.Server, l net.Listener) { done <- g.Serve(l) }(s.grpc, s.lis)
		select {
		case <-ctx.Done():
			s.grpc.Stop()
			<-done
			return s.remove(nil)
		case err := <-done:
			return s.remove(fmt.Errorf("pluginreg: serving %s: %w", s.path, err))
		case <-s.refused:
			// Let the kubelet's NotifyRegistrationStatus call return first.
			stopGracefully(s.grpc, time.Second)
			<-done
			if err := s.remove(nil); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Minute)
			if err := s.listen(); err != nil {
				return err
			}
		}
	}
}

// remove deletes the socket, keeping err if there is one.
func (s *Server) remove(err error) error {
	// grpc closes the listener, and Go's unix listener unlinks its socket
	// on Close; remove it anyway in case the close raced a failure.
	if rmErr := os.Remove(s.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
		err = fmt.Errorf("pluginreg: %w", rmErr)
	}
	return err
}

func stopGracefully(g *grpc.Server, timeout time.Duration) {
	stopped := make(chan struct{})
	go func() {
		g.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(timeout):
		g.Stop()
	}
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

// NotifyRegistrationStatus records the kubelet's verdict; after a refusal
// Serve re-creates the socket so the kubelet tries again.
func (s *Server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.mu.Lock()
	s.status = st
	s.mu.Unlock()
	if s.opts.OnStatus != nil {
		s.opts.OnStatus(st.PluginRegistered, st.Error)
	}
	if !st.PluginRegistered {
		select {
		case s.refused <- struct{}{}:
		default:
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
