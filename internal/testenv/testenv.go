// Package testenv runs a real Kubernetes control plane — kube-apiserver and
// etcd, built from source by hack/build-k8s.sh into bin/k8s — for meshvol's
// integration tests, through controller-runtime's envtest.
//
// One control plane per test package is the intended use; starting one costs
// a few seconds (BenchmarkStartStop measures it), so tests in a package share
// it and keep apart by object names, not by fresh clusters:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env, testenv.Options{})) }
//
//	func TestSomething(t *testing.T) {
//		rv := &v1alpha1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: testenv.Name(t)}}
//		if err := env.Client.Create(ctx, rv); err != nil { ... }
//	}
//
// A test that needs a control plane of its own (to restart it, say) calls
// StartT.
//
// When the binaries are missing, Start fails with an error that says to run
// `make k8s`: an integration test must never pass by not running.
package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	storagev1alpha1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// KubernetesVersion is the kube-apiserver version hack/build-k8s.sh pins.
// The package's own test checks that the binary in bin/k8s reports it, so a
// change of the pin in one place and not the other fails loudly.
const KubernetesVersion = "v1.33.13"

// Options tune Start. The zero value is what most packages want.
type Options struct {
	// CRDDirs are directories of CustomResourceDefinition YAML to install
	// before Start returns (each must exist). Nil means DefaultCRDDirs():
	// meshvol's own CRDs in <repo>/config/crd. An empty, non-nil slice
	// installs none.
	CRDDirs []string

	// BinDir holds kube-apiserver and etcd. Empty means <repo>/bin/k8s.
	BinDir string

	// Scheme is the client's scheme. Nil means Scheme().
	Scheme *runtime.Scheme

	// Log receives one line when the control plane is up, naming the
	// versions it runs and how long it took to start, so test output shows
	// that a real apiserver ran. Nil means os.Stderr.
	Log io.Writer

	// Logger is installed as controller-runtime's logger by Main (Start
	// leaves the process-wide logger alone). The zero Logger means errors
	// only, to stderr: a reconciler's error shows in the test output, its
	// chatter does not. Main must set it because controller-runtime takes
	// only the first logger it is given, and without one it prints a stack
	// trace warning 30 s into every longer test run.
	Logger logr.Logger

	// APIServerArgs are extra kube-apiserver flags (name without dashes →
	// values), set over envtest's defaults; e.g. internal/kubecluster tells the
	// apiserver how to reach real kubelets.
	APIServerArgs map[string][]string

	// AfterTests runs in Main after the package's tests and before the
	// control plane stops: a suite stops there what its tests share (a
	// cluster a `-run` selection started and no test stopped), so nothing
	// outlives the test binary whichever tests ran. Its error fails the run.
	AfterTests func() error
}

// Env is a running control plane and a client for it.
type Env struct {
	// Config reaches the apiserver as a member of system:masters.
	Config *rest.Config
	// Client is a controller-runtime client (no cache) built with Scheme.
	Client client.Client
	// Scheme knows the Kubernetes built-in kinds, CRDs and meshvol's kinds.
	Scheme *runtime.Scheme
	// Version is what the apiserver answered on /version.
	Version *version.Info
	// EtcdVersion is what etcd answered on /version, e.g. "3.5.21".
	EtcdVersion string
	// BinDir is where the binaries came from.
	BinDir string
	// CRDs are the CustomResourceDefinitions Start installed.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// StartDuration is the wall time from launching etcd to the CRDs being
	// served.
	StartDuration time.Duration

	env     *envtest.Environment
	certDir string // the apiserver's certificates (ours to remove)
}

// ErrBinariesMissing is wrapped by Start's error when bin/k8s lacks a
// binary; errors.Is tells a missing build from a failing one.
var ErrBinariesMissing = errors.New("control plane binaries missing")

// Scheme returns a new scheme with the Kubernetes built-in kinds, the
// apiextensions kinds and meshvol's storage.meshvol.io/v1alpha1 kinds.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(storagev1alpha1.AddToScheme(s))
	return s
}

// DefaultCRDDirs returns meshvol's CRD directory, <repo>/config/crd.
func DefaultCRDDirs() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return []string{filepath.Join(root, "config", "crd")}, nil
}

// SnapshotCRDDir returns the directory of the VolumeSnapshot CRDs that
// hack/build-k8s.sh copies from external-snapshotter, for tests that run
// the snapshotter sidecars: add it to Options.CRDDirs.
func SnapshotCRDDir() (string, error) {
	bin, err := DefaultBinDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(bin, "crds"), nil
}

// DefaultBinDir returns <repo>/bin/k8s, where hack/build-k8s.sh puts the
// control plane.
func DefaultBinDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin", "k8s"), nil
}

// RepoRoot walks up from the working directory (a test runs in its package's
// directory) to the first directory holding a go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("testenv: no go.mod in %s or any directory above it", dir)
		}
	}
}

// Start launches etcd and kube-apiserver, installs the CRDs and waits until
// they are served. The caller must Stop the returned Env.
func Start(opts Options) (*Env, error) {
	binDir := opts.BinDir
	if binDir == "" {
		var err error
		if binDir, err = DefaultBinDir(); err != nil {
			return nil, err
		}
	}
	if err := checkBinaries(binDir); err != nil {
		return nil, err
	}
	crdDirs := opts.CRDDirs
	if crdDirs == nil {
		var err error
		if crdDirs, err = DefaultCRDDirs(); err != nil {
			return nil, err
		}
	}
	for _, d := range crdDirs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("testenv: CRD directory %s does not exist: run `make generate` for meshvol's CRDs, `make k8s` for the snapshot CRDs", d)
		}
	}
	scheme := opts.Scheme
	if scheme == nil {
		scheme = Scheme()
	}
	logw := opts.Log
	if logw == nil {
		logw = os.Stderr
	}

	te := &envtest.Environment{
		BinaryAssetsDirectory: binDir,
		CRDDirectoryPaths:     crdDirs,
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
		// envtest's default is 20 s. Starts measured here took up to 15 s
		// while other builds loaded the two cores: leave headroom.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	// The apiserver's certificates live in a directory of ours, not one envtest
	// makes and removes when the apiserver stops: RestartAPIServer starts it again
	// with the same serving certificate, which the clients already trust.
	certDir, err := os.MkdirTemp("", "meshvol-apiserver-")
	if err != nil {
		return nil, fmt.Errorf("testenv: the apiserver's certificate directory: %w", err)
	}
	te.ControlPlane.GetAPIServer().CertDir = certDir
	if len(opts.APIServerArgs) > 0 {
		args := te.ControlPlane.GetAPIServer().Configure()
		for name, values := range opts.APIServerArgs {
			args.Set(name, values...)
		}
	}
	began := time.Now()
	cfg, err := te.Start()
	if err != nil {
		// Start can fail after launching etcd or the apiserver; do not leave
		// them running behind a failed test.
		if stopErr := te.Stop(); stopErr != nil {
			err = fmt.Errorf("%w (and stopping what had started: %v)", err, stopErr)
		}
		_ = os.RemoveAll(certDir)
		return nil, fmt.Errorf("testenv: starting the control plane from %s: %w", binDir, err)
	}
	env := &Env{
		certDir:       certDir,
		Config:        cfg,
		Scheme:        scheme,
		BinDir:        binDir,
		CRDs:          te.CRDs,
		StartDuration: time.Since(began),
		env:           te,
	}
	if err := env.connect(); err != nil {
		_ = te.Stop()
		_ = os.RemoveAll(certDir)
		return nil, err
	}
	fmt.Fprintf(logw, "testenv: kube-apiserver %s (%s, %s) and etcd %s from %s; %d CRDs installed; started in %s\n",
		env.Version.GitVersion, env.Version.Platform, env.Version.GoVersion, env.EtcdVersion,
		binDir, len(env.CRDs), env.StartDuration.Round(time.Millisecond))
	return env, nil
}

// connect builds the client and asks both servers who they are.
func (e *Env) connect() error {
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("testenv: discovery client: %w", err)
	}
	if e.Version, err = dc.ServerVersion(); err != nil {
		return fmt.Errorf("testenv: asking the apiserver for /version: %w", err)
	}
	if e.EtcdVersion, err = etcdVersion(e.env.ControlPlane.Etcd.URL.String()); err != nil {
		return err
	}
	if e.Client, err = client.New(e.Config, client.Options{Scheme: e.Scheme}); err != nil {
		return fmt.Errorf("testenv: client: %w", err)
	}
	return nil
}

// KubeConfig returns a kubeconfig for a new user of the apiserver,
// authenticated by a client certificate with that name and those groups
// (system:masters for a component that may do anything).
func (e *Env) KubeConfig(name string, groups ...string) ([]byte, error) {
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("testenv: adding user %s: %w", name, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("testenv: kubeconfig for %s: %w", name, err)
	}
	return b, nil
}

// CertDir is the apiserver's certificate directory (its serving
// certificate, the CA that signs its clients' certificates, the service
// account keys).
func (e *Env) CertDir() string { return e.env.ControlPlane.APIServer.CertDir }

// RestartAPIServer stops the kube-apiserver, waits down, and starts it again on the
// same address, over the same etcd: every object stays, every watch breaks, and the
// clients made from Config (its CA and client certificates are kept) reconnect on their
// own — what an apiserver upgrade or crash does to meshvol's controller and agents.
//
// On a loaded machine the apiserver's graceful stop (draining its watches) can outlast
// the stop timeout; envtest then kills it and reports the timeout. That is still a
// restart, a crash rather than a clean stop: once its port is closed it starts again.
func (e *Env) RestartAPIServer(down time.Duration) error {
	as := e.env.ControlPlane.APIServer
	if err := as.Stop(); err != nil {
		if !strings.Contains(err.Error(), "timeout waiting for process") {
			return fmt.Errorf("testenv: stopping the apiserver: %w", err)
		}
		if err := waitPortClosed(as.SecureServing.ListenAddr.HostPort(), 30*time.Second); err != nil {
			return fmt.Errorf("testenv: the apiserver did not stop in time and, killed, %w", err)
		}
	}
	time.Sleep(down)
	if err := as.Start(); err != nil {
		return fmt.Errorf("testenv: starting the apiserver again: %w", err)
	}
	return nil
}

// waitPortClosed waits until nothing accepts connections on addr any more.
func waitPortClosed(addr string, d time.Duration) error {
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return nil
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			return fmt.Errorf("still listens on %s %s later", addr, d)
		}
	}
}

// Stop stops the apiserver and etcd and removes etcd's data directory.
func (e *Env) Stop() error {
	if e == nil || e.env == nil {
		return nil
	}
	err := e.env.Stop()
	e.env = nil
	if rmErr := os.RemoveAll(e.certDir); err == nil && rmErr != nil {
		err = rmErr
	}
	if err != nil {
		return fmt.Errorf("testenv: stopping the control plane: %w", err)
	}
	return nil
}

// Main is TestMain for a package whose tests share one control plane: it
// starts it, stores it in *env, runs the tests, stops it and returns the exit
// code for os.Exit. If the control plane cannot start, no test runs and the
// package fails with the reason (for missing binaries: run `make k8s`).
//
// `go test -list` only lists tests, so Main starts nothing for it (the fuzz
// target discovery of `make fuzz` relies on that).
func Main(m *testing.M, env **Env, opts Options) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	logger := opts.Logger
	if logger.GetSink() == nil {
		logger = logr.New(errorsOnly{funcr.New(func(prefix, args string) {
			fmt.Fprintln(os.Stderr, prefix, args)
		}, funcr.Options{}).GetSink()})
	}
	ctrllog.SetLogger(logger)
	e, err := Start(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		return 1
	}
	*env = e
	code := m.Run()
	if opts.AfterTests != nil {
		if err := opts.AfterTests(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
			code = max(code, 1)
		}
	}
	if err := e.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// StartT starts a control plane owned by one test and stops it when the test
// ends. Failing to start fails the test.
func StartT(tb testing.TB, opts Options) *Env {
	tb.Helper()
	// Buffer the start line and hand it to tb.Log from here, so the test
	// log names the caller rather than a line in package fmt.
	var line strings.Builder
	if opts.Log == nil {
		opts.Log = &line
	}
	e, err := Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	if line.Len() > 0 {
		tb.Log(strings.TrimSuffix(line.String(), "\n"))
	}
	tb.Cleanup(func() {
		if err := e.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return e
}

// Name returns a name for a cluster-scoped object, unique to the test (all of
// meshvol's kinds are cluster-scoped, so tests sharing a control plane are
// kept apart by names): the test name lowered to a DNS label, with a suffix
// from the clock so that -count=N runs do not collide.
func Name(tb testing.TB) string {
	n := strings.ToLower(tb.Name())
	n = nonDNS.ReplaceAllString(n, "-")
	n = strings.Trim(n, "-")
	suffix := fmt.Sprintf("-%x", time.Now().UnixNano()&0xffffffffff)
	if limit := 63 - len(suffix); len(n) > limit {
		n = strings.TrimRight(n[:limit], "-")
	}
	return n + suffix
}

var nonDNS = regexp.MustCompile(`[^a-z0-9]+`)

// checkBinaries fails with ErrBinariesMissing, and the command that fixes it,
// when the control plane has not been built.
func checkBinaries(binDir string) error {
	// envtest takes these over the directory it is given; a stale value from
	// another project would silently run other binaries than the ones named
	// in the log line.
	for _, v := range []string{"KUBEBUILDER_ASSETS", "TEST_ASSET_KUBE_APISERVER", "TEST_ASSET_ETCD"} {
		if val, ok := os.LookupEnv(v); ok {
			return fmt.Errorf("testenv: %s=%q is set; it would override the control plane in %s: unset it", v, val, binDir)
		}
	}
	var missing []string
	for _, name := range []string{"kube-apiserver", "etcd"} {
		st, err := os.Stat(filepath.Join(binDir, name))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("testenv: %s not found in %s: run `make k8s` (hack/build-k8s.sh) to build the Kubernetes control plane: %w",
			strings.Join(missing, " and "), binDir, ErrBinariesMissing)
	}
	return nil
}

// etcdVersion asks etcd's client URL for its version.
func etcdVersion(base string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/version", nil)
	if err != nil {
		return "", fmt.Errorf("testenv: etcd version request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("testenv: asking etcd for /version: %w", err)
	}
	defer resp.Body.Close()
	var v struct {
		Server string `json:"etcdserver"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", fmt.Errorf("testenv: decoding etcd's /version: %w", err)
	}
	if v.Server == "" {
		return "", errors.New("testenv: etcd's /version has no etcdserver field")
	}
	return v.Server, nil
}

// errorsOnly passes a sink's Error calls and drops its Info calls.
type errorsOnly struct{ logr.LogSink }

func (errorsOnly) Enabled(int) bool { return false }

func (s errorsOnly) WithValues(kv ...any) logr.LogSink {
	return errorsOnly{s.LogSink.WithValues(kv...)}
}

func (s errorsOnly) WithName(name string) logr.LogSink {
	return errorsOnly{s.LogSink.WithName(name)}
}
