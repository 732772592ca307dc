package kubecluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// The images every node has. No registry is reachable here, so they are
// built on the machine as OCI archives and imported into each node's
// containerd; their tags are not "latest", so the kubelet's default pull
// policy (IfNotPresent) never tries to pull them.
const (
	// PauseImage is containerd's sandbox_image: the pod infrastructure
	// container, internal/kubecluster/pause.
	PauseImage = "meshvol.local/pause:1"
	// BusyboxImage is the workload image for the sandbox's and the tests'
	// pods: Debian's busybox-static with a link per applet.
	BusyboxImage = "meshvol.local/busybox:1"
)

// imageFile is one entry of an image's only layer.
type imageFile struct {
	path    string // inside the image, without the leading slash
	mode    int64  // permission bits; a directory when dir
	dir     bool
	link    string // symlink target when not empty
	content []byte
}

// imageSpec is what an image needs: a reference and a root file system.
type imageSpec struct {
	ref        string // repository:tag
	files      []imageFile
	entrypoint []string
	cmd        []string
}

// pauseImage is the pause program at pausePath as /pause.
func pauseImage(pausePath string) (imageSpec, error) {
	b, err := os.ReadFile(pausePath)
	if err != nil {
		return imageSpec{}, fmt.Errorf("kubecluster: the pause program for %s: %w", PauseImage, err)
	}
	return imageSpec{
		ref:        PauseImage,
		files:      []imageFile{{path: "pause", mode: 0o755, content: b}},
		entrypoint: []string{"/pause"},
	}, nil
}

// busyboxImage is a static busybox as /bin/busybox with a symlink per applet
// it lists, and the directories a shell session expects.
func busyboxImage(busyboxPath string) (imageSpec, error) {
	b, err := os.ReadFile(busyboxPath)
	if err != nil {
		return imageSpec{}, fmt.Errorf("kubecluster: busybox for %s (Debian package busybox-static): %w", BusyboxImage, err)
	}
	out, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return imageSpec{}, fmt.Errorf("kubecluster: %s --list: %w", busyboxPath, err)
	}
	files := []imageFile{
		{path: "bin", dir: true, mode: 0o755},
		{path: "tmp", dir: true, mode: 0o1777},
		{path: "etc", dir: true, mode: 0o755},
		{path: "etc/passwd", mode: 0o644, content: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{path: "etc/group", mode: 0o644, content: []byte("root:x:0:\n")},
		{path: "bin/busybox", mode: 0o755, content: b},
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		files = append(files, imageFile{path: "bin/" + applet, mode: 0o777, link: "busybox"})
	}
	return imageSpec{ref: BusyboxImage, files: files, cmd: []string{"/bin/sh"}}, nil
}

// writeOCIArchive writes spec as an OCI image layout in a tar file at path,
// the format `ctr images import` reads, with the image named by the
// io.containerd.image.name annotation.
func writeOCIArchive(path string, spec imageSpec) error {
	layer, err := layerTar(spec.files)
	if err != nil {
		return err
	}
	layerDigest := digest(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Entrypoint": spec.entrypoint,
			"Cmd":        spec.cmd,
			"Env":        []string{"PATH=/bin"},
		},
		// The layer is stored uncompressed, so its diff ID is its digest.
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer)},
	})
	if err != nil {
		return err
	}
	repo, tag, ok := strings.Cut(spec.ref, ":")
	if !ok {
		return fmt.Errorf("kubecluster: image reference %q has no tag", spec.ref)
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["platform"] = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	md["annotations"] = map[string]string{
		"io.containerd.image.name":          "docker.io/" + repo + ":" + tag,
		"org.opencontainers.image.ref.name": tag,
	}
	// containerd normalizes a reference without a registry host to
	// docker.io; a name with a dot in its first element is a host, so
	// repo stands as it is.
	if strings.Contains(strings.SplitN(repo, "/", 2)[0], ".") {
		md["annotations"].(map[string]string)["io.containerd.image.name"] = spec.ref
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return err
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	add := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	for _, e := range []struct {
		name string
		b    []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(config), config},
		{blobPath(manifest), manifest},
		{blobPath(layer), layer},
	} {
		if err := add(e.name, e.b); err != nil {
			f.Close()
			return fmt.Errorf("kubecluster: writing %s: %w", path, err)
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("kubecluster: writing %s: %w", path, err)
	}
	return f.Close()
}

// epoch is every entry's modification time: the same inputs give the same
// digests, so re-importing an unchanged image is a no-op for containerd.
var epoch = time.Unix(0, 0)

func layerTar(files []imageFile) ([]byte, error) {
	sorted := append([]imageFile(nil), files...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].path < sorted[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range sorted {
		h := &tar.Header{Name: f.path, Mode: f.mode, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.content))}
		switch {
		case f.dir:
			h.Typeflag, h.Name, h.Size = tar.TypeDir, f.path+"/", 0
		case f.link != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.link, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.content); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:")
}

func descriptor(mediaType string, b []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
}

// importImage imports an OCI archive into the containerd at address, in the
// namespace the CRI plugin uses, and unpacks it for the snapshotter.
func importImage(ctx context.Context, address, archive string, log io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ctr", "--address", address, "--namespace", "k8s.io", "images", "import", "--no-unpack=false", archive)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubecluster: ctr images import %s: %w: %s", filepath.Base(archive), err, bytes.TrimSpace(out))
	}
	if log != nil && len(bytes.TrimSpace(out)) > 0 {
		fmt.Fprintf(log, "%s", out)
	}
	return nil
}

// BuildPause compiles the pause program (this package's pause directory)
// into dir and returns its path: static, so it runs in an image with no
// libc. It needs the Go toolchain and meshvol's source tree, as tests and
// `make sandbox` have; an installed meshvol is given the binary instead.
func BuildPause(ctx context.Context, repoRoot, dir string) (string, error) {
	out := filepath.Join(dir, "pause")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./internal/kubecluster/pause")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubecluster: building the pause program: %w: %s", err, bytes.TrimSpace(b))
	}
	return out, nil
}

// WriteBusyboxImage writes an OCI archive at path of the image ref that
// holds the static busybox program at busyboxPath (Debian's busybox-static)
// with a link per applet: the image BusyboxImage is, under another name.
func WriteBusyboxImage(path, ref, busyboxPath string) error {
	spec, err := busyboxImage(busyboxPath)
	if err != nil {
		return err
	}
	spec.ref = ref
	return writeOCIArchive(path, spec)
}

// WriteBinaryImage writes an OCI archive at path of the image ref that holds
// only the static program bin, as /<its name>, its entrypoint (and an empty
// /tmp): what a CSI sidecar built from source needs to run in a pod.
func WriteBinaryImage(path, ref, bin string) error {
	b, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("kubecluster: the program of %s: %w", ref, err)
	}
	name := filepath.Base(bin)
	return writeOCIArchive(path, imageSpec{
		ref: ref,
		files: []imageFile{
			{path: "tmp", dir: true, mode: 0o1777},
			{path: name, mode: 0o755, content: b},
		},
		entrypoint: []string{"/" + name},
	})
}

// ImportImage imports an OCI archive into the containerd of every node
// that has not crashed, at once.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	return c.eachNode(func(n *Node) error {
		if n.crashed {
			return nil
		}
		if err := importImage(ctx, n.ContainerdAddress, archive, nil); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		return nil
	})
}
