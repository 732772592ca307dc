package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/crdschema"
	"github.com/meshvol/meshvol/pkg/csi"
	"github.com/meshvol/meshvol/pkg/datamesh"
	"github.com/meshvol/meshvol/pkg/version"
)

const controllerUsage = `usage: meshvol controller [flags]

Runs the meshvol control plane: the volume, storage pool and node lifecycle
reconcilers (pkg/controller). One instance is active at a time (leader election on a
Lease); it needs the meshvol CRDs (config/crd) installed and exits non-zero, saying
why, when they are missing, lack a field this version writes (CRDs of an earlier
version: helm upgrade leaves them alone; docs/install.md, "Upgrading") or the
apiserver cannot be reached.

flags:
`

// controllerFlags are the subcommand's settings.
type controllerFlags struct {
	kubeconfig  string
	namespace   string
	metricsAddr string
	probeAddr   string
	pprofAddr   string
	leaderElect bool
	// The leader election's timing (controller.ManagerOptions).
	leaseDuration, renewDeadline, retryPeriod time.Duration
	leaderID                                  string
	grace                                     time.Duration
	portRange                                 string
	minorRange                                string
	hmac                                      string
	taintLostNodes                            bool
	deleteLostPods                            bool
	workers                                   int
	shadowDiskful                             bool
	startTimeout                              time.Duration
	verbosity                                 int
	csiEndpoint                               string
	// The client-side rate limit of each kind's API client (kubeAPIQPS).
	kubeAPIQPS   float64
	kubeAPIBurst int
}

// The controller's client-side rate limit, per kind of object (controller-runtime
// gives each kind a client of its own, each with this limit). The other
// subcommands keep apiQPS: an agent writes for its node's replicas only, and the
// CSI node service for its node's mounts. At apiQPS the controller set the pace of
// forming and deleting volumes past a few hundred at once: a 3D formation is 3
// writes of its RV and 3 of replicas, so 50 a second bounded 1,000 volumes to a
// minute and 2,000 deletes (2 RV writes each) to 80 s, while the apiserver had
// CPU to spare (docs/scale.md, "Fifth pass"). The apiserver's own priority and
// fairness shares its capacity among clients; this limit only stops a runaway
// loop, at 4 times the old one.
const (
	controllerQPS   = 200
	controllerBurst = 400
)

// defaultWorkers: volumes reconciled at once. Each reconcile mostly waits on the
// apiserver, and four at a time left the cores idle when thousands of volumes changed
// at once: 2,000 3D volumes were deleted in 48.3 s with 16 against 60.3 s with 4, and
// 10,000 formed in 384 s against 433 s with the controller's memory as before
// (docs/scale.md, "Tenth pass").
const defaultWorkers = 16

func newControllerFlagSet(stderr io.Writer) (*flag.FlagSet, *controllerFlags) {
	f := &controllerFlags{}
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = v1.DefaultNamespace
	}
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"),
		"path to a kubeconfig; empty means the in-cluster service account (default $KUBECONFIG)")
	fs.StringVar(&f.namespace, "namespace", ns,
		"namespace of the per-volume DRBD Secrets, the agents' Leases and the leader-election Lease; $POD_NAMESPACE sets the default when present")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080",
		"address of the Prometheus /metrics endpoint (meshvol_controller_* and controller-runtime's reconcile metrics); \"0\" turns it off")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081",
		"address of /healthz (the process is alive) and /readyz (its caches are synced); empty turns them off")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "",
		"address of Go's /debug/pprof/ profiles (CPU, goroutines, blocking and lock contention) for finding where time goes (docs/scale.md); empty, the default, turns it off")
	fs.BoolVar(&f.leaderElect, "leader-elect", true,
		"elect one active controller through a coordination.k8s.io Lease; turn off only when a single replica runs")
	fs.StringVar(&f.leaderID, "leader-election-id", controller.LeaderElectionID, "name of the leader-election Lease")
	fs.DurationVar(&f.leaseDuration, "leader-election-lease-duration", 15*time.Second,
		"how long the leader-election Lease lasts: a replica takes over at most this plus the retry period after the leader's last renewal (its node crashed)")
	fs.DurationVar(&f.renewDeadline, "leader-election-renew-deadline", 10*time.Second,
		"how long the leader keeps trying to renew before it stops leading (less than the lease duration)")
	fs.DurationVar(&f.retryPeriod, "leader-election-retry-period", 2*time.Second,
		"how often the leader renews and the other replicas try to take over")
	fs.DurationVar(&f.grace, "agent-grace-period", 10*time.Second,
		"how long past its expiry a node agent's Lease may go unrenewed before the node's replicas are marked AgentReady=False and, when no live peer reaches them, force-removed and replaced")
	fs.StringVar(&f.portRange, "port-range", "7000-7999", "DRBD TCP ports, LOW-HIGH, one per replica, unique on its node: the most replicas a node holds")
	fs.StringVar(&f.minorRange, "minor-range", "1000-1048575", "DRBD device minors, LOW-HIGH (within 0-1048575), one per volume, unique in the cluster")
	fs.StringVar(&f.hmac, "hmac-algorithms", "sha256,sha1,md5",
		"DRBD cram-hmac-alg preference list; a volume gets the first its pool's nodes offer (their agents report what the kernel has)")
	fs.BoolVar(&f.taintLostNodes, "taint-lost-nodes", false,
		"taint a node meshvol decided is lost with node.kubernetes.io/out-of-service=nodeshutdown:NoExecute, so Kubernetes moves its pods and detaches its volumes, and remove the taint when the node is back and clean (docs/controller.md, --taint-lost-nodes: read the safety argument first)")
	fs.BoolVar(&f.deleteLostPods, "delete-lost-pods", false,
		"on a node meshvol decided is lost, force-delete the pods that use meshvol volumes and the node's meshvol VolumeAttachments once every such volume's surviving replicas hold quorum without the node, so the pods start elsewhere at once (docs/controller.md, --delete-lost-pods: the safety argument)")
	fs.Float64Var(&f.kubeAPIQPS, "kube-api-qps", controllerQPS,
		"client-side limit of requests per second to the apiserver, for each kind of object (the apiserver's priority and fairness shares it among clients)")
	fs.IntVar(&f.kubeAPIBurst, "kube-api-burst", controllerBurst, "requests of one kind sent at once before --kube-api-qps applies")
	fs.IntVar(&f.workers, "workers", defaultWorkers, "volumes reconciled at once (each mostly waits on the apiserver; the datamesh engine keeps nothing between calls)")
	fs.BoolVar(&f.shadowDiskful, "shadow-diskful", false,
		"the cluster's DRBD has the non-voting disk option (ShadowDiskful replicas); upstream DRBD 9.2 does not")
	fs.DurationVar(&f.startTimeout, "start-timeout", 30*time.Second,
		"how long to try reaching the apiserver and finding the CRDs at start before giving up")
	fs.IntVar(&f.verbosity, "v", 0, "log verbosity: 0 logs what changed (placements, phase changes, errors), higher adds reconcile detail; logs are JSON lines on stderr")
	fs.StringVar(&f.csiEndpoint, "csi-endpoint", "", csiEndpointUsage+" (the CSI controller service runs on every replica, leader or not)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), controllerUsage)
		fs.PrintDefaults()
	}
	return fs, f
}

func parseRange(name, s string) (int32, int32, error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseInt(lo, 10, 32)
	b, err2 := strconv.ParseInt(hi, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("--%s %q: must be LOW-HIGH, two numbers", name, s)
	}
	return int32(a), int32(b), nil
}

func (f *controllerFlags) options() (controller.Options, error) {
	o := controller.Options{
		Namespace: f.namespace, AgentGracePeriod: f.grace, TaintLostNodes: f.taintLostNodes, DeleteLostPods: f.deleteLostPods, Workers: f.workers,
		Features: datamesh.Features{ShadowDiskful: f.shadowDiskful},
	}
	var err error
	if o.PortMin, o.PortMax, err = parseRange("port-range", f.portRange); err != nil {
		return o, err
	}
	if o.MinorMin, o.MinorMax, err = parseRange("minor-range", f.minorRange); err != nil {
		return o, err
	}
	for _, a := range strings.Split(f.hmac, ",") {
		if a = strings.TrimSpace(a); a != "" {
			o.HMACAlgorithms = append(o.HMACAlgorithms, a)
		}
	}
	if f.grace <= 0 {
		return o, fmt.Errorf("--agent-grace-period %s: must be positive", f.grace)
	}
	if f.kubeAPIQPS <= 0 {
		return o, fmt.Errorf("--kube-api-qps %g: must be positive", f.kubeAPIQPS)
	}
	if f.kubeAPIBurst < 1 {
		return o, fmt.Errorf("--kube-api-burst %d: must be at least 1", f.kubeAPIBurst)
	}
	if f.workers < 1 {
		return o, fmt.Errorf("--workers %d: must be at least 1", f.workers)
	}
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o, nil
}

// runController runs `meshvol controller` until ctx ends; it returns the exit code.
func runController(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, f := newControllerFlagSet(stderr)
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "meshvol controller: unexpected arguments %q\n", fs.Args())
		return 2
	}
	opts, err := f.options()
	if err != nil {
		fmt.Fprintf(stderr, "meshvol controller: %v\n", err)
		return 2
	}
	ctrl.SetLogger(jsonLogger(stderr, f.verbosity))
	log := ctrl.Log.WithName("meshvol-controller")
	applyMemoryLimit(log)

	cfg, err := restConfig(f.kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "meshvol controller: %v\n", err)
		return 1
	}
	cfg.QPS, cfg.Burst = float32(f.kubeAPIQPS), f.kubeAPIBurst
	if err := preflight(ctx, cfg, f.startTimeout); err != nil {
		fmt.Fprintf(stderr, "meshvol controller: %v\n", err)
		return 1
	}
	mgr, err := controller.NewManager(cfg, opts, controller.ManagerOptions{
		MetricsAddr: f.metricsAddr, ProbeAddr: f.probeAddr, PprofAddr: f.pprofAddr, LeaderElection: f.leaderElect, LeaderElectionID: f.leaderID,
		LeaseDuration: f.leaseDuration, RenewDeadline: f.renewDeadline, RetryPeriod: f.retryPeriod,
	})
	if err != nil {
		fmt.Fprintf(stderr, "meshvol controller: setting up: %v\n", err)
		return 1
	}
	log.Info("starting", "version", version.Get().Version, "namespace", opts.Namespace, "leaderElection", f.leaderElect,
		"agentGracePeriod", opts.AgentGracePeriod.String(), "taintLostNodes", opts.TaintLostNodes)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitCSI := serveCSI(ctx, cancel, f.csiEndpoint, func(ctx context.Context) error {
		return csi.RunController(ctx, csi.ControllerOptions{Endpoint: f.csiEndpoint, Config: cfg, Scheme: csiScheme(),
			Namespace: opts.Namespace, Log: log})
	})
	err = mgr.Start(ctx)
	cancel()
	if cerr := waitCSI(); cerr != nil {
		fmt.Fprintf(stderr, "meshvol controller: %v\n", cerr)
		return 1
	}
	if err != nil {
		fmt.Fprintf(stderr, "meshvol controller: %v\n", err)
		return 1
	}
	return 0
}

// jsonLogger writes structured logs as one JSON object per line (logr's funcr: no
// logging library beyond logr itself).
func jsonLogger(w io.Writer, verbosity int) logr.Logger {
	return funcr.NewJSON(func(obj string) { fmt.Fprintln(w, obj) }, funcr.Options{
		LogTimestamp: true, TimestampFormat: time.RFC3339Nano, Verbosity: verbosity, LogCaller: funcr.Error,
	})
}

// preflight checks, until timeout, that the apiserver answers and serves meshvol's
// kinds, and that their installed CRDs keep every field of this version's
// (controller.CheckCRDs): a controller that cannot work, or would write fields the
// apiserver drops, says so and exits instead of logging watch errors for ever.
func preflight(ctx context.Context, cfg *rest.Config, timeout time.Duration) error {
	c := rest.CopyConfig(cfg)
	c.Timeout = 5 * time.Second
	dc, err := discovery.NewDiscoveryClientForConfig(c)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	want := []string{"replicatedvolumes", "replicatedvolumereplicas", "replicatedvolumeattachments", "replicatedstorageclasses", "replicatedstoragepools", "replicatedvolumesnapshots"}
	for {
		var last error
		if _, err := dc.ServerVersion(); err != nil {
			last = fmt.Errorf("cannot reach the apiserver at %s: %v", cfg.Host, err)
		} else if list, err := dc.ServerResourcesForGroupVersion(v1.SchemeGroupVersion.String()); err != nil {
			last = fmt.Errorf("the apiserver at %s does not serve %s (%v): install meshvol's CRDs first (kubectl apply -f config/crd)", cfg.Host, v1.SchemeGroupVersion, err)
		} else {
			var missing []string
			for _, w := range want {
				found := false
				for _, r := range list.APIResources {
					found = found || r.Name == w
				}
				if !found {
					missing = append(missing, w)
				}
			}
			if len(missing) > 0 {
				last = fmt.Errorf("the apiserver at %s lacks the CRDs for %s in %s: install them (kubectl apply -f config/crd)", cfg.Host, strings.Join(missing, ", "), v1.SchemeGroupVersion)
			} else if last = checkCRDs(ctx, c); last == nil || crdschema.IsStale(last) {
				// Before the CSI service serves a call or the manager starts: an earlier
				// CRD would drop fields of the objects either writes. A stale CRD is
				// final (it waits for a person to apply this version's); a failed read
				// is tried again.
				return last
			}
		}
		if time.Now().After(deadline) {
			return last
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(time.Second):
		}
	}
}

// checkCRDs runs controller.CheckCRDs with a client of cfg's.
func checkCRDs(ctx context.Context, cfg *rest.Config) error {
	cl, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	return controller.CheckCRDs(ctx, cl)
}
