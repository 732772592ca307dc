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
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/ociimage"
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

// BuildImage writes the image of another build of meshvol: the sandbox's
// image with, on top, ./cmd/meshvol of root built as hack/image.sh builds
// it but stamped version — a binary with other bytes that reports another
// version — under the tag version. It returns the archive and reference.
func (s *Sandbox) BuildImage(ctx context.Context, root, version string) (archive, ref string, err error) {
	from, err := imageRef(s.opts.Image)
	if err != nil {
		return "", "", err
	}
	repo, _ := splitRef(from)
	ref = repo + ":" + version
	dir := filepath.Join(s.opts.Dir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", err
	}
	bin := filepath.Join(dir, "meshvol-"+version)
	if err := buildMeshvol(ctx, root, version, gitOutput(ctx, root, "unknown", "rev-parse", "--short", "HEAD"), bin); err != nil {
		return "", "", err
	}
	img, cleanup, err := ociimage.Read(s.opts.Image)
	if err != nil {
		return "", "", err
	}
	defer cleanup()
	img, err = ociimage.AppendFiles(img, []ociimage.File{{Path: imageBinary, Source: bin, Mode: 0o755}})
	if err != nil {
		return "", "", err
	}
	archive = filepath.Join(dir, "meshvol-"+version+".tar")
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
		pods, err := s.ReleasePods(ctx, "node")
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
