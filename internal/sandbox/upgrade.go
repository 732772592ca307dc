package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
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
// version — under the tag version. root may be this repository or another
// commit's tree (ExportRevision). It returns the archive and reference.
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
	commit := gitOutput(ctx, root, "unknown", "rev-parse", "--short", "HEAD")
	if b, err := os.ReadFile(filepath.Join(root, exportedCommitFile)); err == nil {
		commit = strings.TrimSpace(string(b))
	}
	if err := buildMeshvol(ctx, root, version, commit, bin); err != nil {
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

// PreviousRevision is the commit an upgrade to the tree at root starts from,
// as a user's cluster runs the release before this one: where the tree's
// branch left main (git merge-base HEAD main), or, on main itself, HEAD's
// first parent. It returns the full commit id.
func PreviousRevision(ctx context.Context, root string) (string, error) {
	head := gitOutput(ctx, root, "", "rev-parse", "HEAD")
	if head == "" {
		return "", fmt.Errorf("sandbox: %s is not a git checkout: no previous commit to upgrade from", root)
	}
	if base := gitOutput(ctx, root, "", "merge-base", "HEAD", "main"); base != "" && base != head {
		return base, nil
	}
	if parent := gitOutput(ctx, root, "", "rev-parse", "HEAD^"); parent != "" {
		return parent, nil
	}
	return "", fmt.Errorf("sandbox: HEAD (%s) of %s has no parent to upgrade from", head, root)
}

// exportedCommitFile, in a tree ExportRevision wrote, names its commit (the
// tree has no .git for BuildImage to ask).
const exportedCommitFile = ".meshvol-commit"

// ExportRevision writes the files of commit rev of the repository at root
// into dir (git archive): another commit's chart and sources, to build and
// install beside this tree's.
func ExportRevision(ctx context.Context, root, rev, dir string) error {
	archive := exec.CommandContext(ctx, "git", "archive", "--format=tar", rev)
	archive.Dir = root
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var archiveErr, untarErr strings.Builder
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return fmt.Errorf("sandbox: git archive %s: %w: %s", rev, err, archiveErr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("sandbox: unpacking git archive %s into %s: %w: %s", rev, dir, err, untarErr.String())
	}
	short := gitOutput(ctx, root, rev, "rev-parse", "--short", rev)
	return os.WriteFile(filepath.Join(dir, exportedCommitFile), []byte(short+"\n"), 0o644)
}

// HelmUpgrade imports the image archive (named ref) into every node and
// runs `helm upgrade --reuse-values` of this tree's chart to it, watching
// the rollout until the release is Ready on the new image.
func (s *Sandbox) HelmUpgrade(ctx context.Context, archive, ref string) (*Upgrade, error) {
	return s.HelmUpgradeChart(ctx, s.chartDir(), archive, ref)
}

// HelmUpgradeChart is HelmUpgrade with the chart in chartDir (another
// commit's, ExportRevision).
func (s *Sandbox) HelmUpgradeChart(ctx context.Context, chartDir, archive, ref string) (*Upgrade, error) {
	if err := s.Kube.ImportImage(ctx, archive); err != nil {
		return nil, err
	}
	from, err := s.releaseImage(ctx)
	if err != nil {
		return nil, err
	}
	repo, tag := splitRef(ref)
	up := &Upgrade{From: from, To: ref, MinNodeReady: -1}
	began := time.Now()
	if out, err := s.helm(ctx, "upgrade", ReleaseName, chartDir, "--namespace", ReleaseNamespace, "--reuse-values",
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

// releaseImage is the image the release's node DaemonSet runs now.
func (s *Sandbox) releaseImage(ctx context.Context) (string, error) {
	var dss appsv1.DaemonSetList
	if err := s.Client.List(ctx, &dss, client.InNamespace(ReleaseNamespace)); err != nil {
		return "", err
	}
	for _, ds := range dss.Items {
		for _, c := range ds.Spec.Template.Spec.Containers {
			if c.Name == "meshvol" {
				return c.Image, nil
			}
		}
	}
	return "", fmt.Errorf("sandbox: no DaemonSet in %s runs a meshvol container", ReleaseNamespace)
}
