package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshvol/meshvol/internal/mountinfo"
)

// Nodes with namespaces of their own (Options.Namespaces), as a kind node
// container has them:
//
//   - a mount namespace, whose /var/lib/kubelet, /var/lib/meshvol and /dev
//     are the node's own directories (bound from its directory), so a
//     DaemonSet's hostPath /var/lib/kubelet, a node plugin's state and the
//     devices it creates are the node's, not the machine's. The machine's
//     mounts propagate into it (slave) where the machine's / is shared, none
//     of its own propagate out; the node drops its copies of other programs'
//     device mounts (dropForeignDeviceMounts).
//     /var/lib/kubelet and /var/lib/meshvol are shared mounts inside it, so
//     a pod's Bidirectional mounts reach the kubelet.
//   - a UTS namespace: the node's name is its host name, as a host-network
//     pod sees it (a leader election's identity names its node).
//   - a network namespace with one address on the bridge the cluster
//     creates (bridgeName), so each node's host-network pods have their own
//     ports, as on separate machines. The apiserver listens on the
//     machine's loopback; a proxy of this process listening on the node's
//     loopback (the same port, and 443 for the kubernetes Service) carries
//     the node's connections to it, so kubeconfigs and in-cluster
//     configuration work unchanged on every node.
//
// The bridge has no route or firewall rule beyond its own subnet; the
// machine reaches the nodes on it (the apiserver calls the kubelets), the
// nodes reach nothing else.
const (
	bridgeName = "meshvol0"
	// bridgeSubnet: a /24 of the private range unlikely to be in use.
	bridgeSubnet = "10.213.7"
	// vethPrefix names the machine's end of each node's link.
	vethPrefix = "mvn-"
)

// BridgeIP is the machine's address on the nodes' bridge.
const BridgeIP = bridgeSubnet + ".1"

func nodeAddressOnBridge(i int) string { return fmt.Sprintf("%s.%d", bridgeSubnet, 10+i) }

// nodeDevices are the device nodes of a node's /dev: what containerd, runc,
// the kubelet and a node plugin open (the loop devices a plugin attaches it
// creates itself, as in any container without udev).
var nodeDevices = []struct {
	name         string
	mode         uint32
	major, minor uint32
}{
	{"null", unix.S_IFCHR | 0o666, 1, 3},
	{"zero", unix.S_IFCHR | 0o666, 1, 5},
	{"full", unix.S_IFCHR | 0o666, 1, 7},
	{"random", unix.S_IFCHR | 0o666, 1, 8},
	{"urandom", unix.S_IFCHR | 0o666, 1, 9},
	{"kmsg", unix.S_IFCHR | 0o644, 1, 11},
	{"tty", unix.S_IFCHR | 0o666, 5, 0},
	{"fuse", unix.S_IFCHR | 0o666, 10, 229},
	{"loop-control", unix.S_IFCHR | 0o660, 10, 237},
}

// nodeLoopDevices is how many loop device nodes a node's /dev has.
const nodeLoopDevices = 1024

// DevDir is the node's /dev as the machine sees it.
func (n *Node) DevDir() string { return filepath.Join(n.Dir, "dev") }

// StateDir is the node's /var/lib/meshvol as the machine sees it.
func (n *Node) StateDir() string { return filepath.Join(n.Dir, "meshvol") }

// createBridge creates the nodes' bridge with the machine's address on it.
func createBridge() error {
	for _, args := range [][]string{
		{"link", "add", bridgeName, "type", "bridge"},
		{"addr", "add", BridgeIP + "/24", "dev", bridgeName},
		{"link", "set", bridgeName, "up"},
	} {
		if _, err := execOutput("ip", args...); err != nil {
			return fmt.Errorf("kubecluster: creating the nodes' bridge: %w", err)
		}
	}
	return nil
}

func deleteBridge() error {
	if _, err := net.InterfaceByName(bridgeName); err != nil {
		return nil
	}
	if _, err := execOutput("ip", "link", "del", bridgeName); err != nil {
		return fmt.Errorf("kubecluster: %w", err)
	}
	return nil
}

// startNamespaces creates the node's mount and network namespaces: a
// process that holds them (in the node's cgroup: a crash ends them with
// the node), its link on the bridge, and its mounts.
func (n *Node) startNamespaces(ctx context.Context, index int) error {
	for _, d := range []string{n.DevDir(), n.StateDir(), n.KubeletRootDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, d := range nodeDevices {
		p := filepath.Join(n.DevDir(), d.name)
		if err := unix.Mknod(p, d.mode, int(unix.Mkdev(d.major, d.minor))); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("kubecluster: mknod %s: %w", p, err)
		}
		// mknod's mode is masked by the umask.
		if err := os.Chmod(p, os.FileMode(d.mode&0o777)); err != nil {
			return err
		}
	}
	// Loop devices: the kubelet's losetup for a block volume, and a file
	// pool's, open /dev/loopN after the kernel hands out N, and no udev
	// creates it here. The machine's are numbered from 0.
	for i := 0; i < nodeLoopDevices; i++ {
		p := filepath.Join(n.DevDir(), "loop"+strconv.Itoa(i))
		if err := unix.Mknod(p, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(i)))); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("kubecluster: mknod %s: %w", p, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.MkdirAll(filepath.Join(n.DevDir(), d), 0o755); err != nil {
			return err
		}
	}
	p, err := startProc("namespaces", n.LogDir(), n.systemCgroup(), "unshare", "--mount", "--net", "--uts", "--propagation", "slave", "--", "sleep", "infinity")
	if err != nil {
		return err
	}
	n.holder = p
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return err
	}
	// The holder is the shell that moves itself into the cgroup and execs
	// unshare, which unshares and execs sleep: one pid throughout.
	pid := p.cmd.Process.Pid
	if err := waitFor(ctx, 10*time.Second, func() (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("unshare exited: %v\n%s", p.err, p.tail(10))
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
		return err == nil && ns != self, nil
	}, "the namespaces of "+n.Name); err != nil {
		return err
	}
	n.nsPID = pid
	if err := n.dropForeignDeviceMounts(ctx); err != nil {
		return err
	}
	n.IP = nodeAddressOnBridge(index)
	veth := n.vethName()
	for _, args := range [][]string{
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(pid)},
		{"link", "set", veth, "master", bridgeName, "up"},
	} {
		if _, err := execOutput("ip", args...); err != nil {
			return fmt.Errorf("kubecluster: the link of %s: %w", n.Name, err)
		}
	}
	script := strings.Join([]string{
		"set -e",
		"hostname " + shellQuote(n.Name),
		"ip link set lo up",
		"ip addr add " + n.IP + "/24 dev eth0",
		"ip link set eth0 up",
		"mkdir -p /var/lib/kubelet /var/lib/meshvol",
		"mount --bind " + shellQuote(n.KubeletRootDir) + " /var/lib/kubelet",
		"mount --make-rshared /var/lib/kubelet",
		"mount --bind " + shellQuote(n.StateDir()) + " /var/lib/meshvol",
		"mount --make-rshared /var/lib/meshvol",
		"mount --bind " + shellQuote(n.DevDir()) + " /dev",
		"mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts",
		"mount -t tmpfs -o mode=1777 shm /dev/shm",
	}, "\n")
	if _, err := n.Run(ctx, script); err != nil {
		return err
	}
	return nil
}

// dropForeignDeviceMounts detaches, in the node's new mount namespace, its
// copies of the machine's file systems on loop devices and FUSE mounts under
// the temporary directory: other programs' (another test's drbdsim devices
// and the file systems on them, a file pool's volumes). A node has no use for
// them, and on a machine whose / is private — the case on this project's
// machines and CI, where nothing propagates — their owner's unmount does not
// reach the copy, which keeps the owner's loop devices busy and its teardown
// failing for as long as the node lives.
func (n *Node) dropForeignDeviceMounts(ctx context.Context) error {
	ms, err := mountinfo.ReadFile(n.MountInfo())
	if err != nil {
		return err
	}
	tmp := filepath.Clean(os.TempDir())
	var script strings.Builder
	// The latest mount first: a mount stacked on another goes before it.
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		const loopMajor = 7
		onDevice := m.Major == loopMajor || strings.HasPrefix(m.FsType, "fuse")
		if onDevice && strings.HasPrefix(m.MountPoint, tmp+"/") {
			// Its owner may unmount it between the read and here; then there
			// is nothing left to detach.
			fmt.Fprintf(&script, "umount -l %s 2>/dev/null || true\n", shellQuote(m.MountPoint))
		}
	}
	if script.Len() == 0 {
		return nil
	}
	if out, err := n.Run(ctx, script.String()); err != nil {
		return fmt.Errorf("kubecluster: detaching the machine's device mounts in %s: %w: %s", n.Name, err, out)
	}
	return nil
}

// The pod network of nodes with namespaces of their own: CNI's bridge
// plugin, run by the node's containerd in the node's network namespace,
// makes a bridge there (podBridge) with the node's pod subnet on it and a
// veth per pod; host-local hands out the addresses, its state in the
// node's directory. Each node routes the other nodes' pod subnets to them
// over the nodes' bridge, so pods reach each other across nodes and reach
// every node. Everything it creates lives in the node's network namespace
// and goes with it: the machine gets no link, route, firewall rule or
// sysctl (the bridge plugin turns IP forwarding on in the node's namespace,
// where it is the node's own). There is no kube-proxy: a pod reaches
// Services' cluster IPs only where a node's proxy listens (none does).
const (
	podBridge = "cni0"
	// podSubnetPrefix: node i's pods get podSubnetPrefix.<10+i>.0/24.
	podSubnetPrefix = "10.214"
)

// podSubnet is the /24 of the pods of the node at address nodeIP on the
// nodes' bridge.
func podSubnet(nodeIP string) string {
	return podSubnetPrefix + "." + nodeIP[strings.LastIndex(nodeIP, ".")+1:] + ".0/24"
}

// podNetworkConfig is the node's CNI configuration list.
func (n *Node) podNetworkConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "meshvol-pods",
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "hairpinMode": true,
    "ipam": {"type": "host-local", "subnet": %q, "dataDir": %q, "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
`, podBridge, podSubnet(n.IP), filepath.Join(n.Dir, "cni-ipam"))
}

// routePodSubnets routes pod subnets between node n, whose namespaces have
// just started (at Start, one node after another, or when a crashed node
// boots again), and every other node that runs: n reaches their pods
// through them, they reach n's through n. Routes are replaced, not added: a
// node that boots again finds its peers' routes to it still there.
func (c *Cluster) routePodSubnets(ctx context.Context, n *Node) error {
	route := func(from, to *Node) error {
		if _, err := from.Run(ctx, "ip route replace "+podSubnet(to.IP)+" via "+to.IP+" dev eth0"); err != nil {
			return fmt.Errorf("kubecluster: the pod route of %s to %s: %w", from.Name, to.Name, err)
		}
		return nil
	}
	for _, o := range c.Nodes {
		if o == n || o.IP == "" || o.crashed {
			continue // itself, not started yet, or down
		}
		if err := route(n, o); err != nil {
			return err
		}
		if err := route(o, n); err != nil {
			return err
		}
	}
	return nil
}

// nsenter is the command line prefix that runs a program in the node's
// namespaces.
func (n *Node) nsenter() []string {
	return []string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", n.nsPID), fmt.Sprintf("--net=/proc/%d/ns/net", n.nsPID),
		fmt.Sprintf("--uts=/proc/%d/ns/uts", n.nsPID), "--"}
}

// Nsenter is the command line prefix that runs a program in the node's
// namespaces (Options.Namespaces), for a script outside this process.
func (n *Node) Nsenter() []string { return n.nsenter() }

// Run runs a shell script in the node's namespaces (Options.Namespaces)
// and returns its output.
func (n *Node) Run(ctx context.Context, script string) (string, error) {
	if n.nsPID == 0 {
		return "", fmt.Errorf("kubecluster: node %s has no namespaces of its own", n.Name)
	}
	args := append(n.nsenter()[1:], "/bin/sh", "-c", script)
	out, err := execOutput("nsenter", args...)
	if err != nil {
		return out, fmt.Errorf("kubecluster: in the namespaces of %s: %w", n.Name, err)
	}
	return out, nil
}

// listenInNetns listens on addr in the network namespace at nsPath. A
// socket belongs to the namespace of the thread that creates it, so the
// listener is made on a thread moved there and back.
func listenInNetns(nsPath, addr string) (net.Listener, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("kubecluster: setns %s: %w", nsPath, err)
	}
	l, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays in the node's namespace: leave it locked, so it
		// ends with this goroutine instead of running others.
		if l != nil {
			l.Close()
		}
		return nil, fmt.Errorf("kubecluster: setns back: %w", err)
	}
	runtime.UnlockOSThread()
	return l, lerr
}

// apiProxy carries connections accepted on a node's loopback to the
// apiserver on the machine's, byte for byte (TLS end to end). While held
// (Node.CutOff) it reads but passes nothing on, in either direction.
type apiProxy struct {
	ls     []net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	// flowing is closed while bytes may pass; hold replaces it with an
	// open channel, which release closes.
	flowing chan struct{}
}

func startAPIProxy(nsPath, target string, ports ...string) (*apiProxy, error) {
	p := &apiProxy{target: target, flowing: make(chan struct{})}
	close(p.flowing)
	for _, port := range ports {
		l, err := listenInNetns(nsPath, net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			p.close()
			return nil, fmt.Errorf("kubecluster: the apiserver proxy on a node's port %s: %w", port, err)
		}
		p.ls = append(p.ls, l)
		p.wg.Add(1)
		go p.serve(l)
	}
	return p, nil
}

func (p *apiProxy) serve(l net.Listener) {
	defer p.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
			if err != nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { p.pipe(up, c); done <- struct{}{} }()
			go func() { p.pipe(c, up); done <- struct{}{} }()
			<-done
		}()
	}
}

// pipe copies src to dst, each chunk once the proxy lets bytes pass.
func (p *apiProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *apiProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flowing
}

// hold stops the bytes; release lets them pass again.
func (p *apiProxy) hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
		p.flowing = make(chan struct{})
	default: // already held
	}
}

func (p *apiProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flowing:
	default:
		close(p.flowing)
	}
}

// close stops listening and lets held bytes go; connections in flight end
// with their peers.
func (p *apiProxy) close() {
	if p == nil {
		return
	}
	for _, l := range p.ls {
		l.Close()
	}
	p.wg.Wait()
	if p.flowing != nil {
		p.release()
	}
}

// MountInfo is the mountinfo file of the node's mount namespace (what a
// process on the node sees mounted); empty without namespaces.
func (n *Node) MountInfo() string {
	if n.nsPID == 0 {
		return ""
	}
	return fmt.Sprintf("/proc/%d/mountinfo", n.nsPID)
}

// KubeletRootOnNode is the kubelet's root directory as processes on the
// node see it — the paths the kubelet passes to a CSI node plugin: the
// node's own /var/lib/kubelet with namespaces, KubeletRootDir without.
func (n *Node) KubeletRootOnNode() string {
	if n.nsPID == 0 {
		return n.KubeletRootDir
	}
	return "/var/lib/kubelet"
}
