package pluginreg

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// dialAsKubelet connects to a registration socket the way the kubelet's
// plugin watcher does (gRPC over the unix socket, no TLS).
func dialAsKubelet(t *testing.T, path string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

func TestRegistrationRoundTrip(t *testing.T) {
	dir := t.TempDir()
	var notified []string
	s, err := Listen(Options{
		Dir:        dir,
		DriverName: "csi.meshvol.io",
		Endpoint:   "/var/lib/kubelet/plugins/csi.meshvol.io/csi.sock",
		OnStatus: func(ok bool, reason string) {
			notified = append(notified, map[bool]string{true: "registered", false: "refused: " + reason}[ok])
		},
		RetryDelay: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "csi.meshvol.io-reg.sock"); s.Path() != want {
		t.Fatalf("socket at %s, want %s", s.Path(), want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()

	c := dialAsKubelet(t, s.Path())
	rpcCtx, rpcCancel := context.WithTimeout(ctx, 10*time.Second)
	defer rpcCancel()
	info, err := c.GetInfo(rpcCtx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "csi.meshvol.io" ||
		info.Endpoint != "/var/lib/kubelet/plugins/csi.meshvol.io/csi.sock" ||
		len(info.SupportedVersions) != 1 || !strings.HasPrefix(info.SupportedVersions[0], "1.") {
		t.Fatalf("GetInfo = %+v", info)
	}
	if _, _, ok := s.Status(); ok {
		t.Fatal("Status reports a verdict before the kubelet gave one")
	}
	before, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NotifyRegistrationStatus(rpcCtx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "no NodeGetInfo"}); err != nil {
		t.Fatal(err)
	}
	if reg, reason, ok := s.Status(); !ok || reg || reason != "no NodeGetInfo" {
		t.Fatalf("Status = %v %q %v after a refusal", reg, reason, ok)
	}
	// The kubelet does not retry on its own: the socket must go and come
	// back (a new inode) for it to try again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := os.Stat(s.Path())
		if err == nil && (!os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime())) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket was not re-created after the refusal")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The socket file appears at bind(2), a moment before listen(2): the
	// kubelet's plugin manager dials with grpc.WithBlock, waiting until it
	// connects, so the test waits for the connection the same way.
	c = dialAsKubelet(t, s.Path())
	if _, err := c.GetInfo(rpcCtx, &registerapi.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("GetInfo on the re-created socket: %v", err)
	}
	if _, err := c.NotifyRegistrationStatus(rpcCtx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if reg, _, _ := s.Status(); !reg {
		t.Fatal("Status not registered after the kubelet said so")
	}
	if got := strings.Join(notified, ", "); got != "refused: no NodeGetInfo, registered" {
		t.Fatalf("OnStatus saw %q", got)
	}

	// Stopping removes the socket: that is how the kubelet learns the
	// driver is gone.
	cancel()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(s.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket still there after Serve returned: %v", err)
	}
}

func TestListenReplacesStaleSocketOnly(t *testing.T) {
	dir := t.TempDir()
	path := SocketPath(dir, "d.example.com")
	// A socket nobody serves, as a killed process leaves it.
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	s, err := Listen(Options{Dir: dir, DriverName: "d.example.com", Endpoint: "/x/csi.sock"})
	if err != nil {
		t.Fatalf("a stale socket must be replaced: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Serve(ctx); err != nil {
		t.Fatal(err)
	}

	// A regular file is someone else's: never delete it.
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(Options{Dir: dir, DriverName: "d.example.com", Endpoint: "/x/csi.sock"}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen over a regular file: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "x" {
		t.Fatalf("the regular file was touched: %q %v", b, err)
	}
}

func TestListenRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{DriverName: "d", Endpoint: "/e"}, "Dir"},
		{Options{Dir: dir, Endpoint: "/e"}, "DriverName"},
		{Options{Dir: dir, DriverName: "d"}, "Endpoint"},
		{Options{Dir: dir, DriverName: "d", Endpoint: "csi.sock"}, "absolute"},
		{Options{Dir: filepath.Join(dir, "missing"), DriverName: "d", Endpoint: "/e"}, "--root-dir"},
	} {
		if _, err := Listen(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Listen(%+v) = %v, want an error naming %s", tc.opts, err, tc.want)
		}
	}
}
