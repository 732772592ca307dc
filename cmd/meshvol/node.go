package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/agent"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/csi"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/nodecheck"
	"github.com/meshvol/meshvol/pkg/pluginreg"
	"github.com/meshvol/meshvol/pkg/storage"
	"github.com/meshvol/meshvol/pkg/storage/file"
	"github.com/meshvol/meshvol/pkg/storage/lvm"
	"github.com/meshvol/meshvol/pkg/version"
)

// addrList is a repeatable --address flag.
type addrList []netip.Addr

func (a *addrList) String() string { return fmt.Sprint(*a) }
func (a *addrList) Set(s string) error {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return fmt.Errorf("--address %q: %w", s, err)
	}
	*a = append(*a, ip)
	return nil
}

// runNode is `meshvol node`: the node agent of one node (and, with the CSI
// issue, the CSI node service in the same process).
func runNode(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "this node's Kubernetes name (default $NODE_NAME); replicas with spec.nodeName equal to it are this agent's")
	var addrs addrList
	fs.Var(&addrs, "address", "a DRBD replication address of this node (repeat for IPv4 and IPv6); default: the Node's InternalIP addresses")
	zone := fs.String("zone", "", "the node's zone; default: the Node's "+v1.LabelZone+" label")
	namespace := fs.String("namespace", envOr("POD_NAMESPACE", v1.DefaultNamespace), "namespace of the per-volume Secrets and the agents' Leases (default $POD_NAMESPACE)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file; empty: in-cluster configuration")
	confDir := fs.String("drbd-conf-dir", "/var/lib/meshvol/drbd.d", "where the agent writes one <volume>.res per DRBD resource")
	cmdTimeout := fs.Duration("command-timeout", 30*time.Second, "deadline of every DRBD command but create-md and resize; a command that hangs past it becomes a condition")
	slowTimeout := fs.Duration("slow-command-timeout", 5*time.Minute, "deadline of DRBD's create-md and resize, whose time grows with the device; at least --command-timeout")
	metrics := fs.String("metrics-bind-address", ":9501", `Prometheus metrics endpoint; "0" disables it`)
	pprofAddr := fs.String("pprof-bind-address", "", "address of Go's /debug/pprof/ profiles (CPU, heap, goroutines) for finding where an agent's time and memory go (docs/scale.md); empty, the default, turns it off")
	verbose := fs.Int("v", 0, "log verbosity")
	csiEndpoint := fs.String("csi-endpoint", "", csiEndpointUsage)
	regDir := fs.String("kubelet-registration-dir", "", "register the CSI node service with the kubelet through a socket in this directory (the kubelet's <root-dir>/plugins_registry, e.g. "+pluginreg.DefaultDir+"), as node-driver-registrar would; needs --csi-endpoint; empty registers nothing")
	regPath := fs.String("kubelet-csi-path", "", "the CSI socket's path as the kubelet sees it, when it differs from --csi-endpoint's (in a container); default --csi-endpoint's path")
	leaseDuration := fs.Duration("lease-duration", 10*time.Second,
		"how long the node's agent Lease is valid after each renewal, in whole seconds; the controller's --agent-grace-period adds to it before the node is lost (docs/controller.md, \"Detection\")")
	renewInterval := fs.Duration("lease-renew-interval", 3*time.Second, "how often the agent renews its Lease; at most half of --lease-duration, so one failed renewal does not expire it")
	maxVolumes := fs.Int64("max-volumes", 0, "max_volumes_per_node the CSI node service reports; 0 leaves the limit to Kubernetes")
	checkEvery := fs.Duration("prerequisite-check-interval", time.Minute, "how often the agent checks this node's prerequisites again (the DRBD module, drbd-utils, device-mapper, mkfs; docs/install.md), so that one installed later is picked up without a restart")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: meshvol node [flags]\n\nRuns the node agent: renders each volume's datamesh into DRBD on this node, reports\nwhat the kernel runs in ReplicatedVolumeReplica status, renews the node's Lease.\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *nodeName == "" {
		fmt.Fprintln(stderr, "meshvol node: --node-name (or $NODE_NAME) is required")
		return 2
	}
	if *regDir != "" && *csiEndpoint == "" {
		fmt.Fprintln(stderr, "meshvol node: --kubelet-registration-dir registers the CSI node service: it needs --csi-endpoint")
		return 2
	}
	if *leaseDuration < time.Second || *leaseDuration%time.Second != 0 || *renewInterval <= 0 || 2**renewInterval > *leaseDuration {
		fmt.Fprintf(stderr, "meshvol node: --lease-duration %s, --lease-renew-interval %s: the duration must be whole seconds (a Lease holds seconds) and the interval positive and at most half of it\n", *leaseDuration, *renewInterval)
		return 2
	}
	if *slowTimeout < *cmdTimeout {
		fmt.Fprintf(stderr, "meshvol node: --slow-command-timeout %s: must be at least --command-timeout (%s)\n", *slowTimeout, *cmdTimeout)
		return 2
	}
	if *checkEvery <= 0 {
		fmt.Fprintf(stderr, "meshvol node: --prerequisite-check-interval %s: must be positive\n", *checkEvery)
		return 2
	}
	log := funcr.New(func(prefix, args string) { fmt.Fprintln(stderr, prefix, args) }, funcr.Options{Verbosity: *verbose})
	applyMemoryLimit(log)

	restCfg, err := restConfig(*kubeconfig)
	if err != nil {
		fmt.Fprintf(stderr, "meshvol node: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1.AddToScheme(scheme))
	if len(addrs) == 0 || *zone == "" {
		if err := nodeFacts(ctx, restCfg, *nodeName, &addrs, zone); err != nil {
			fmt.Fprintf(stderr, "meshvol node: %v\n", err)
			return 1
		}
	}
	drbdLog := driverLog(log)
	exec := drbd.NewExecDriver(drbd.ExecConfig{NodeName: *nodeName, ConfDir: *confDir, Timeout: *cmdTimeout, SlowTimeout: *slowTimeout, Log: drbdLog})
	features, err := exec.ProbeFeatures(ctx)
	if err != nil {
		log.Error(err, "probing DRBD features; assuming upstream DRBD 9.2")
	}
	exec = drbd.NewExecDriver(drbd.ExecConfig{NodeName: *nodeName, ConfDir: *confDir, Timeout: *cmdTimeout, SlowTimeout: *slowTimeout, Features: features, Log: drbdLog})
	hmac, verify := kernelAlgorithms("/proc/crypto")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitCSI := serveCSI(ctx, cancel, *csiEndpoint, func(ctx context.Context) error {
		return csi.RunNode(ctx, csi.NodeOptions{Endpoint: *csiEndpoint, Config: restCfg, Scheme: scheme,
			NodeName: *nodeName, Zone: *zone, MaxVolumes: *maxVolumes, Log: logr.New(log.GetSink())})
	})
	waitReg := serveRegistration(ctx, *regDir, *csiEndpoint, *regPath, logr.New(log.GetSink()))
	err = agent.Run(ctx, restCfg, scheme, agent.Config{
		NodeName:           *nodeName,
		Zone:               *zone,
		Addresses:          addrs,
		Namespace:          *namespace,
		Driver:             exec,
		Features:           features,
		Pools:              nodePools(*nodeName),
		Prerequisites:      prerequisites(logr.New(log.GetSink()), *checkEvery),
		HMACAlgorithms:     hmac,
		VerifyAlgorithms:   verify,
		Version:            version.Get().Version,
		CommandTimeout:     *cmdTimeout,
		SlowCommandTimeout: *slowTimeout,
		LeaseDuration:      *leaseDuration,
		RenewInterval:      *renewInterval,
		MetricsAddr:        *metrics,
		PprofAddr:          *pprofAddr,
		Log:                logr.New(log.GetSink()),
	})
	cancel()
	if cerr := errors.Join(waitCSI(), waitReg()); cerr != nil {
		fmt.Fprintf(stderr, "meshvol node: %v\n", cerr)
		return 1
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "meshvol node: %v\n", err)
		return 1
	}
	return 0
}

// prerequisites returns the agent's check of this node's prerequisites
// (pkg/nodecheck) for the kinds of pool it serves: it runs at most once per
// interval (--prerequisite-check-interval, a minute by default), and at once when those kinds change, logs each finding that fails, and returns
// the failed ones for the Lease, where the controller reads them. A missing
// prerequisite never stops the agent: a module loaded later is picked up.
// A check that ran out of its time proves nothing missing: on a starved node
// `drbdadm --version` was killed after 10 s and reported as "drbd-utils
// failed", which kept the node from taking replicas for a minute. Its
// findings are dropped, the previous ones kept, and the next call checks again.
func prerequisites(log logr.Logger, every time.Duration) func(agent.PoolTypes) []string {
	return prerequisitesOf(log, func(ctx context.Context, served agent.PoolTypes) []nodecheck.Finding {
		return nodecheck.Check(ctx, nodecheck.Options{LVM: served.LVM, Thin: served.Thin})
	}, 10*time.Second, every)
}

func prerequisitesOf(log logr.Logger, check func(context.Context, agent.PoolTypes) []nodecheck.Finding, timeout, every time.Duration) func(agent.PoolTypes) []string {
	var (
		mu      sync.Mutex
		last    time.Time
		checked agent.PoolTypes
		missing []string
	)
	return func(served agent.PoolTypes) []string {
		mu.Lock()
		defer mu.Unlock()
		if !last.IsZero() && served == checked && time.Since(last) < every {
			return missing
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		found := nodecheck.Missing(check(ctx, served))
		if ctx.Err() != nil {
			log.Info("node prerequisite check did not finish in time; keeping the previous findings", "timeout", timeout, "unfinished", found)
			return missing
		}
		last, checked, missing = time.Now(), served, found
		for _, m := range missing {
			log.Info("node prerequisite missing", "finding", m)
		}
		return missing
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Client-side rate limits of the subcommands' API clients. client-go's default, 5
// requests per second in bursts of 10, throttled the controller process: in
// `make sanity` a CreateVolume (the CSI service's RV create and reads, the
// controller's placement, Secret and status writes) took 0.9-1s on average against a
// `meshvol controller` process and 0.2s with the same code in process; with these
// limits, 0.2s in both. kube-controller-manager runs with 20/30; meshvol's controller
// makes several writes per volume operation and serves the CSI calls beside them.
const (
	apiQPS   = 50
	apiBurst = 100
)

// restConfig is shared by the subcommands: --kubeconfig, or in-cluster.
func restConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		err = fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
	}
	if err != nil {
		return nil, err
	}
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = apiQPS, apiBurst
	}
	return cfg, nil
}

// nodeFacts fills the addresses (InternalIP) and zone (label) from the Node.
func nodeFacts(ctx context.Context, cfg *rest.Config, name string, addrs *addrList, zone *string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	node := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		return fmt.Errorf("reading Node %s for its addresses and zone: %w", name, err)
	}
	if *zone == "" {
		*zone = node.Labels[v1.LabelZone]
	}
	if len(*addrs) == 0 {
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				if ip, err := netip.ParseAddr(a.Address); err == nil {
					*addrs = append(*addrs, ip)
				}
			}
		}
		if len(*addrs) == 0 {
			return fmt.Errorf("node %s has no InternalIP address: pass --address", name)
		}
	}
	return nil
}

// nodePools maps an RSP to its provider on this node: the File pool's
// directory, or this node's volume group (and thin pool) of an LVM pool.
func nodePools(node string) agent.PoolFactory {
	return func(ctx context.Context, rsp *v1.ReplicatedStoragePool) (storage.Provider, error) {
		switch rsp.Spec.Type {
		case v1.PoolTypeFile:
			if rsp.Spec.File == nil {
				return nil, errors.New("file pool without spec.file")
			}
			if err := os.MkdirAll(rsp.Spec.File.Directory, 0o750); err != nil {
				return nil, err
			}
			return file.New(ctx, rsp.Spec.File.Directory)
		case v1.PoolTypeLVM, v1.PoolTypeLVMThin:
			for _, vg := range rsp.Spec.VolumeGroups {
				if vg.NodeName != node {
					continue
				}
				if rsp.Spec.Type == v1.PoolTypeLVMThin {
					return lvm.NewThin(vg.Name, vg.ThinPool, lvm.Options{})
				}
				return lvm.NewThick(vg.Name, lvm.Options{})
			}
			return nil, nil // this node is not in the pool
		}
		return nil, fmt.Errorf("pool type %q is not supported", rsp.Spec.Type)
	}
}

// kernelAlgorithms reads the HMAC and verify (digest) algorithms the
// kernel's crypto API offers, in meshvol's order of preference.
func kernelAlgorithms(path string) (hmac, verify []string) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "name" {
			names[strings.TrimSpace(v)] = true
		}
	}
	for _, alg := range []string{"sha256", "sha1", "md5"} {
		if names["hmac("+alg+")"] || names[alg] {
			hmac = append(hmac, alg)
		}
	}
	for _, alg := range []string{"crc32c", "sha256", "sha1", "md5"} {
		if names[alg] {
			verify = append(verify, alg)
		}
	}
	return hmac, verify
}

// driverLog is the DRBD driver's log in the node's own: without it the driver
// logged nowhere, and a drbd-utils command killed at --command-timeout left
// only the step's error, not which command hung or for how long. slog's
// levels map to logr's: a killed command (Warn) and a forced promotion
// (Warn) at the default verbosity, every command with its duration (Debug)
// at -v 4.
func driverLog(log logr.Logger) *slog.Logger {
	return slog.New(logr.ToSlogHandler(log.WithName("drbd")))
}
