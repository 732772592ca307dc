package sandbox

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/drbdsimd"
	"github.com/meshvol/meshvol/internal/kubecluster"
	"github.com/meshvol/meshvol/internal/testenv"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// The installed sandbox (Options.Image): meshvol as users install it, with
// `helm install` of charts/meshvol and the image `make image` builds,
// imported into every node's containerd. The nodes have namespaces of their
// own (kubecluster.Options.Namespaces): the chart's hostPath
// /var/lib/kubelet, /var/lib/meshvol and /dev are each node's own. The DRBD
// kernel module of every node is drbdsim in this process, a service of the
// machine (internal/drbdsimd): each node pod's PATH starts with the
// drbd-utils stand-ins, mounted from the node's /var/lib/meshvol/drbdsim,
// which reach its node's simulated kernel through the socket beside them,
// so `meshvol node` runs its production ExecDriver; a Primary's device is a
// device node /dev/drbd<minor> in the node's /dev (a loop device drbdsim
// serves). What drbdsim cannot be, a kernel module, it shows as one: the
// node's /sys/module lists drbd 9.2.18 and its TCP transport, so the
// agent's prerequisite check passes.

// ReleaseNamespace is where the sandbox installs the chart.
const ReleaseNamespace = "meshvol-system"

// ReleaseName is the Helm release of the installed sandbox.
const ReleaseName = "meshvol"

// Sidecar images the sandbox builds from bin/k8s (the chart's defaults name
// registry.k8s.io's, which no node here can pull).
var sidecarImages = map[string]string{
	"csi-provisioner":     "meshvol.local/csi-provisioner:sandbox",
	"csi-attacher":        "meshvol.local/csi-attacher:sandbox",
	"csi-snapshotter":     "meshvol.local/csi-snapshotter:sandbox",
	"snapshot-controller": "meshvol.local/snapshot-controller:sandbox",
}

// standInDir is the node's directory of drbd-utils stand-ins and the
// socket of its simulated kernel, under its own /var/lib/meshvol.
const standInDir = "/var/lib/meshvol/drbdsim"

// imageRef reads the reference an OCI archive names its image with
// (org.opencontainers.image.ref.name of its index, what ctr import tags).
func imageRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("sandbox: the meshvol image: %w (run `make image`)", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", fmt.Errorf("sandbox: %s has no index.json: not an OCI archive", archive)
		}
		if err != nil {
			return "", fmt.Errorf("sandbox: reading %s: %w", archive, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			return "", fmt.Errorf("sandbox: %s index.json: %w", archive, err)
		}
		for _, m := range idx.Manifests {
			if r := m.Annotations["org.opencontainers.image.ref.name"]; r != "" {
				return r, nil
			}
		}
		return "", fmt.Errorf("sandbox: %s names no image (org.opencontainers.image.ref.name)", archive)
	}
}

// splitRef splits repository:tag.
func splitRef(ref string) (repo, tag string) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ref, "latest"
	}
	return ref[:i], ref[i+1:]
}

// buildSidecarImages writes an image archive per sidecar from binDir.
func buildSidecarImages(binDir, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var out []string
	for name, ref := range sidecarImages {
		p := filepath.Join(dir, name+".tar")
		if err := kubecluster.WriteBinaryImage(p, ref, filepath.Join(binDir, name)); err != nil {
			return nil, fmt.Errorf("%w (run `make k8s`)", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// prepareNode gives a node what its DRBD kernel module would: the
// stand-ins and its simulated kernel's socket, and a /sys/module that lists
// the module.
func (s *Sandbox) prepareNode(n *kubecluster.Node) error {
	dir := filepath.Join(n.StateDir(), strings.TrimPrefix(standInDir, "/var/lib/meshvol/"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(s.opts.StandIns)
	if err != nil {
		return fmt.Errorf("sandbox: the drbd-utils stand-ins: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "drbdutils"), b, 0o755); err != nil {
		return err
	}
	for _, prog := range []string{"drbdadm", "drbdsetup", "drbdmeta"} {
		_ = os.Remove(filepath.Join(dir, prog))
		if err := os.Symlink("drbdutils", filepath.Join(dir, prog)); err != nil {
			return err
		}
	}
	if err := s.simd.Listen(n.Name, filepath.Join(dir, "drbdsim.sock")); err != nil {
		return err
	}
	_, err = n.Run(s.ctx, strings.Join([]string{
		"set -e",
		"mount -t tmpfs -o mode=0755 drbdsim-modules /sys/module",
		"mkdir -p /sys/module/drbd /sys/module/drbd_transport_tcp",
		"echo 9.2.18 > /sys/module/drbd/version",
	}, "\n"))
	return err
}

// startInstalled is Start for Options.Image: the cluster with namespaced
// nodes, drbdsim as the machine's DRBD, the images, `helm install`.
func (s *Sandbox) startInstalled(ctx context.Context, specs []kubecluster.NodeSpec) error {
	opts := s.opts
	ref, err := imageRef(opts.Image)
	if err != nil {
		return err
	}
	if opts.StandIns == "" {
		return errors.New("sandbox: Options.StandIns is empty: build internal/drbdsimd/drbdutils (static) and pass its path")
	}
	binDir := opts.BinDir
	if binDir == "" {
		kubeBin, err := testenv.DefaultBinDir()
		if err != nil {
			return err
		}
		binDir = kubeBin
	}
	archives, err := buildSidecarImages(binDir, filepath.Join(opts.Dir, "images"))
	if err != nil {
		return err
	}
	nodeDir := func(node string) string { return filepath.Join(opts.Dir, node) }
	s.Sim = drbdsim.NewCluster(drbdsim.Options{
		Dir:         filepath.Join(opts.Dir, "drbdsim"),
		LoopDevices: true,
		DeviceDir:   func(node string) string { return filepath.Join(nodeDir(node), "dev") },
		DeviceNodes: true,
		NodeMountInfo: func(node string) string {
			if s.Kube == nil || s.Kube.Node(node) == nil {
				return ""
			}
			return s.Kube.Node(node).MountInfo()
		},
	})
	// The agents run in real time, so the simulator's clock must too.
	clock, stopClock := context.WithCancel(context.Background())
	s.stopClock = func() { stopClock(); <-s.clockDone }
	s.clockDone = make(chan struct{})
	go func() {
		defer close(s.clockDone)
		s.Sim.RunClock(clock, 20*time.Millisecond)
	}()
	s.simd = drbdsimd.New(s.Sim)

	began := time.Now()
	ko := s.clusterOptions(specs)
	ko.Namespaces, ko.PrepareNode, ko.Images = true, s.prepareNode, append(append([]string{opts.Image}, archives...), ko.Images...)
	s.Kube, err = kubecluster.Start(ctx, ko)
	if err != nil {
		return err
	}
	s.Client = s.Kube.Env.Client
	s.progress("sandbox: Kubernetes up (control plane, kube-controller-manager, kube-scheduler, %d kubelets Ready, each node with its own namespaces and address; images %s and the sidecars imported) in %s",
		len(specs), ref, (time.Since(began) - s.Kube.LockWait).Round(time.Millisecond))

	if err := s.install(ctx, ref); err != nil {
		return err
	}
	if err := s.startResizerFor(s.ctx); err != nil {
		return err
	}
	began = time.Now()
	if err := s.waitPoolCapacity(ctx); err != nil {
		return err
	}
	caps, err := s.waitCapacities(ctx)
	if err != nil {
		return err
	}
	s.progress("sandbox: storage capacity published in %s: %s", time.Since(began).Round(time.Millisecond), describeCapacities(caps))
	return nil
}

// install runs `helm install` of the chart with the sandbox's values and
// the image ref, and waits until the release's pods are Ready and every
// kubelet lists the driver.
func (s *Sandbox) install(ctx context.Context, ref string) error {
	began := time.Now()
	if err := s.installSnapshotCRDs(ctx); err != nil {
		return err
	}
	values, err := s.writeValues(ref)
	if err != nil {
		return err
	}
	if out, err := s.helm(ctx, "install", ReleaseName, s.chartDir(), "--namespace", ReleaseNamespace, "--create-namespace", "--values", values); err != nil {
		return fmt.Errorf("sandbox: helm install: %w\n%s", err, out)
	}
	s.progress("sandbox: helm install %s %s in %s", ReleaseName, s.chartDir(), time.Since(began).Round(time.Millisecond))
	began = time.Now()
	if err := s.waitRelease(ctx, 3*time.Minute); err != nil {
		return err
	}
	s.progress("sandbox: the release's pods Running and Ready in %s (controller Deployment 2/2, node DaemonSet %d/%d)",
		time.Since(began).Round(time.Millisecond), len(s.Kube.Nodes), len(s.Kube.Nodes))
	if err := s.waitCSINodes(ctx); err != nil {
		return err
	}
	s.ControllerSocket, err = s.controllerSocket(ctx)
	return err
}

// installSnapshotCRDs installs the VolumeSnapshot CRDs that hack/build-k8s.sh copies
// from external-snapshotter, as a cluster's administrator does before installing a
// CSI driver that snapshots: the chart then renders a VolumeSnapshotClass per class.
func (s *Sandbox) installSnapshotCRDs(ctx context.Context) error {
	dir := filepath.Join(s.Kube.BinDir, "crds")
	// The VolumeSnapshot kinds only: meshvol takes no group snapshots.
	for _, kind := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
		f := filepath.Join(dir, "snapshot.storage.k8s.io_"+kind+".yaml")
		if out, err := s.Kube.Kubectl(ctx, "apply", "--server-side", "-f", f); err != nil {
			return fmt.Errorf("sandbox: the VolumeSnapshot CRD %s: %w\n%s", f, err, out)
		}
	}
	if out, err := s.Kube.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/volumesnapshots.snapshot.storage.k8s.io", "crd/volumesnapshotcontents.snapshot.storage.k8s.io",
		"crd/volumesnapshotclasses.snapshot.storage.k8s.io"); err != nil {
		return fmt.Errorf("sandbox: the VolumeSnapshot CRDs: %w\n%s", err, out)
	}
	return nil
}

func (s *Sandbox) chartDir() string {
	if s.opts.Chart != "" {
		return s.opts.Chart
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return "charts/meshvol"
	}
	return filepath.Join(root, "charts", "meshvol")
}

// writeValues writes the sandbox's values for the chart: the images it
// imported, no external-resizer, node-driver-registrar or livenessprobe
// (the module proxy refuses them, hack/build-k8s.sh: the node plugin
// registers itself and has no liveness probe; the sandbox's resizer,
// resizer.go, does external-resizer's part), the controller on the nodes'
// network (pods have a network, but no kube-proxy gives them the
// apiserver's Service address; a node's own loopback proxies it), lost
// nodes tainted, a file pool and the three classes, and the stand-ins
// first in the node plugin's PATH.
func (s *Sandbox) writeValues(ref string) (string, error) {
	repo, tag := splitRef(ref)
	var classes []map[string]any
	for _, sc := range storageClasses {
		ftt, gmdr := 0, 0
		switch sc.replication {
		case "Availability":
			ftt = 1
		case "ConsistencyAndAvailability":
			ftt, gmdr = 1, 1
		}
		classes = append(classes, map[string]any{"name": sc.name, "failuresToTolerate": ftt, "guaranteedMinimumDataRedundancy": gmdr})
	}
	values := map[string]any{
		"image": map[string]any{"repository": repo, "tag": tag, "pullPolicy": "Never"},
		"sidecars": map[string]any{
			"provisioner":         map[string]any{"image": sidecarImages["csi-provisioner"]},
			"attacher":            map[string]any{"image": sidecarImages["csi-attacher"]},
			"livenessProbe":       map[string]any{"enabled": false},
			"resizer":             map[string]any{"enabled": false},
			"snapshotter":         map[string]any{"enabled": true, "image": sidecarImages["csi-snapshotter"]},
			"nodeDriverRegistrar": map[string]any{"enabled": false},
			"pullPolicy":          "Never",
		},
		// The cluster has no snapshot-controller of its own; the VolumeSnapshot CRDs
		// are installed before the chart (installSnapshotCRDs).
		"snapshotController": map[string]any{"enabled": true, "image": sidecarImages["snapshot-controller"], "hostNetwork": true},
		"controller": map[string]any{
			"hostNetwork":     true,
			"taintLostNodes":  s.opts.TaintLostNodes,
			"nodeGracePeriod": AgentGracePeriod.String(),
		},
		"node": map[string]any{
			"extraVolumes":      []any{map[string]any{"name": "drbdsim", "hostPath": map[string]any{"path": standInDir, "type": "Directory"}}},
			"extraVolumeMounts": []any{map[string]any{"name": "drbdsim", "mountPath": "/usr/local/sbin", "readOnly": true}},
		},
		"defaultStorage": map[string]any{
			"enabled": true,
			"pool":    map[string]any{"name": PoolName, "type": "File", "file": map[string]any{"directory": "/var/lib/meshvol/pool"}},
			"classes": classes,
		},
	}
	b, err := json.MarshalIndent(values, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(s.opts.Dir, "values.yaml")
	return p, os.WriteFile(p, b, 0o644) // JSON is YAML
}

// helm runs bin/k8s/helm against the cluster.
func (s *Sandbox) helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.Kube.BinDir, "helm"), append(args, "--kubeconfig", s.Kube.Kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(s.opts.Dir, "helm", "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(s.opts.Dir, "helm", "config"), "HELM_DATA_HOME="+filepath.Join(s.opts.Dir, "helm", "data"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// waitRelease waits until the controller Deployment and the node DaemonSet
// have every pod Running and Ready.
func (s *Sandbox) waitRelease(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var deps appsv1.DeploymentList
		var dss appsv1.DaemonSetList
		ready := true
		var state []string
		if err := s.Client.List(ctx, &deps, client.InNamespace(ReleaseNamespace)); err != nil {
			return err
		}
		if err := s.Client.List(ctx, &dss, client.InNamespace(ReleaseNamespace)); err != nil {
			return err
		}
		for _, d := range deps.Items {
			want := int32(1)
			if d.Spec.Replicas != nil {
				want = *d.Spec.Replicas
			}
			// The status of this generation (a Deployment just changed still
			// shows the last one's), and no pod of an older template left.
			ready = ready && d.Status.ObservedGeneration >= d.Generation &&
				d.Status.ReadyReplicas == want && d.Status.UpdatedReplicas == want && d.Status.Replicas == want
			state = append(state, fmt.Sprintf("Deployment %s %d/%d", d.Name, d.Status.ReadyReplicas, want))
		}
		for _, d := range dss.Items {
			ready = ready && d.Status.ObservedGeneration >= d.Generation &&
				d.Status.DesiredNumberScheduled > 0 && d.Status.NumberReady == d.Status.DesiredNumberScheduled && d.Status.UpdatedNumberScheduled == d.Status.DesiredNumberScheduled
			state = append(state, fmt.Sprintf("DaemonSet %s %d/%d", d.Name, d.Status.NumberReady, d.Status.DesiredNumberScheduled))
		}
		if ready && len(deps.Items) > 0 && len(dss.Items) > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: the release is not Ready within %s: %s\n%s", timeout, strings.Join(state, ", "), s.whyNotReady(ctx))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// whyNotReady says what keeps the release's pods from Ready, for the error
// of a release that is not: the pods, each node's Ready condition and taints
// (the scheduler's and the kubelet's view: a node NotReady or tainted keeps
// the controller's pods, which tolerate nothing, Pending), and the events of
// every pod that is not Ready (FailedScheduling, FailedMount, a sandbox that
// containerd could not create).
func (s *Sandbox) whyNotReady(ctx context.Context) string {
	var b strings.Builder
	out, _ := s.Kube.Kubectl(ctx, "-n", ReleaseNamespace, "get", "pods", "-o", "wide")
	b.WriteString(out)
	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes); err != nil {
		fmt.Fprintf(&b, "nodes: %v\n", err)
	}
	for _, n := range nodes.Items {
		ready := "no Ready condition"
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = fmt.Sprintf("Ready=%s (%s: %s, since %s)", c.Status, c.Reason, c.Message, c.LastTransitionTime.UTC().Format(time.TimeOnly))
			}
		}
		var taints []string
		for _, t := range n.Spec.Taints {
			taints = append(taints, t.ToString())
		}
		fmt.Fprintf(&b, "node %s: %s; unschedulable %t; taints [%s]\n", n.Name, ready, n.Spec.Unschedulable, strings.Join(taints, ", "))
	}
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(ReleaseNamespace)); err != nil {
		fmt.Fprintf(&b, "pods: %v\n", err)
	}
	for _, p := range pods.Items {
		if podReady(&p) {
			continue
		}
		out, _ := s.Kube.Kubectl(ctx, "-n", ReleaseNamespace, "describe", "pod", p.Name)
		if i := strings.Index(out, "\nEvents:"); i >= 0 {
			out = out[i+1:] // the events say why; the rest is the manifest
		}
		fmt.Fprintf(&b, "pod %s on %q, not Ready: %s", p.Name, p.Spec.NodeName, out)
	}
	return b.String()
}

// ReleasePods lists the release's pods of a component (controller, node).
func (s *Sandbox) ReleasePods(ctx context.Context, component string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := s.Client.List(ctx, &pods, client.InNamespace(ReleaseNamespace), client.MatchingLabels{"app.kubernetes.io/component": component})
	return pods.Items, err
}

// controllerSocket is the CSI controller socket of a Ready controller pod
// as the machine sees it (in the pod's emptyDir, under its node's kubelet
// directory), through a link in the sandbox's directory.
func (s *Sandbox) controllerSocket(ctx context.Context) (string, error) {
	return s.linkControllerSocket(ctx, filepath.Join(s.opts.Dir, "csi-controller.sock"))
}

// linkControllerSocket points link at the CSI controller socket of a Ready
// controller pod and returns link.
func (s *Sandbox) linkControllerSocket(ctx context.Context, link string) (string, error) {
	pods, err := s.ReleasePods(ctx, "controller")
	if err != nil {
		return "", err
	}
	for _, p := range pods {
		kn := s.Kube.Node(p.Spec.NodeName)
		if kn == nil || !podReady(&p) || p.DeletionTimestamp != nil {
			continue
		}
		sock := filepath.Join(kn.KubeletRootDir, "pods", string(p.UID), "volumes", "kubernetes.io~empty-dir", "socket-dir", "csi.sock")
		// A unix socket's path must fit in 108 bytes; a symlink to it is
		// resolved without that limit.
		_ = os.Remove(link)
		return link, os.Symlink(sock, link)
	}
	return "", errors.New("sandbox: no controller pod is Ready")
}

// Handover is a leader hand-over of the controller: the pod that led, the
// one that took over, and how long the Lease had no live holder.
type Handover struct {
	OldLeader, NewLeader string
	// Took runs from the old leader's pod deletion to the Lease naming
	// the new leader.
	Took time.Duration
}

// leaseHolder is the controller's leader-election Lease holder: the
// identity controller-runtime writes, "<host name>_<uuid>", and the host
// name of a host-network pod is its node's.
func (s *Sandbox) leaseHolder(ctx context.Context) (string, error) {
	var l coordinationv1.Lease
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: controller.LeaderElectionID}, &l); err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// LeaderHandover ends the leading controller and times until another
// replica holds the Lease, then waits for the Deployment to be whole
// again. crash false deletes the leader's pod as `kubectl delete pod` does,
// with its own grace period: the kubelet sends SIGTERM and the leader gives
// its Lease up as it exits. Not with grace period 0: that removes the pod
// object at once while its process still runs, and the scheduler, which
// counts a host-network pod's ports only while its object exists, may then
// place the Deployment's replacement on the same node, where it fails to
// bind the health port the old process still holds. crash true SIGKILLs
// the leader's process, as a crash would end it, so the Lease must expire
// first (the kubelet then restarts the container).
func (s *Sandbox) LeaderHandover(ctx context.Context, crash bool) (*Handover, error) {
	if s.simd == nil {
		return nil, errors.New("sandbox: the leader hand-over needs the installed sandbox (Options.Image)")
	}
	holder, err := s.leaseHolder(ctx)
	if err != nil || holder == "" {
		return nil, fmt.Errorf("sandbox: no controller leads (Lease %s/%s: %v)", ReleaseNamespace, controller.LeaderElectionID, err)
	}
	node, _, _ := strings.Cut(holder, "_")
	pods, err := s.ReleasePods(ctx, "controller")
	if err != nil {
		return nil, err
	}
	var leader *corev1.Pod
	for i := range pods {
		if pods[i].Spec.NodeName == node {
			leader = &pods[i]
		}
	}
	if leader == nil {
		return nil, fmt.Errorf("sandbox: the Lease holder %s names node %s, where no controller pod runs", holder, node)
	}
	h := &Handover{OldLeader: leader.Name}
	began := time.Now()
	if crash {
		if err := s.killContainer(leader, "meshvol"); err != nil {
			return nil, err
		}
	} else {
		if err := s.Client.Delete(ctx, leader); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		now, err := s.leaseHolder(ctx)
		if err == nil && now != "" && now != holder {
			h.Took = time.Since(began)
			// The new holder's pod: on its node, not the deleted one (the
			// Deployment's replacement may be on the same node, and win).
			n, _, _ := strings.Cut(now, "_")
			current, _ := s.ReleasePods(ctx, "controller")
			for _, p := range current {
				if p.Spec.NodeName == n && (crash || p.Name != leader.Name) {
					h.NewLeader = p.Name
				}
			}
			break
		}
		if time.Now().After(deadline) {
			return h, fmt.Errorf("sandbox: no new leader 2 minutes after %s was deleted (holder %q)", leader.Name, now)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := s.waitRelease(ctx, 2*time.Minute); err != nil {
		return h, err
	}
	s.ControllerSocket, err = s.controllerSocket(ctx)
	return h, err
}

// PoolFiles lists the files of every node's storage pool: the backing
// files of its replicas.
func (s *Sandbox) PoolFiles() []string {
	var out []string
	if s.Mesh != nil {
		for _, n := range s.Mesh.Nodes {
			out = append(out, n.Files()...)
		}
		return out
	}
	if s.Kube == nil {
		return nil // the cluster never started
	}
	for _, n := range s.Kube.Nodes {
		_ = filepath.Walk(filepath.Join(n.StateDir(), "pool"), func(p string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// DRBDResources lists the DRBD resources a node's simulated kernel runs.
func (s *Sandbox) DRBDResources(ctx context.Context, node string) ([]string, error) {
	st, err := s.Sim.Node(node).Status(ctx, "all")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range st {
		out = append(out, r.Name)
	}
	return out, nil
}

// DRBDRole is the role of resource in a node's simulated kernel ("Primary",
// "Secondary"), or "" when the node does not run it.
func (s *Sandbox) DRBDRole(ctx context.Context, node, resource string) (string, error) {
	st, err := s.Sim.Node(node).Status(ctx, "all")
	if err != nil {
		return "", err
	}
	for _, r := range st {
		if r.Name == resource {
			return r.Role, nil
		}
	}
	return "", nil
}

// ContainerReport is what one container of the release did over the
// sandbox's life: its restarts, the peak of its memory use (its cgroup's
// high-water mark) and the lines of its logs that say "forbidden" (the
// apiserver refusing a request the RBAC rules do not allow). After a
// restart, LastExit and PreviousLog say why the last one ended: the
// kubelet's record of its termination and the end of its log.
type ContainerReport struct {
	Pod, Container, Node string
	Restarts             int32
	PeakMemory           int64 // bytes; 0 when the cgroup is gone
	MemoryLimit          string
	Forbidden            []string
	LastExit             string
	PreviousLog          []string
}

// previousLogLines is how much of a restarted container's previous log a
// ContainerReport keeps.
const previousLogLines = 30

// ReleaseReport reports every container of the release's pods, those of
// crashed nodes included.
func (s *Sandbox) ReleaseReport(ctx context.Context) ([]ContainerReport, error) {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(ReleaseNamespace)); err != nil {
		return nil, err
	}
	var out []ContainerReport
	for _, p := range pods.Items {
		kn := s.Kube.Node(p.Spec.NodeName)
		if kn == nil {
			continue
		}
		limits := map[string]string{}
		for _, c := range p.Spec.Containers {
			if l, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				limits[c.Name] = l.String()
			}
		}
		for _, cs := range p.Status.ContainerStatuses {
			r := ContainerReport{Pod: p.Name, Container: cs.Name, Node: kn.Name, Restarts: cs.RestartCount, MemoryLimit: limits[cs.Name]}
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			if id != "" {
				r.PeakMemory = peakMemory(kn.CgroupRoot, id)
			}
			logDir := filepath.Join(kn.Dir, "pod-logs", fmt.Sprintf("%s_%s_%s", p.Namespace, p.Name, p.UID), cs.Name)
			logs, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
			for _, l := range logs {
				b, err := os.ReadFile(l)
				if err != nil {
					continue
				}
				for _, line := range strings.Split(string(b), "\n") {
					if strings.Contains(line, "forbidden") {
						r.Forbidden = append(r.Forbidden, line)
					}
				}
			}
			if t := cs.LastTerminationState.Terminated; t != nil {
				r.LastExit = fmt.Sprintf("%s, exit code %d, signal %d, at %s", t.Reason, t.ExitCode, t.Signal, t.FinishedAt.UTC().Format(time.RFC3339))
				if t.Message != "" {
					r.LastExit += ": " + t.Message
				}
			}
			if cs.RestartCount > 0 {
				// The kubelet names a container's logs by its restart
				// count: the previous run's is one below the current.
				r.PreviousLog = lastLines(filepath.Join(logDir, fmt.Sprintf("%d.log", cs.RestartCount-1)), previousLogLines)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

// lastLines is the last n lines of the file at p; none when it cannot be
// read.
func lastLines(p string, n int) []string {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return lines[max(0, len(lines)-n):]
}

// peakMemory is the high-water mark of the memory cgroup of container id
// under a node's cgroup root: memory.peak (cgroup v2) or
// memory.max_usage_in_bytes (v1).
func peakMemory(cgroupRoot, id string) int64 {
	dir := containerCgroup(cgroupRoot, id)
	for _, f := range []string{"memory.peak", "memory.max_usage_in_bytes"} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			var v int64
			fmt.Sscan(strings.TrimSpace(string(b)), &v)
			return v
		}
	}
	return 0
}

// containerCgroup is the memory cgroup directory of container id under a
// node's cgroup root (the kubelet's cgroupfs layout,
// kubepods/<class>/pod<uid>/<id>); empty when there is none.
func containerCgroup(cgroupRoot, id string) string {
	for _, hier := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
		found := ""
		_ = filepath.WalkDir(filepath.Join(hier, cgroupRoot), func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || found != "" {
				return nil
			}
			if filepath.Base(p) == id {
				found = p
				return filepath.SkipDir
			}
			return nil
		})
		if found != "" {
			return found
		}
	}
	return ""
}

// detachPoolLoops detaches the loop devices the node pods attached to
// their pools' files: loop devices are the machine's, and outlive the pods
// and the nodes' namespaces. losetup -j finds them by the file's device
// and inode (the path a device records is the one the pod saw).
func (s *Sandbox) detachPoolLoops() error {
	var errs []error
	for _, f := range s.PoolFiles() {
		out, err := exec.Command("losetup", "-j", f).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			dev, _, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			if b, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("sandbox: losetup -d %s (over %s): %v: %s", dev, f, err, strings.TrimSpace(string(b))))
			}
		}
	}
	return errors.Join(errs...)
}

// killContainer SIGKILLs every process of a pod's container (its cgroup's).
func (s *Sandbox) killContainer(p *corev1.Pod, container string) error {
	kn := s.Kube.Node(p.Spec.NodeName)
	var id string
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == container {
			_, id, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if kn == nil || id == "" {
		return fmt.Errorf("sandbox: pod %s has no running container %s", p.Name, container)
	}
	dir := containerCgroup(kn.CgroupRoot, id)
	if dir == "" {
		return fmt.Errorf("sandbox: no cgroup of container %s of pod %s", container, p.Name)
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	killed := 0
	for _, f := range strings.Fields(string(b)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 0 && syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	if killed == 0 {
		return fmt.Errorf("sandbox: container %s of pod %s has no process to kill", container, p.Name)
	}
	return nil
}

// CopyReleaseLogs copies the container logs of the release's pods on every node,
// those of a crashed or partitioned node included (they are files of the node's
// directory, read from this machine), into dst/<node>/<namespace>_<pod>_<uid>/
// <container>/<n>.log. A crashed node's pods are gone from its kubelet once it boots
// again and the pods' objects are deleted, and their logs with them: a benchmark keeps
// them per run this way, while the node still has them.
func (s *Sandbox) CopyReleaseLogs(dst string) error {
	var errs []error
	for _, kn := range s.Kube.Nodes {
		src := filepath.Join(kn.Dir, "pod-logs")
		pods, _ := filepath.Glob(filepath.Join(src, ReleaseNamespace+"_*"))
		for _, pod := range pods {
			err := filepath.WalkDir(pod, func(p string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() || !strings.HasSuffix(p, ".log") {
					return nil // a log rotated or removed meanwhile: the others still count
				}
				rel, err := filepath.Rel(src, p)
				if err != nil {
					return err
				}
				return copyFile(p, filepath.Join(dst, kn.Name, rel))
			})
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return nil // gone meanwhile
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
