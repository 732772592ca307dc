package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/ociimage"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// UpgradeEvent is one moment of a `helm upgrade`'s rollout: a node pod
// going or Ready, and how many node pods were Ready then.
type UpgradeEvent struct {
	At    time.Duration
	What  string
	Ready int
}

// Upgrade is what `helm upgrade` to another image did.
type Upgrade struct {
	From, To string
	Took     time.Duration
	Timeline []UpgradeEvent
	// MinNodeReady is the fewest node pods Ready at once during the
	// rollout (the DaemonSet's maxUnavailable 1: nodes-1).
	MinNodeReady int
}

// RetagImage writes a copy of the meshvol image archive under another tag,
// the image of a second build to upgrade to, and returns its path and
// reference.
func (s *Sandbox) RetagImage(tag string) (archive, ref string, err error) {
	from, err := imageRef(s.opts.Image)
	if err != nil {
		return "", "", err
	}
	repo, _ := splitRef(from)
	ref = repo + ":" + tag
	img, cleanup, err := ociimage.Read(s.opts.Image)
	if err != nil {
		return "", "", err
	}
	defer cleanup()
	archive = filepath.Join(s.opts.Dir, "images", "meshvol-"+tag+".tar")
	if err := os.MkdirAll(filepath.Dir(archive), 0o755); err != nil {
		return "", "", err
	}
	return archive, ref, ociimage.WriteArchive(img, ref, archive)
}

// HelmUpgrade imports the image archive (named ref) into every node and
// runs `helm upgrade --reuse-values` to it, watching the rollout until the
// release is Ready on the new image.
func (s *Sandbox) HelmUpgrade(ctx context.Context, archive, ref string) (*Upgrade, error) {
	if err := s.Kube.ImportImage(ctx, archive); err != nil {
		return nil, err
	}
	from, err := imageRef(s.opts.Image)
	if err != nil {
		return nil, err
	}
	repo, tag := splitRef(ref)
	up := &Upgrade{From: from, To: ref, MinNodeReady: -1}
	began := time.Now()
	if out, err := s.helm(ctx, "upgrade", ReleaseName, s.chartDir(), "--namespace", ReleaseNamespace, "--reuse-values",
		"--set", "image.repository="+repo, "--set", "image.tag="+tag); err != nil {
		return nil, fmt.Errorf("sandbox: helm upgrade: %w\n%s", err, out)
	}
	seen := map[string]string{} // node pod → last state
	deadline := time.Now().Add(5 * time.Minute)
	for {
		pods, err := s.releasePods(ctx, "node")
		if err != nil {
			return up, err
		}
		ready, onNew := 0, 0
		now := map[string]string{}
		for _, p := range pods {
			st := "starting"
			if p.DeletionTimestamp != nil {
				st = "terminating"
			} else if podReady(&p) {
				st = "Ready"
				ready++
			}
			image := ""
			if len(p.Spec.Containers) > 0 {
				image = p.Spec.Containers[0].Image
			}
			if st == "Ready" && image == ref {
				onNew++
			}
			now[p.Name] = st + " on " + p.Spec.NodeName + " (" + image + ")"
		}
		if up.MinNodeReady < 0 || ready < up.MinNodeReady {
			up.MinNodeReady = ready
		}
		var changes []string
		for name, st := range now {
			if seen[name] != st {
				changes = append(changes, name+" "+st)
			}
		}
		for name := range seen {
			if _, ok := now[name]; !ok {
				changes = append(changes, name+" gone")
			}
		}
		sort.Strings(changes)
		for _, c := range changes {
			up.Timeline = append(up.Timeline, UpgradeEvent{At: time.Since(began), What: c, Ready: ready})
		}
		seen = now
		var ds appsv1.DaemonSetList
		if err := s.Client.List(ctx, &ds, client.InNamespace(ReleaseNamespace)); err != nil {
			return up, err
		}
		live := 0
		for _, n := range s.Kube.Nodes {
			if !n.Crashed() {
				live++
			}
		}
		if onNew == live && len(pods) == live {
			break
		}
		if time.Now().After(deadline) {
			return up, fmt.Errorf("sandbox: the node pods are not all Ready on %s 5 minutes after helm upgrade: %s", ref, strings.Join(changes, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := s.waitRelease(ctx, 3*time.Minute); err != nil {
		return up, err
	}
	up.Took = time.Since(began)
	s.ControllerSocket, err = s.controllerSocket(ctx)
	return up, err
}

// Uninstall is what `helm uninstall` left on the cluster.
type Uninstall struct {
	// CRDs of storage.meshvol.io still installed (Helm never deletes a
	// chart's crds/).
	CRDs []string
	// Volumes (RVs) and their PersistentVolumes still there.
	Volumes, PersistentVolumes int
	// DRBD resources still running on the nodes (the kernel's, not the
	// chart's: nothing takes them down).
	DRBDResources int
	// PodsLeft of the release, once the uninstall is done (none).
	PodsLeft int
}

// HelmUninstall runs `helm uninstall` of the release, waits for its pods
// to go, and reports what is left.
func (s *Sandbox) HelmUninstall(ctx context.Context) (*Uninstall, error) {
	if out, err := s.helm(ctx, "uninstall", ReleaseName, "--namespace", ReleaseNamespace, "--wait", "--timeout", "2m"); err != nil {
		return nil, fmt.Errorf("sandbox: helm uninstall: %w\n%s", err, out)
	}
	u := &Uninstall{}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := s.releasePods(ctx, "node")
		if err != nil {
			return nil, err
		}
		ctrl, err := s.releasePods(ctx, "controller")
		if err != nil {
			return nil, err
		}
		live := 0
		for _, p := range append(pods, ctrl...) {
			if n := s.Kube.Node(p.Spec.NodeName); n == nil || !n.Crashed() {
				live++
			}
		}
		u.PodsLeft = live
		if live == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := s.Client.List(ctx, &crds); err != nil {
		return nil, err
	}
	for _, c := range crds.Items {
		if c.Spec.Group == v1.GroupName {
			u.CRDs = append(u.CRDs, c.Name)
		}
	}
	var rvs v1.ReplicatedVolumeList
	if err := s.Client.List(ctx, &rvs); err != nil {
		return nil, err
	}
	u.Volumes = len(rvs.Items)
	var pvs corev1.PersistentVolumeList
	if err := s.Client.List(ctx, &pvs); err != nil {
		return nil, err
	}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == v1.CSIDriverName {
			u.PersistentVolumes++
		}
	}
	for _, n := range s.Kube.Nodes {
		if n.Crashed() {
			continue
		}
		if res, err := s.DRBDResources(ctx, n.Name); err == nil {
			u.DRBDResources += len(res)
		}
	}
	return u, nil
}
