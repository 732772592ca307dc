package kubecluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Node is one simulated machine: a containerd and a kubelet of its own, all
// its state under its directory, its processes in its own cgroup.
type Node struct {
	// Name is the Node object's name (the kubelet's --hostname-override).
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
	// Dir holds everything of the node: configuration, containerd's root and
	// state, the kubelet's root directory, logs.
	Dir string
	// KubeletRootDir is the kubelet's --root-dir; a CSI node plugin
	// registers in its plugins_registry and serves under its plugins.
	KubeletRootDir string
	// ContainerdAddress is the node's containerd socket.
	ContainerdAddress string
	// CgroupRoot is the kubelet's cgroupRoot, relative to each hierarchy's
	// root. The node's own processes (kubelet, containerd, shims) run in
	// CgroupRoot/system beside the kubelet's kubepods.
	CgroupRoot string
	// KubeletPort is the port the kubelet serves on at the node address.
	KubeletPort int
	// IP is the node's own address (Options.Namespaces), on the bridge the
	// cluster creates; empty when the nodes share the machine's.
	IP string

	containerd *proc
	kubelet    *proc
	crashed    bool
	// crashedOnce: Crash was called at some time, even if the node was restarted since.
	crashedOnce bool
	index       int // in Options.Nodes: its address on the bridge
	// With namespaces of its own: the process holding them, its pid, and
	// the proxy from the node's loopback to the apiserver.
	holder *proc
	nsPID  int
	proxy  *apiProxy
}

// command is bin with args, run in the node's namespaces when it has them.
func (n *Node) command(bin string, args ...string) (string, []string) {
	if n.nsPID == 0 {
		return bin, args
	}
	ns := n.nsenter()
	return ns[0], append(append(ns[1:], bin), args...)
}

// PluginsRegistryDir is where the kubelet watches for plugin registration
// sockets.
func (n *Node) PluginsRegistryDir() string {
	return filepath.Join(n.KubeletRootDir, "plugins_registry")
}

// PluginDir is the directory a CSI driver's node plugin serves its socket in,
// <root-dir>/plugins/<driver>, as a DaemonSet would mount it.
func (n *Node) PluginDir(driver string) string {
	return filepath.Join(n.KubeletRootDir, "plugins", driver)
}

// LogDir holds the node's component logs.
func (n *Node) LogDir() string { return filepath.Join(n.Dir, "logs") }

func (n *Node) systemCgroup() string { return n.CgroupRoot + "/system" }

// startContainerd writes the node's containerd and CNI configuration and
// starts containerd.
func (n *Node) startContainerd(ctx context.Context) error {
	cniDir := filepath.Join(n.Dir, "cni")
	for _, d := range []string{cniDir, filepath.Join(n.Dir, "containerd"), n.KubeletRootDir, n.LogDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Without namespaces of its own, the smallest network that makes a node
	// Ready: loopback only. It adds no link, route or firewall rule to the
	// machine; pods run on the host network (hostNetwork: true), and a pod
	// with a network of its own fails with "failed to find network info
	// for sandbox". With them, the pod network of podNetworkConfig.
	name, conflist := "10-loopback.conflist", `{"cniVersion": "0.4.0", "name": "meshvol-loopback", "plugins": [{"type": "loopback"}]}`+"\n"
	if n.nsPID != 0 {
		name, conflist = "10-pods.conflist", n.podNetworkConfig()
	}
	if err := os.WriteFile(filepath.Join(cniDir, name), []byte(conflist), 0o644); err != nil {
		return err
	}
	cfgPath := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(n.containerdConfig(cniDir)), 0o644); err != nil {
		return err
	}
	bin, args := n.command("containerd", "--config", cfgPath)
	p, err := startProc("containerd", n.LogDir(), n.systemCgroup(), bin, args...)
	if err != nil {
		return err
	}
	n.containerd = p
	return waitFor(ctx, 60*time.Second, func() (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("containerd of %s exited: %v\n%s", n.Name, p.err, p.tail(20))
		}
		_, err := execOutput("ctr", "--address", n.ContainerdAddress, "version")
		return err == nil, nil
	}, "containerd of "+n.Name+" to answer")
}

// containerdConfig is the node's containerd configuration: root, state and
// sockets under the node's directory, the locally built pause image, no
// registry. restrict_oom_score_adj is essential where the process lacks
// CAP_SYS_RESOURCE (as in a container): without it runc fails to start any
// container ("can't get final child's PID from pipe").
func (n *Node) containerdConfig(cniDir string) string {
	ctd := filepath.Join(n.Dir, "containerd")
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[6]q

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`, filepath.Join(ctd, "root"), filepath.Join(ctd, "state"), n.ContainerdAddress,
		filepath.Join(ctd, "opt"), PauseImage, cniDir)
}

// kubeletConfig is the node's KubeletConfiguration.
func (n *Node) kubeletConfig(nodeIP string, healthzPort int, clientCAFile string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://%[1]s
cgroupDriver: cgroupfs
# Each node's own cgroup root: a kubelet removes the pod cgroups it does not
# know under its root, so with a shared root each would kill the others' pods.
cgroupRoot: %[2]s
cgroupsPerQOS: true
failSwapOn: false
address: %[3]s
port: %[4]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[5]d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %[6]s
authorization:
  mode: AlwaysAllow
# Fast node-loss detection, with kube-controller-manager's
# --node-monitor-grace-period.
nodeStatusUpdateFrequency: 2s
nodeLeaseDurationSeconds: 10
# No iptables chains on the machine: nothing here needs them.
makeIPTablesUtilChains: false
hairpinMode: none
volumePluginDir: %[7]s
podLogsDir: %[8]s
# The images were imported, not pulled: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
`, n.ContainerdAddress, n.CgroupRoot, nodeIP, n.KubeletPort, healthzPort, clientCAFile,
		filepath.Join(n.Dir, "flexvolume"), filepath.Join(n.Dir, "pod-logs"))
}

// startKubelet writes the kubelet's configuration and starts it.
func (n *Node) startKubelet(binDir, kubeconfig, nodeIP, clientCAFile string, verbosity int) error {
	rootDir := n.KubeletRootDir
	healthz := 10248 // the kubelet's default, on the node's own loopback
	if n.nsPID == 0 {
		var err error
		if healthz, err = freePort("127.0.0.1"); err != nil {
			return err
		}
	} else {
		// The node's own mount namespace binds its directory here: the
		// path a DaemonSet's hostPath names.
		rootDir, nodeIP = "/var/lib/kubelet", n.IP
	}
	cfgPath := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(cfgPath, []byte(n.kubeletConfig(nodeIP, healthz, clientCAFile)), 0o644); err != nil {
		return err
	}
	labels := "topology.kubernetes.io/zone=" + n.Zone
	bin, args := n.command(filepath.Join(binDir, "kubelet"),
		"--config="+cfgPath,
		"--kubeconfig="+kubeconfig,
		"--root-dir="+rootDir,
		"--cert-dir="+filepath.Join(rootDir, "pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+nodeIP,
		"--node-labels="+labels,
		"--v="+strconv.Itoa(verbosity),
	)
	p, err := startProc("kubelet", n.LogDir(), n.systemCgroup(), bin, args...)
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// Crash kills the node as a power loss would: the kubelet, containerd, the
// runc shims and every container process at once (everything in the node's
// cgroups), leaving its mounts and files as they were. Killing only the
// kubelet and containerd would be a partition, not a crash: the containers
// would go on writing. The node does not come back.
func (n *Node) Crash() error {
	if err := killCgroupTree(n.CgroupRoot); err != nil {
		return err
	}
	n.crashed, n.crashedOnce = true, true
	n.proxy.close()
	for _, p := range []*proc{n.kubelet, n.containerd, n.holder} {
		if p != nil {
			<-p.done
		}
	}
	return nil
}

// Crashed says whether Crash was called.
func (n *Node) Crashed() bool { return n.crashed }

// CrashedOnce says whether Crash was ever called, even if RestartNode booted the
// node since: the containers of its pods restarted with it.
func (n *Node) CrashedOnce() bool { return n.crashedOnce }

// stop ends the node: the kubelet first (so it does not restart containers
// while they die), then everything else in its cgroups.
func (n *Node) stop() error {
	n.kubelet.stop(10 * time.Second)
	n.proxy.close()
	return killCgroupTree(n.CgroupRoot)
}

// freePort asks the kernel for a free TCP port on addr. Another process
// could take it before the component binds it; the components that use
// these ports fail loudly if so.
func freePort(addr string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("kubecluster: finding a free port on %s: %w", addr, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// nodeAddress is the machine's first IPv4 address that is not loopback: the
// kubelet refuses a loopback node IP, and every node shares this one.
func nodeAddress() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", fmt.Errorf("kubecluster: this machine has no IPv4 address other than loopback, and a kubelet refuses a loopback node IP")
}

// waitFor polls cond every 200 ms until it is true, returns an error (which
// ends the wait: cond returns errors only for what will not get better), or
// timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error), what string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("kubecluster: waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubecluster: waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
