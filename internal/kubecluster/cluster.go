// Package kubecluster runs a real Kubernetes cluster on one machine, for
// meshvol's sandbox and e2e suite: the control plane of internal/testenv
// (kube-apiserver, etcd) with kube-controller-manager and kube-scheduler
// beside it, and N nodes, each a real kubelet with a containerd of its own
// running real pods with runc. Everything comes from bin/k8s (built by
// hack/build-k8s.sh from the same Kubernetes module) and Debian's containerd,
// runc and CNI plugins.
//
// What the nodes share and what they do not, found by trial on the
// development machines:
//
//   - Each node has its own containerd (root, state, socket, CNI
//     configuration under the node's directory), kubelet root directory,
//     ports and — essential — cgroup root: a kubelet removes pod cgroups it
//     does not know under its root, so nodes sharing one kill each other's
//     pods.
//   - All nodes share the machine's address (a kubelet refuses a loopback
//     node IP), so each kubelet has its own port.
//   - Without namespaces of their own (Options.Namespaces), the network is
//     CNI's loopback plugin alone: the smallest thing that makes a node
//     Ready, with no link, route or firewall rule on the machine, and pods
//     use the host network. With them, pods have a network of their own
//     inside the nodes' network namespaces (netns.go).
//   - No registry is reachable: the pause and busybox images are built
//     locally as OCI archives and imported with ctr (see images.go).
//   - One cluster runs on a machine at a time (see host.go for what they
//     would share), and Stop leaves nothing behind: processes, mounts,
//     cgroups, shim sockets, kernel settings the kubelet changed.
package kubecluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
)

// Options describe the cluster to start.
type Options struct {
	// Dir holds everything of the cluster: kubeconfigs, certificates, each
	// node's directory, logs. It must be an absolute path, short enough
	// for unix socket paths beneath it (under 60 bytes is safe).
	Dir string
	// Nodes to run; their names must be DNS labels. Empty means none
	// (a control plane only).
	Nodes []NodeSpec
	// BinDir holds the Kubernetes binaries; empty means bin/k8s.
	BinDir string
	// PauseBinary is the static pause program (internal/kubecluster/pause);
	// BusyboxBinary a static busybox (Debian's busybox-static installs
	// /bin/busybox, the default).
	PauseBinary, BusyboxBinary string
	// WaitForLock makes Start wait for another cluster on this machine to
	// end instead of failing with ErrBusy.
	WaitForLock bool
	// Log receives progress lines; nil means discard.
	Log io.Writer
	// KubeletVerbosity is the kubelets' --v (default 0).
	KubeletVerbosity int
	// CRDDirs are passed to testenv (nil: meshvol's CRDs).
	CRDDirs []string
	// Namespaces gives every node a mount and a network namespace of its
	// own (netns.go): its /var/lib/kubelet, /var/lib/meshvol and /dev are
	// its own, it has its own address, and pods run with service account
	// tokens and in-cluster configuration as on a real cluster. Without
	// it, the nodes share the machine's mounts and address.
	Namespaces bool
	// PrepareNode, when set, runs once a node's namespaces exist and
	// before its containerd starts (Node.Run runs commands in them).
	PrepareNode func(*Node) error
	// Images are OCI archives imported into every node's containerd
	// besides the pause and busybox images.
	Images []string
}

// NodeSpec names a node and its zone.
type NodeSpec struct{ Name, Zone string }

// Cluster is a running cluster.
type Cluster struct {
	// Env is the control plane: a client for it, its config.
	Env *testenv.Env
	// Dir is Options.Dir.
	Dir string
	// BinDir holds the Kubernetes binaries.
	BinDir string
	// Kubeconfig is the path of an administrator's kubeconfig (for kubectl).
	Kubeconfig string
	// NodeIP is the address every node's kubelet uses.
	NodeIP string
	// Nodes in the order of Options.Nodes.
	Nodes []*Node
	// LockWait is how long Start waited for another cluster on the
	// machine to end (Options.WaitForLock): not part of the start time.
	LockWait time.Duration

	log  io.Writer
	lock *os.File
	// What RestartNode needs to boot a crashed node as Start did.
	opts       Options
	kubeletCA  string
	apiAddress [2]string // the apiserver's host:port and port, for the nodes' proxies
	host       *hostState
	kcm, sched *proc
	stopOnce   sync.Once
	stopErr    error
}

// Start starts the cluster and returns once every node is Ready. On
// failure it tears down what it started.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("kubecluster: Dir %q must be an absolute path", opts.Dir)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("kubecluster: a cluster of real kubelets needs root (it mounts, creates cgroups and runs containers)")
	}
	for _, tool := range []string{"containerd", "runc", "ctr", "/usr/lib/cni/loopback"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("kubecluster: %s not found: install the Debian packages containerd, runc and containernetworking-plugins (hack/install-deps.sh)", tool)
		}
	}
	if opts.BinDir == "" {
		if opts.BinDir, err = testenv.DefaultBinDir(); err != nil {
			return nil, err
		}
	}
	for _, b := range []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kubectl"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			return nil, fmt.Errorf("kubecluster: %s not found in %s: run `make k8s` (hack/build-k8s.sh)", b, opts.BinDir)
		}
	}
	if opts.BusyboxBinary == "" {
		opts.BusyboxBinary = "/bin/busybox"
	}
	logw := opts.Log
	if logw == nil {
		logw = io.Discard
	}
	c = &Cluster{Dir: opts.Dir, BinDir: opts.BinDir, log: logw, opts: opts}
	locking := time.Now()
	c.lock, err = hostLock(ctx, opts.WaitForLock, c.logf)
	if err != nil {
		return nil, err
	}
	if c.LockWait = time.Since(locking); c.LockWait > time.Second {
		c.logf("the machine is ours after waiting %s", c.LockWait.Round(time.Second))
	}
	defer func() {
		if err != nil {
			if stopErr := c.Stop(); stopErr != nil {
				err = fmt.Errorf("%w (and tearing down: %v)", err, stopErr)
			}
			c = nil
		}
	}()
	if prev, err := loadHostState(); err != nil {
		return c, err
	} else if prev != nil {
		c.logf("cleaning up after a cluster that ended without a teardown (pid %d, %s)", prev.PID, prev.Dir)
		if err := cleanHost(prev); err != nil {
			return c, fmt.Errorf("kubecluster: cleaning up the previous cluster: %w", err)
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return c, err
	}
	if c.host, err = captureHostState(opts.Dir); err != nil {
		return c, err
	}
	if c.NodeIP, err = nodeAddress(); err != nil {
		return c, err
	}

	began := time.Now()
	pki, err := writeKubeletPKI(filepath.Join(opts.Dir, "pki"))
	if err != nil {
		return c, err
	}
	c.kubeletCA = pki.CAFile
	apiArgs := map[string][]string{
		// Logs and exec reach the kubelets at the machine's address,
		// with a certificate they trust.
		"kubelet-preferred-address-types": {"InternalIP"},
		"kubelet-client-certificate":      {pki.ClientCertFile},
		"kubelet-client-key":              {pki.ClientKeyFile},
	}
	if opts.Namespaces {
		// The kubernetes Service gets 127.0.0.1, so the in-cluster
		// configuration every pod is given (KUBERNETES_SERVICE_HOST) is an
		// address the apiserver's certificate names and the proxy on each
		// node's loopback serves (netns.go).
		apiArgs["service-cluster-ip-range"] = []string{"127.0.0.0/24"}
		// envtest turns the ServiceAccount admission plugin off; on, every
		// pod gets its service account's token and the apiserver's CA.
		apiArgs["disable-admission-plugins"] = nil
	}
	c.Env, err = testenv.Start(testenv.Options{
		BinDir:        opts.BinDir,
		CRDDirs:       opts.CRDDirs,
		Log:           logw,
		APIServerArgs: apiArgs,
	})
	if err != nil {
		return c, err
	}
	if c.Kubeconfig, err = c.WriteKubeconfig("kubeconfig", "meshvol-sandbox-admin", "system:masters"); err != nil {
		return c, err
	}
	c.logf("control plane up in %s (kube-apiserver %s, etcd %s)", time.Since(began).Round(time.Millisecond), c.Env.Version.GitVersion, c.Env.EtcdVersion)

	if err := c.startControllers(opts.Namespaces); err != nil {
		return c, err
	}

	if len(opts.Nodes) == 0 {
		return c, nil
	}
	began = time.Now()
	if err := makeCgroup(cgroupParent); err != nil {
		return c, err
	}
	archives, err := c.buildImages(opts)
	if err != nil {
		return c, err
	}
	for _, spec := range opts.Nodes {
		n := &Node{
			Name:       spec.Name,
			Zone:       spec.Zone,
			Dir:        filepath.Join(opts.Dir, spec.Name),
			CgroupRoot: cgroupParent + "/" + spec.Name,
		}
		n.KubeletRootDir = filepath.Join(n.Dir, "kubelet")
		n.ContainerdAddress = filepath.Join(n.Dir, "containerd.sock")
		if opts.Namespaces {
			n.KubeletPort = 10250 // the node's own address
		} else if n.KubeletPort, err = freePort(c.NodeIP); err != nil {
			return c, err
		}
		c.Nodes = append(c.Nodes, n)
		if err := makeCgroup(n.systemCgroup()); err != nil {
			return c, err
		}
	}
	if opts.Namespaces {
		if err := c.startNamespaces(ctx, opts.PrepareNode); err != nil {
			return c, err
		}
	}
	archives = append(archives, opts.Images...)
	// containerd and the image import per node in parallel: the import
	// unpacks the images, the longest step of a node's start.
	if err := c.eachNode(func(n *Node) error {
		if err := n.startContainerd(ctx); err != nil {
			return err
		}
		for _, a := range archives {
			if err := importImage(ctx, n.ContainerdAddress, a, nil); err != nil {
				return fmt.Errorf("%s: %w", n.Name, err)
			}
		}
		return nil
	}); err != nil {
		return c, err
	}
	c.logf("containerd up on %d nodes, images imported, in %s", len(c.Nodes), time.Since(began).Round(time.Millisecond))

	began = time.Now()
	for _, n := range c.Nodes {
		kc, err := c.WriteKubeconfig(filepath.Join(n.Name, "kubelet.kubeconfig"), "system:node:"+n.Name, "system:nodes", "system:masters")
		if err != nil {
			return c, err
		}
		if err := n.startKubelet(opts.BinDir, kc, c.NodeIP, pki.CAFile, opts.KubeletVerbosity); err != nil {
			return c, err
		}
	}
	if err := c.WaitNodesReady(ctx, 2*time.Minute); err != nil {
		return c, err
	}
	c.logf("%d kubelets Ready in %s", len(c.Nodes), time.Since(began).Round(time.Millisecond))
	return c, nil
}

func (c *Cluster) logf(format string, args ...any) {
	fmt.Fprintf(c.log, "kubecluster: "+format+"\n", args...)
}

// eachNode runs f for every node at once and returns their errors.
func (c *Cluster) eachNode(f func(*Node) error) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WriteKubeconfig writes Dir/name, a kubeconfig for a new user of the
// apiserver with that name and groups, and returns its path.
func (c *Cluster) WriteKubeconfig(name, user string, groups ...string) (string, error) {
	b, err := c.Env.KubeConfig(user, groups...)
	if err != nil {
		return "", err
	}
	p := filepath.Join(c.Dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	return p, os.WriteFile(p, b, 0o600)
}

// startControllers starts kube-controller-manager (the PV binder,
// attach/detach, node lifecycle and garbage collector meshvol's flows need)
// and kube-scheduler (WaitForFirstConsumer placement). Both serve no port:
// nothing here scrapes them.
func (c *Cluster) startControllers(namespaces bool) error {
	kc, err := c.WriteKubeconfig("kube-controller-manager.kubeconfig", "system:kube-controller-manager", "system:masters")
	if err != nil {
		return err
	}
	logDir := filepath.Join(c.Dir, "logs")
	var extra []string
	if namespaces {
		// Pods get a service account token: its projected volume carries
		// the apiserver's CA from the kube-root-ca.crt ConfigMap, which the
		// root CA publisher writes from this file.
		ca := filepath.Join(c.Dir, "pki", "apiserver-ca.crt")
		if err := os.WriteFile(ca, c.Env.Config.CAData, 0o644); err != nil {
			return err
		}
		extra = append(extra, "--root-ca-file="+ca)
	}
	c.kcm, err = startProc("kube-controller-manager", logDir, "", filepath.Join(c.BinDir, "kube-controller-manager"), append([]string{
		"--kubeconfig=" + kc,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		// Node loss noticed in seconds, as the kubelets' 2 s status
		// updates and 10 s leases allow.
		"--node-monitor-period=2s",
		"--node-monitor-grace-period=10s",
		// Else it creates /usr/libexec/kubernetes/... on the machine.
		"--flex-volume-plugin-dir=" + filepath.Join(c.Dir, "kcm-flexvolume"),
	}, extra...)...)
	if err != nil {
		return err
	}
	kc, err = c.WriteKubeconfig("kube-scheduler.kubeconfig", "system:kube-scheduler", "system:masters")
	if err != nil {
		return err
	}
	c.sched, err = startProc("kube-scheduler", logDir, "", filepath.Join(c.BinDir, "kube-scheduler"),
		"--kubeconfig="+kc,
		"--leader-elect=false",
		"--secure-port=0",
	)
	if err != nil {
		return err
	}
	// Neither has a health endpoint without a port; a bad flag or a missing
	// file ends the process within a second.
	time.Sleep(time.Second)
	for _, p := range []*proc{c.kcm, c.sched} {
		if p.exited() {
			return fmt.Errorf("kubecluster: %s exited at start: %v\n%s", p.name, p.err, p.tail(20))
		}
	}
	return nil
}

// startNamespaces creates the nodes' bridge, then each node's namespaces,
// its proxy to the apiserver and whatever prepare adds.
func (c *Cluster) startNamespaces(ctx context.Context, prepare func(*Node) error) error {
	if err := createBridge(); err != nil {
		return err
	}
	c.host.Bridge = true
	if err := saveHostState(c.host); err != nil {
		return err
	}
	u, err := url.Parse(c.Env.Config.Host)
	if err != nil || u.Port() == "" {
		return fmt.Errorf("kubecluster: the apiserver's address %q has no port (%v)", c.Env.Config.Host, err)
	}
	c.apiAddress = [2]string{u.Host, u.Port()}
	for i, n := range c.Nodes {
		n.index = i
		if err := c.startNodeNamespaces(ctx, n, prepare); err != nil {
			return err
		}
	}
	return nil
}

// startNodeNamespaces creates one node's namespaces, its proxy to the
// apiserver and whatever prepare adds.
func (c *Cluster) startNodeNamespaces(ctx context.Context, n *Node, prepare func(*Node) error) error {
	if err := n.startNamespaces(ctx, n.index); err != nil {
		return err
	}
	var err error
	ns := fmt.Sprintf("/proc/%d/ns/net", n.nsPID)
	if n.proxy, err = startAPIProxy(ns, c.apiAddress[0], c.apiAddress[1], "443"); err != nil {
		return err
	}
	if prepare != nil {
		if err := prepare(n); err != nil {
			return fmt.Errorf("kubecluster: preparing %s: %w", n.Name, err)
		}
	}
	return c.routePodSubnets(ctx, n)
}

// buildImages writes the pause and busybox OCI archives.
func (c *Cluster) buildImages(opts Options) ([]string, error) {
	if opts.PauseBinary == "" {
		return nil, errors.New("kubecluster: Options.PauseBinary is empty: build internal/kubecluster/pause (static) and pass its path")
	}
	dir := filepath.Join(c.Dir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var archives []string
	for _, mk := range []func() (imageSpec, error){
		func() (imageSpec, error) { return pauseImage(opts.PauseBinary) },
		func() (imageSpec, error) { return busyboxImage(opts.BusyboxBinary) },
	} {
		spec, err := mk()
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(spec.ref)+".tar")
		if err := writeOCIArchive(p, spec); err != nil {
			return nil, err
		}
		archives = append(archives, p)
	}
	return archives, nil
}

// WaitNodesReady waits until every node that has not crashed is Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context, timeout time.Duration) error {
	return waitFor(ctx, timeout, func() (bool, error) {
		for _, n := range c.Nodes {
			if n.crashed {
				continue
			}
			if n.kubelet.exited() {
				return false, fmt.Errorf("the kubelet of %s exited: %v\n%s", n.Name, n.kubelet.err, n.kubelet.tail(20))
			}
			var node corev1.Node
			if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
				return false, nil
			}
			if !nodeReady(&node) {
				return false, nil
			}
		}
		return true, nil
	}, "the nodes to be Ready")
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Node returns the node of that name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Kubectl runs bin/k8s/kubectl with the administrator's kubeconfig and
// returns its standard output (its standard error goes only into the error).
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	// Only stdout is the answer: kubectl logs client-side complaints to
	// stderr even when it succeeds (an exec's websocket "Unknown stream
	// id", say), and a caller parsing df's output must not read them.
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err,
			strings.TrimSpace(stdout.String()+"\n"+stderr.String()))
	}
	return stdout.String(), nil
}

// Stop tears the cluster down and checks that nothing of it is left on the
// machine; the error lists what is. The cluster's directory stays, with
// the logs; everything else in it that is large (containerd's and the
// kubelets' state) is removed. Stop may be called more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() { c.stopErr = c.stop() })
	return c.stopErr
}

// StopNodes kills every node (kubelet, containerd, containers) and
// unmounts what they mounted, leaving the control plane up: for a caller
// whose own components (a CSI node plugin, say) must be stopped after the
// kubelets and before the apiserver. Stop does it too.
func (c *Cluster) StopNodes() error {
	var errs []error
	for _, n := range c.Nodes {
		if n.kubelet != nil {
			errs = appendErr(errs, n.stop())
		}
		// Only the node's own mounts: the caller's (a FUSE file system
		// under Dir, say) are the caller's to undo.
		errs = appendErr(errs, unmountUnder(n.Dir))
	}
	return errors.Join(errs...)
}

func (c *Cluster) stop() error {
	var errs []error
	errs = appendErr(errs, c.StopNodes())
	c.kcm.stop(5 * time.Second)
	c.sched.stop(5 * time.Second)
	if c.Env != nil {
		errs = appendErr(errs, c.Env.Stop())
	}
	if c.host != nil {
		errs = appendErr(errs, cleanHost(c.host))
		// The nodes' pod logs stay (plain files in the caller's directory):
		// they are what a failed run is diagnosed from, meshvol's agents'
		// logs among them.
		for _, n := range c.Nodes {
			for _, d := range []string{"containerd", "kubelet", "dev", "meshvol"} {
				errs = appendErr(errs, os.RemoveAll(filepath.Join(n.Dir, d)))
			}
		}
		if left := leftovers(c.host); len(left) > 0 {
			errs = append(errs, fmt.Errorf("kubecluster: teardown left %d things on the machine: %s", len(left), strings.Join(left, "; ")))
		} else {
			errs = appendErr(errs, os.Remove(statePath()))
		}
	}
	if c.lock != nil {
		errs = appendErr(errs, c.lock.Close())
	}
	return errors.Join(errs...)
}
