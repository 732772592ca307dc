package csi

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshvol/meshvol/internal/testenv"
)

// One real kube-apiserver for the package: the controller-service tests play the
// controller's part on it, the node-service tests keep their RVRs there.
var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env, testenv.Options{})) }

// serve runs s on a fresh unix socket through Serve and returns a connection to it.
func serve(t *testing.T, s Services) *grpc.ClientConn {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, "unix://"+sock, s, logr.Discard()) }()
	// Serve binds the socket before it listens: until it does, a connection is
	// refused, and the first RPC (not waiting for readiness) would fail with it.
	for i := 0; ; i++ {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			break
		}
		if i == 500 {
			t.Fatalf("Serve does not listen on %s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("Serve left its socket behind: %v", err)
		}
		os.RemoveAll(dir)
	})
	return conn
}

var _ = csipb.NewIdentityClient

// codeRow is one row of an RPC table test: the call, the CSI code it must
// answer with, and a word its message must contain (the field or the cause).
type codeRow struct {
	name  string
	call  func(ctx context.Context) error
	code  codes.Code
	field string
}

// runCodeRows runs each row with its own deadline and checks code and message.
func runCodeRows(t *testing.T, rows []codeRow, timeout time.Duration) {
	t.Helper()
	for _, r := range rows {
		ctx, cancel := withTimeout(timeout)
		start := time.Now()
		err := r.call(ctx)
		cancel()
		if got := status.Code(err); got != r.code {
			t.Fatalf("%s: code %v (%v), want %v", r.name, got, err, r.code)
		}
		if r.field != "" && !strings.Contains(status.Convert(err).Message(), r.field) {
			t.Errorf("%s: message %q does not name %q", r.name, status.Convert(err).Message(), r.field)
		}
		t.Logf("%-70s %v in %v", r.name, r.code, time.Since(start).Round(time.Millisecond))
	}
}
