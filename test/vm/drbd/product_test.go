//go:build vmtest

package drbd_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/scenario"
	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// The product tier (MESHVOL_VM_PRODUCT, set by `VM_SUITE=product
// hack/vm-test-drbd.sh`): the whole of meshvol on the three guests. On the
// host, inside the network namespace: kube-apiserver and etcd (bin/k8s,
// internal/testenv) reachable from the guests at the bridge address, and the
// real `meshvol controller` with its CSI controller service. In each guest:
// the real `meshvol node` (production ExecDriver, drbd-utils, the kernel
// module, a File pool on the guest's disk) with its CSI node service, whose
// Node object the host creates (the guest's address as InternalIP, a zone
// per guest). TestProduct runs internal/scenario's list on drbdsim and on
// these guests and prints the two runs side by side.

// prod is the running product tier on the host; nil anywhere else.
var prod *product

const (
	// apiserverProxy is where the guests reach the apiserver: the bridge's
	// host address (the apiserver itself listens on 127.0.0.1).
	apiserverProxy = "10.99.0.254:6443"
	// productPool is the File pool's directory on every guest: the guest's
	// init mounts its disk there.
	productPoolDir = "/var/lib/meshvol/pool"
	guestKubelet   = "/var/lib/kubelet"
)

type product struct {
	env     *testenv.Env
	out     string
	names   []string
	remotes map[string]*remote
	addrs   map[string]string
	proxy   net.Listener
	// cutMu guards cut and proxied: the guests Partition cut off from the
	// apiserver, and every proxied connection by guest address.
	cutMu   sync.Mutex
	cut     map[string]bool
	proxied map[string][]net.Conn
	ctrl    *exec.Cmd
	ctrlLog *os.File
	ctrlCSI csipb.ControllerClient
	nodeCSI map[string]csipb.NodeClient
	conns   []*grpc.ClientConn
	// Boot is how long the guests took to answer, from the test binary's start.
	Boot time.Duration
}

var _ scenario.Backend = (*product)(nil)

// startProduct waits for the guests' agents, then brings up the control
// plane, the controller and each guest's `meshvol node`.
func startProduct(spec, out, meshvol string) (p *product, err error) {
	p = &product{out: out, remotes: map[string]*remote{}, addrs: map[string]string{}, nodeCSI: map[string]csipb.NodeClient{}}
	started := p
	// The controller's CSI endpoint must be an absolute path.
	if p.out, err = filepath.Abs(out); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			started.finish()
		}
	}()
	for _, kv := range strings.Split(spec, ",") {
		node, ip, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("MESHVOL_VM_DRBD: %q is not node=ip", kv)
		}
		p.names = append(p.names, node)
		p.remotes[node], p.addrs[node] = newRemote(node, ip), ip
	}
	sort.Strings(p.names)
	start := time.Now()
	for _, n := range p.names {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := p.remotes[n].Ping(ctx)
			cancel()
			if err == nil {
				break
			}
			if time.Since(start) > 15*time.Minute {
				return nil, fmt.Errorf("%s: agent not answering after 15 minutes: %v", n, err)
			}
			time.Sleep(time.Second)
		}
	}
	p.Boot = time.Since(start)
	fmt.Printf("product-vm: all guests answer, %s after the test binary started\n", p.Boot.Round(time.Second))

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if p.env, err = testenv.Start(testenv.Options{Log: os.Stdout}); err != nil {
		return nil, err
	}
	if err := p.startProxy(); err != nil {
		return nil, err
	}
	cl := p.env.Client
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1.DefaultNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	for i, n := range p.names {
		if err := p.createNode(ctx, n, "zone-"+string(rune('a'+i))); err != nil {
			return nil, err
		}
	}
	if err := cl.Create(ctx, &v1.ReplicatedStoragePool{ObjectMeta: metav1.ObjectMeta{Name: p.Pool()},
		Spec: v1.ReplicatedStoragePoolSpec{Type: v1.PoolTypeFile, File: &v1.FilePool{Directory: productPoolDir}}}); err != nil {
		return nil, err
	}
	if err := p.startController(meshvol); err != nil {
		return nil, err
	}
	for _, n := range p.names {
		kc, err := p.guestKubeconfig(n)
		if err != nil {
			return nil, err
		}
		if err := p.remotes[n].startNode(ctx, n, kc); err != nil {
			return nil, err
		}
		cc, err := grpc.NewClient(net.JoinHostPort(p.addrs[n], fmt.Sprint(csiProxyPort)), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		p.conns = append(p.conns, cc)
		p.nodeCSI[n] = csipb.NewNodeClient(cc)
	}
	began := time.Now()
	if err := scenario.WaitPool(ctx, p, 10*time.Minute); err != nil {
		return nil, err
	}
	fmt.Printf("product-vm: control plane, controller and three `meshvol node` up; pool ready %s after the agents started\n", time.Since(began).Round(time.Second))
	return p, nil
}

// startProxy forwards the bridge address to the apiserver's loopback port.
func (p *product) startProxy() error {
	u, err := url.Parse(p.env.Config.Host)
	if err != nil {
		return err
	}
	if p.proxy, err = net.Listen("tcp", apiserverProxy); err != nil {
		return err
	}
	p.cut, p.proxied = map[string]bool{}, map[string][]net.Conn{}
	go func() {
		for {
			c, err := p.proxy.Accept()
			if err != nil {
				return
			}
			from, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			p.cutMu.Lock()
			if p.cut[from] {
				p.cutMu.Unlock()
				c.Close()
				continue
			}
			p.proxied[from] = append(p.proxied[from], c)
			p.cutMu.Unlock()
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", u.Host)
				if err != nil {
					return
				}
				defer s.Close()
				pipe(c, s)
			}()
		}
	}()
	return nil
}

// Partition cuts node off: the bridge drops every frame between its tap and
// the other guests' (its DRBD connections), and the apiserver forward closes
// its connections and refuses new ones (its agent's watches and Lease). The
// host still reaches the guest's test agent and CSI node socket, as one
// reaches a console.
func (p *product) Partition(_ context.Context, node string) error {
	for _, o := range p.names {
		if o != node {
			link(true, node, o)
		}
	}
	ip := p.addrs[node]
	p.cutMu.Lock()
	p.cut[ip] = true
	conns := p.proxied[ip]
	delete(p.proxied, ip)
	p.cutMu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// Heal undoes Partition.
func (p *product) Heal(context.Context) error {
	p.cutMu.Lock()
	clear(p.cut)
	p.cutMu.Unlock()
	return healAll()
}

// createNode is the Node a kubelet would register: Ready, the guest's address
// as InternalIP, a zone of its own.
func (p *product) createNode(ctx context.Context, name, zone string) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name, v1.LabelZone: zone}}}
	if err := p.env.Client.Create(ctx, node); err != nil {
		return err
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
		Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: p.addrs[name]}}
	return p.env.Client.Status().Update(ctx, node)
}

// guestKubeconfig is a kubeconfig for node's agent that reaches the
// apiserver through the bridge and checks its certificate (issued for
// localhost) by that name.
func (p *product) guestKubeconfig(node string) ([]byte, error) {
	b, err := p.env.KubeConfig("system:node:"+node, "system:nodes", "system:masters")
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		return nil, err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + apiserverProxy
		c.TLSServerName = "localhost"
	}
	return clientcmd.Write(*cfg)
}

// startController runs `meshvol controller` with its CSI controller service,
// without leader election, metrics or probes, and without tainting lost nodes
// (there are no kubelets to evict pods).
func (p *product) startController(meshvol string) error {
	kc, err := p.env.KubeConfig("meshvol-controller", "system:masters")
	if err != nil {
		return err
	}
	kcPath := filepath.Join(p.out, "controller.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return err
	}
	if p.ctrlLog, err = os.Create(filepath.Join(p.out, "controller.log")); err != nil {
		return err
	}
	sock := filepath.Join(p.out, "controller.sock")
	_ = os.Remove(sock)
	// --agent-grace-period 10s, the controller's default, beside the guests'
	// Leases at the chart's 6 s renewed every 2 s (productLease): a node is lost
	// 16 s after its agent's last renewal. The chart's 3 s grace would leave a
	// guest starved under emulation 9 s, about the restart of `meshvol node` in
	// scenario 7. The 60 s used before, against a loaded machine's late Leases
	// (test/vm/FINDINGS.md, "The product on real DRBD", 4 and 10, both fixed
	// since), cost two minutes of every run: scenarios 5 and 6 wait for it.
	// Their times to published elsewhere include this grace.
	p.ctrl = exec.Command(meshvol, "controller", "--kubeconfig", kcPath, "--leader-elect=false", "--agent-grace-period", productGrace.String(),
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--taint-lost-nodes=false",
		"--csi-endpoint", "unix://"+sock, "-v", "1")
	p.ctrl.Stdout, p.ctrl.Stderr = p.ctrlLog, p.ctrlLog
	p.ctrl.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.ctrl.Start(); err != nil {
		return fmt.Errorf("starting %s controller: %w", meshvol, err)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("meshvol controller: no CSI socket %s after 2 minutes (log: %s)", sock, p.ctrlLog.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	p.conns = append(p.conns, cc)
	p.ctrlCSI = csipb.NewControllerClient(cc)
	return nil
}

// finish stops the agents and the controller, saves each guest's kernel
// log, powers the guests off and stops the control plane.
func (p *product) finish() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, cc := range p.conns {
		_ = cc.Close()
	}
	// A guest that no longer answers (scenario 5 crashed one) is left out:
	// every request to it waits for the bridge to give up on its address.
	var up []string
	for _, n := range p.names {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		if p.remotes[n].Ping(pctx) == nil {
			up = append(up, n)
		}
		pcancel()
	}
	for _, n := range up {
		_ = p.remotes[n].stopNode(ctx, false)
	}
	if p.ctrl != nil && p.ctrl.Process != nil {
		_ = p.ctrl.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = p.ctrl.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.ctrl.Process.Kill()
			<-done
		}
	}
	if p.ctrlLog != nil {
		_ = p.ctrlLog.Close()
	}
	var wg sync.WaitGroup
	for _, n := range up {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p.out != "" {
				if res, err := p.remotes[n].Exec(ctx, "dmesg"); err == nil {
					_ = os.WriteFile(filepath.Join(p.out, n+".dmesg.txt"), res.Stdout, 0o644)
				}
			}
			_ = p.remotes[n].Poweroff(ctx)
		}()
	}
	wg.Wait()
	if p.proxy != nil {
		_ = p.proxy.Close()
	}
	if p.env != nil {
		_ = p.env.Stop()
	}
}

func (p *product) Name() string                             { return "drbd-9.2.18" }
func (p *product) Client() client.Client                    { return p.env.Client }
func (p *product) Namespace() string                        { return v1.DefaultNamespace }
func (p *product) Pool() string                             { return "pool" }
func (p *product) Nodes() []string                          { return p.names }
func (p *product) Controller() csipb.ControllerClient       { return p.ctrlCSI }
func (p *product) NodeService(node string) csipb.NodeClient { return p.nodeCSI[node] }
func (p *product) Dir(string) string                        { return guestKubelet }
func (p *product) DRBD(node string) drbd.Driver             { return p.remotes[node] }

// Shell runs the script in the guest.
func (p *product) Shell(ctx context.Context, node, script string) (string, error) {
	res, err := p.remotes[node].Exec(ctx, "sh", "-c", script)
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", res.ExitCode, strings.TrimSpace(string(res.Stderr)))
	}
	return string(res.Stdout), err
}

// Leftovers lists the volume's .res file and backing files in the guest.
func (p *product) Leftovers(ctx context.Context, node, volume string) ([]string, error) {
	out, err := p.Shell(ctx, node, "ls /var/lib/meshvol/drbd.d "+productPoolDir+" 2>/dev/null; true")
	if err != nil {
		return nil, err
	}
	var left []string
	for _, f := range strings.Fields(out) {
		if strings.Contains(f, volume) {
			left = append(left, f)
		}
	}
	return left, nil
}

// Crash panics the guest's kernel (sysrq c): with panic=-1 and qemu's
// -no-reboot, qemu exits at once, as if it had been killed.
func (p *product) Crash(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, _ = p.remotes[node].Exec(ctx, "sh", "-c", "echo c > /proc/sysrq-trigger")
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := p.remotes[node].Ping(pctx)
		pcancel()
		if err != nil {
			return nil
		}
	}
	return fmt.Errorf("%s still answers a minute after its kernel was made to panic", node)
}

// RestartAgent kills the guest's `meshvol node` and starts it again.
func (p *product) RestartAgent(ctx context.Context, node string) error {
	if err := p.remotes[node].stopNode(ctx, true); err != nil {
		return err
	}
	kc, err := p.guestKubeconfig(node)
	if err != nil {
		return err
	}
	return p.remotes[node].startNode(ctx, node, kc)
}

// TestProduct runs the scenario list on drbdsim (the in-process cluster, as
// `make test` does) and on the guests, and prints both runs and their
// differences step by step (also to scenario-compare.txt in the run's
// directory).
// The drbdsim pass is TestProductOnDrbdsim's, in its own process beside
// this one (MESHVOL_VM_SIM_RECORD) or earlier in this one; TestProduct runs
// it here only when neither ran (a -run pattern that left it out).
func TestProduct(t *testing.T) {
	waitProduct(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	sim, real := simRecord, (*scenario.Record)(nil)
	if sim == nil && simRecordPath() == "" {
		t.Run("drbdsim", func(t *testing.T) { sim = runOnDrbdsim(ctx, t) })
	}
	t.Run("real", func(t *testing.T) {
		real = scenario.Run(ctx, t, prod, scenario.Options{Wait: 10 * time.Minute})
	})
	if sim == nil && simRecordPath() != "" {
		sim = waitSimRecord(ctx, t)
	}
	var w io.Writer = os.Stdout
	if f, err := os.Create(filepath.Join(prod.out, "scenario-compare.txt")); err == nil {
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	fmt.Fprintf(w, "product-vm: boot %s\n", prod.Boot.Round(time.Second))
	for _, rec := range []*scenario.Record{sim, real} {
		if rec != nil {
			rec.Print(w)
		}
	}
	if sim == nil || real == nil {
		t.Fatal(errors.New("a run did not complete; nothing to compare"))
	}
	diffs := scenario.Compare(sim, real)
	fmt.Fprintf(w, "=== %d differences between drbdsim and real DRBD, step by step\n", len(diffs))
	for _, d := range diffs {
		fmt.Fprintln(w, "  "+d)
	}
}

// errorsOnly is controller-runtime's logger in the host's test binary: the
// errors of the in-process drbdsim cluster and the CSI clients, to stderr.
type errorsOnly struct{}

func (errorsOnly) Init(logr.RuntimeInfo)            {}
func (errorsOnly) Enabled(int) bool                 { return false }
func (errorsOnly) Info(int, string, ...any)         {}
func (e errorsOnly) WithValues(...any) logr.LogSink { return e }
func (e errorsOnly) WithName(string) logr.LogSink   { return e }
func (errorsOnly) Error(err error, msg string, kv ...any) {
	fmt.Fprintln(os.Stderr, "error:", msg, err, kv)
}
