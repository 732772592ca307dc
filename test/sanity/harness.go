// Package sanity is the harness both csi-sanity runs share: the in-process suite
// (sanity_test.go, csi-test's pkg/sanity inside `go test`) and `make sanity`
// (hack/sanity, the real bin/k8s/csi-sanity binary).
//
// Start brings up a whole cluster in one process (internal/localcluster: a real
// kube-apiserver and etcd, three node agents on drbdsim whose Primary devices are
// real loop devices), one File pool, and the CSI services on two unix sockets: the
// controller service, either in this process (csi.RunController beside the
// controller, as `meshvol controller --csi-endpoint` runs them) or as a real
// `meshvol controller --csi-endpoint` process (Options.ControllerBinary), and
// node-1's node service (csi.RunNode, what `meshvol node --csi-endpoint` runs
// beside the agent). Each layout gets its ReplicatedStorageClass, named by the
// parameters a test passes to CreateVolume.
package sanity

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/localcluster"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/csi"
)

// Layout is one protection layout sanity runs against.
type Layout struct {
	// Name is how --layouts and the report name it: 1d, 2d-1tb, 3d.
	Name      string
	FTT, GMDR int32
}

// Layouts are the three layouts of the issue: one diskful replica; two diskful and a
// tiebreaker (FTT 1); three diskful (FTT 1, GMDR 1).
var Layouts = []Layout{{"1d", 0, 0}, {"2d-1tb", 1, 0}, {"3d", 1, 1}}

// LayoutByName finds a layout of Layouts.
func LayoutByName(name string) (Layout, bool) {
	for _, l := range Layouts {
		if l.Name == name {
			return l, true
		}
	}
	return Layout{}, false
}

// Class is the ReplicatedStorageClass of the layout.
func (l Layout) Class() string { return "sanity-" + l.Name }

// Parameters are CreateVolume's parameters for the layout, as a StorageClass passes them.
func (l Layout) Parameters() map[string]string {
	return map[string]string{v1.CSIParameterStorageClass: l.Class()}
}

const (
	// VolumeSize and ExpandSize are the test volume's sizes: small, so that mkfs and
	// the pools' files stay cheap, and large enough for ext4 and xfs.
	VolumeSize int64 = 64 << 20
	ExpandSize int64 = 96 << 20
	// pool is the File pool every layout's class uses.
	pool = "sanity"
)

// AllowedSkip says whether a spec that skipped with reason tests only something meshvol
// does not advertise: GetSnapshot and group snapshots, volume modification, the
// volume health RPCs, a per-node volume limit (NodeGetInfo's max_volumes_per_node
// is 0: meshvol sets none), or snapshots constrained to a topology (the plugin
// capability SNAPSHOT_ACCESSIBILITY_CONSTRAINTS is CSI 1.13's, newer than the
// specification meshvol is built with, go.mod's container-storage-interface/spec).
// These are the reasons csi-test v5.4.0 and v5.6.0 give for exactly those cases; any
// other skip hides a spec meshvol should pass.
func AllowedSkip(reason string) bool {
	switch strings.ToLower(strings.TrimSpace(reason)) {
	case "getsnapshot not supported", "snapshot_accessibility_constraints not supported",
		"modify volume not supported", "controllermodifyvolume not supported",
		"groupcontrollerservice not supported",
		"controllergetvolumehealth not supported", "controllerlistvolumehealth not supported",
		"nodegetvolumehealth not supported", "nodegetstoragehealth not supported",
		"no maxvolumespernode":
		return true
	}
	return false
}

// Options shape a harness.
type Options struct {
	// ControllerBinary, when set, is a meshvol binary: the controller and its CSI
	// controller service run as `meshvol controller --csi-endpoint` in a child
	// process. Empty runs both in this process.
	ControllerBinary string
	// ControllerOutput receives the child controller's log (JSON lines); nil
	// discards it. RPC timings are read from it either way.
	ControllerOutput io.Writer
	// Log receives the in-process components' logs; default discard.
	Log logr.Logger
}

// Harness is a running cluster with the CSI services of one controller and one node.
type Harness struct {
	Cluster *localcluster.Cluster
	// Dir holds the sockets, the controller's kubeconfig and each layout's target
	// and staging directories.
	Dir string
	// ControllerEndpoint and NodeEndpoint are the two sockets, unix:///….
	ControllerEndpoint, NodeEndpoint string
	// Node is the node whose node service listens on NodeEndpoint.
	Node *localcluster.Node
	// RPCs records every CSI call's method and duration, from both services.
	RPCs *RPCStats

	cancel context.CancelFunc
	errs   chan error
	wg     sync.WaitGroup
	proc   *exec.Cmd
}

// Start brings the harness up; Stop takes it down. It must run as root.
func Start(ctx context.Context, o Options) (h *Harness, err error) {
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	h = &Harness{RPCs: &RPCStats{}, errs: make(chan error, 2)}
	defer func() {
		if err != nil {
			if serr := h.Stop(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}()
	if h.Dir, err = os.MkdirTemp("", "meshvol-sanity-"); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	lo := localcluster.Options{Nodes: 3, LoopDevices: true, Log: o.Log}
	if o.ControllerBinary == "" {
		lo.Controller = localcluster.Controller(controller.Options{})
	}
	if h.Cluster, err = localcluster.Start(ctx, lo); err != nil {
		return nil, fmt.Errorf("starting the cluster: %w", err)
	}
	if _, err := h.Cluster.CreatePool(ctx, pool); err != nil {
		return nil, err
	}
	for _, l := range Layouts {
		if _, err := h.Cluster.CreateClass(ctx, l.Class(), pool, l.FTT, l.GMDR, v1.TopologyIgnored); err != nil {
			return nil, err
		}
	}
	h.Node = h.Cluster.Nodes[0]
	ctrlSock, nodeSock := filepath.Join(h.Dir, "controller.sock"), filepath.Join(h.Dir, "node.sock")
	h.ControllerEndpoint, h.NodeEndpoint = "unix://"+ctrlSock, "unix://"+nodeSock
	env := h.Cluster.Env
	if o.ControllerBinary != "" {
		if err := h.startControllerProcess(runCtx, o); err != nil {
			return nil, err
		}
	} else {
		h.goServe(func() error {
			return csi.RunController(runCtx, csi.ControllerOptions{Endpoint: h.ControllerEndpoint, Config: env.Config,
				Scheme: env.Scheme, Namespace: h.Cluster.Namespace, Log: logr.New(h.RPCs.sink(o.Log.GetSink()))})
		})
	}
	h.goServe(func() error {
		return csi.RunNode(runCtx, csi.NodeOptions{Endpoint: h.NodeEndpoint, Config: env.Config, Scheme: env.Scheme,
			NodeName: h.Node.Name, Zone: h.Node.Zone, Log: logr.New(h.RPCs.sink(o.Log.GetSink()))})
	})
	if err := h.waitCapacity(ctx); err != nil {
		return nil, err
	}
	for _, s := range []string{ctrlSock, nodeSock} {
		if err := h.waitSocket(ctx, s); err != nil {
			return nil, err
		}
	}
	return h, nil
}

func (h *Harness) goServe(run func() error) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if err := run(); err != nil && !errors.Is(err, context.Canceled) {
			h.errs <- err
		}
	}()
}

// startControllerProcess runs `meshvol controller` against the cluster's apiserver
// with a client certificate of its own, no leader election, metrics or probes, and
// at -v 1 so that its CSI server logs every call's duration.
func (h *Harness) startControllerProcess(ctx context.Context, o Options) error {
	kc, err := h.Cluster.Env.KubeConfig("meshvol-controller", "system:masters")
	if err != nil {
		return err
	}
	kcPath := filepath.Join(h.Dir, "controller.kubeconfig")
	if err := os.WriteFile(kcPath, kc, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(o.ControllerBinary, "controller",
		"--kubeconfig", kcPath, "--namespace", h.Cluster.Namespace, "--leader-elect=false",
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--csi-endpoint", h.ControllerEndpoint, "-v", "1")
	// Its own process group: Stop signals the controller alone.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = o.ControllerOutput
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s controller: %w", o.ControllerBinary, err)
	}
	h.proc = cmd
	out := o.ControllerOutput
	if out == nil {
		out = io.Discard
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			h.RPCs.recordJSON(line)
			_, _ = out.Write(append(line, '\n'))
		}
		err := cmd.Wait()
		if ctx.Err() == nil {
			h.errs <- fmt.Errorf("meshvol controller exited: %v", err)
		}
	}()
	return nil
}

// waitCapacity waits until the controller has reported every node's free space in
// the pool: CreateVolume refuses what the reported free space cannot hold.
func (h *Harness) waitCapacity(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var rsp v1.ReplicatedStoragePool
		ready := 0
		if err := h.Cluster.Client.Get(ctx, client.ObjectKey{Name: pool}, &rsp); err == nil {
			for _, n := range rsp.Status.EligibleNodes {
				if n.Ready && n.FreeCapacity != nil && !n.FreeCapacity.IsZero() {
					ready++
				}
			}
		}
		if ready == len(h.Cluster.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool %s has %d of %d nodes ready with capacity after 2 minutes", pool, ready, len(h.Cluster.Nodes))
		}
		select {
		case err := <-h.errs:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (h *Harness) waitSocket(ctx context.Context, path string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within a minute", path)
		}
		select {
		case err := <-h.errs:
			return fmt.Errorf("a CSI service stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Err returns the error of a CSI service (or the controller process) that stopped
// on its own, nil while all run.
func (h *Harness) Err() error {
	select {
	case err := <-h.errs:
		return err
	default:
		return nil
	}
}

// Paths returns the layout's target and staging directories for csi-sanity, whose
// parent it creates (csi-sanity creates and removes the directories themselves).
func (h *Harness) Paths(l Layout) (target, staging string, err error) {
	dir := filepath.Join(h.Dir, l.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	return filepath.Join(dir, "target"), filepath.Join(dir, "staging"), nil
}

// Leftovers lists what a layout's run left in the cluster: volumes and attachments
// that csi-sanity's own clean-up should have deleted through DeleteVolume and
// ControllerUnpublishVolume.
func (h *Harness) Leftovers(ctx context.Context) ([]string, error) {
	return Leftovers(ctx, h.Cluster.Client)
}

// Leftovers lists the volumes and attachments of a cluster: after a layout's run,
// what csi-sanity's clean-up left behind.
func Leftovers(ctx context.Context, c client.Client) ([]string, error) {
	var out []string
	var rvs v1.ReplicatedVolumeList
	if err := c.List(ctx, &rvs); err != nil {
		return nil, err
	}
	for _, rv := range rvs.Items {
		out = append(out, "ReplicatedVolume "+rv.Name)
	}
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := c.List(ctx, &rvas); err != nil {
		return nil, err
	}
	for _, a := range rvas.Items {
		out = append(out, "ReplicatedVolumeAttachment "+a.Name)
	}
	var snaps v1.ReplicatedVolumeSnapshotList
	if err := c.List(ctx, &snaps); err != nil {
		return nil, err
	}
	for _, s := range snaps.Items {
		out = append(out, "ReplicatedVolumeSnapshot "+s.Name)
	}
	return out, nil
}

// Stop stops the CSI services and the controller process, then the cluster, and
// removes the directory; it returns what it could not clean.
func (h *Harness) Stop() error {
	var errs []error
	if h.cancel != nil {
		h.cancel()
	}
	if h.proc != nil && h.proc.Process != nil {
		_ = h.proc.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { h.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = h.proc.Process.Kill()
			errs = append(errs, errors.New("meshvol controller did not stop within 30s of SIGINT; killed"))
		}
	}
	h.wg.Wait()
	if h.Cluster != nil {
		if err := h.Cluster.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if h.Dir != "" {
		if err := os.RemoveAll(h.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RPCStats are the CSI calls served, per method: count and durations. The CSI
// servers log each call at V(1) with its method and duration (pkg/csi); the stats
// take them from those log entries, in process or from the child's JSON lines.
type RPCStats struct {
	mu sync.Mutex
	m  map[string]*MethodStats
}

// MethodStats are one method's calls.
type MethodStats struct {
	Method     string
	Calls      int
	Total, Max time.Duration
	// MaxVolume is the volume of the slowest call.
	MaxVolume string
	// Failed counts the calls that returned an error.
	Failed int
}

func (s *RPCStats) record(method string, d time.Duration, volume, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*MethodStats{}
	}
	method = method[strings.LastIndex(method, "/")+1:]
	m := s.m[method]
	if m == nil {
		m = &MethodStats{Method: method}
		s.m[method] = m
	}
	m.Calls++
	m.Total += d
	if code != "" {
		m.Failed++
	}
	if d > m.Max {
		m.Max, m.MaxVolume = d, volume
	}
}

// Reset forgets every call (between layouts).
func (s *RPCStats) Reset() {
	s.mu.Lock()
	s.m = nil
	s.mu.Unlock()
}

// Slowest returns the methods by their slowest call, slowest first.
func (s *RPCStats) Slowest() []MethodStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]MethodStats, 0, len(s.m))
	for _, m := range s.m {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Max > out[j].Max })
	return out
}

// Table formats Slowest as a table: method, calls, failed, mean, max.
func (s *RPCStats) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %6s %6s %9s %9s\n", "method", "calls", "errors", "mean", "max")
	for _, m := range s.Slowest() {
		mean := m.Total / time.Duration(m.Calls)
		fmt.Fprintf(&b, "%-32s %6d %6d %9v %9v\n", m.Method, m.Calls, m.Failed,
			mean.Round(time.Millisecond), m.Max.Round(time.Millisecond))
	}
	return b.String()
}

// recordJSON takes a call from one of the controller process's JSON log lines.
func (s *RPCStats) recordJSON(line []byte) {
	if !strings.Contains(string(line), `"method"`) {
		return
	}
	var e struct {
		Msg      string `json:"msg"`
		Method   string `json:"method"`
		Duration any    `json:"duration"`
		Volume   string `json:"volume"`
		Code     string `json:"code"`
	}
	if json.Unmarshal(line, &e) != nil || e.Method == "" || (e.Msg != "CSI call" && e.Msg != "CSI call failed") {
		return
	}
	var d time.Duration
	switch v := e.Duration.(type) {
	case string:
		d, _ = time.ParseDuration(v)
	case float64:
		d = time.Duration(v)
	}
	s.record(e.Method, d, e.Volume, e.Code)
}

// sink wraps next: every "CSI call" entry is recorded, and everything still reaches next.
func (s *RPCStats) sink(next logr.LogSink) logr.LogSink {
	if next == nil {
		next = discardSink{}
	}
	return &statsSink{stats: s, next: next}
}

// discardSink stands for logr.Discard(), whose sink is nil.
type discardSink struct{}

func (discardSink) Init(logr.RuntimeInfo)            {}
func (discardSink) Enabled(int) bool                 { return false }
func (discardSink) Info(int, string, ...any)         {}
func (discardSink) Error(error, string, ...any)      {}
func (d discardSink) WithValues(...any) logr.LogSink { return d }
func (d discardSink) WithName(string) logr.LogSink   { return d }

type statsSink struct {
	stats *RPCStats
	next  logr.LogSink
	kv    []any
}

func (l *statsSink) Init(info logr.RuntimeInfo) { l.next.Init(info) }

// Enabled is true at V(1) whatever next says: the calls are logged at V(1).
func (l *statsSink) Enabled(level int) bool { return level <= 1 || l.next.Enabled(level) }

func (l *statsSink) Info(level int, msg string, kv ...any) {
	if msg == "CSI call" || msg == "CSI call failed" {
		var method, volume, code string
		var d time.Duration
		all := append(append([]any{}, l.kv...), kv...)
		for i := 0; i+1 < len(all); i += 2 {
			switch all[i] {
			case "method":
				method, _ = all[i+1].(string)
			case "duration":
				d, _ = all[i+1].(time.Duration)
			case "volume":
				volume, _ = all[i+1].(string)
			case "code":
				code, _ = all[i+1].(string)
			}
		}
		if method != "" {
			l.stats.record(method, d, volume, code)
		}
	}
	if l.next.Enabled(level) {
		l.next.Info(level, msg, kv...)
	}
}

func (l *statsSink) Error(err error, msg string, kv ...any) { l.next.Error(err, msg, kv...) }

func (l *statsSink) WithValues(kv ...any) logr.LogSink {
	return &statsSink{stats: l.stats, next: l.next.WithValues(kv...), kv: append(append([]any{}, l.kv...), kv...)}
}

func (l *statsSink) WithName(name string) logr.LogSink {
	return &statsSink{stats: l.stats, next: l.next.WithName(name), kv: l.kv}
}
