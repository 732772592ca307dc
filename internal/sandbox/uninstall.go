package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// Uninstall is what `helm uninstall` of the release did.
type Uninstall struct {
	// Objects is how many objects the release's manifest held.
	Objects int
	// Took runs from `helm uninstall` to nothing of the release left.
	Took time.Duration
	// Left lists what of the release is still there when it gave up
	// waiting: objects of its manifest, its pods, the node plugin's
	// sockets, the kubelets' registrations of the driver, mounts of its
	// pods on the nodes.
	Left []string
}

// HelmUninstall runs `helm uninstall` of the release and waits until
// nothing it made is left (docs/install.md, "Uninstalling"): every object
// of its manifest gone, its pods and their mounts on the nodes, the node
// plugin's CSI and registration sockets, the driver in every CSINode. What
// the chart does not own stays: its CRDs (crds/), and so every volume's
// ReplicatedVolume, its replicas, its PersistentVolume, its backing files
// and its DRBD resources in the nodes' kernels.
func (s *Sandbox) HelmUninstall(ctx context.Context) (*Uninstall, error) {
	if s.simd == nil {
		return nil, errors.New("sandbox: helm uninstall needs the installed sandbox (Options.Image)")
	}
	manifest, err := s.helm(ctx, "get", "manifest", ReleaseName, "--namespace", ReleaseNamespace)
	if err != nil {
		return nil, fmt.Errorf("sandbox: helm get manifest: %w\n%s", err, manifest)
	}
	objs, err := manifestObjects(manifest)
	if err != nil {
		return nil, err
	}
	var podUIDs []string
	for _, c := range []string{"controller", "node"} {
		pods, err := s.ReleasePods(ctx, c)
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			podUIDs = append(podUIDs, string(p.UID))
		}
	}
	u := &Uninstall{Objects: len(objs)}
	began := time.Now()
	if out, err := s.helm(ctx, "uninstall", ReleaseName, "--namespace", ReleaseNamespace, "--wait", "--timeout", "2m"); err != nil {
		return nil, fmt.Errorf("sandbox: helm uninstall: %w\n%s", err, out)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		u.Left, err = s.releaseLeft(ctx, objs, podUIDs)
		if err != nil {
			return u, err
		}
		if len(u.Left) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return u, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	u.Took = time.Since(began)
	return u, nil
}

// HelmReinstall installs the release again, as after HelmUninstall, with
// the sandbox's values and image.
func (s *Sandbox) HelmReinstall(ctx context.Context) error {
	ref, err := imageRef(s.opts.Image)
	if err != nil {
		return err
	}
	return s.install(ctx, ref)
}

// manifestObjects lists the objects of a rendered manifest (YAML documents).
func manifestObjects(manifest string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(manifest)), 4096)
	for {
		var o unstructured.Unstructured
		if err := dec.Decode(&o.Object); err != nil {
			if err == io.EOF {
				return out, nil
			}
			return nil, fmt.Errorf("sandbox: the release's manifest: %w", err)
		}
		if len(o.Object) > 0 {
			out = append(out, &o)
		}
	}
}

// releaseLeft lists what of the release is still there.
func (s *Sandbox) releaseLeft(ctx context.Context, objs []*unstructured.Unstructured, podUIDs []string) ([]string, error) {
	var left []string
	for _, o := range objs {
		cur := &unstructured.Unstructured{}
		cur.SetGroupVersionKind(o.GroupVersionKind())
		ns := o.GetNamespace()
		if ns == "" && namespaced(o.GetKind()) {
			ns = ReleaseNamespace
		}
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: o.GetName()}, cur)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, err
		default:
			what := o.GetKind() + " " + o.GetName()
			if cur.GetDeletionTimestamp() != nil {
				what += fmt.Sprintf(" (being deleted, finalizers %v)", cur.GetFinalizers())
			}
			left = append(left, what)
		}
	}
	for _, c := range []string{"controller", "node"} {
		pods, err := s.ReleasePods(ctx, c)
		if err != nil {
			return nil, err
		}
		for _, p := range pods {
			left = append(left, "Pod "+p.Name+" on "+p.Spec.NodeName)
		}
	}
	for _, n := range s.Kube.Nodes {
		if n.Crashed() {
			continue
		}
		for _, sock := range []string{
			filepath.Join(n.PluginDir(v1.CSIDriverName), "csi.sock"),
			filepath.Join(n.PluginsRegistryDir(), v1.CSIDriverName+"-reg.sock"),
		} {
			if _, err := os.Lstat(sock); err == nil {
				left = append(left, "socket "+sock)
			}
		}
		// The controller's taints of a node it judged lost (docs/controller.md, "Node
		// lifecycle"): only the controller takes them off again, so one left after it
		// is gone keeps the controller's own pods, which tolerate neither, off the node
		// when it is installed again.
		var node corev1.Node
		if err := s.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err == nil {
			for _, t := range node.Spec.Taints {
				if t.Key == controller.TaintLost.Key || t.Key == controller.TaintOutOfService.Key {
					left = append(left, "taint "+t.ToString()+" on node "+n.Name)
				}
			}
		}
		var cn storagev1.CSINode
		if err := s.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &cn); err == nil {
			for _, d := range cn.Spec.Drivers {
				if d.Name == v1.CSIDriverName {
					left = append(left, "CSINode "+n.Name+" lists "+d.Name)
				}
			}
		}
		if b, err := os.ReadFile(n.MountInfo()); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				for _, uid := range podUIDs {
					if strings.Contains(line, uid) {
						left = append(left, "mount on "+n.Name+": "+line)
					}
				}
			}
		}
	}
	return left, nil
}

// namespaced says whether a kind of the chart's lives in a namespace (Helm
// leaves the namespace of namespaced objects out of the manifest when it
// is the release's).
func namespaced(kind string) bool {
	switch kind {
	case "ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass", "ReplicatedStorageClass",
		"ReplicatedStoragePool", "PriorityClass", "Namespace", "CustomResourceDefinition":
		return false
	}
	return true
}
