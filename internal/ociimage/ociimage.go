// Package ociimage writes and checks OCI image archives without a container
// engine: a root filesystem directory and extra files become layers, a config
// with an entrypoint is added, and the result is an OCI image layout packed in a
// tar file, which `ctr images import`, `skopeo copy oci-archive:` and registries'
// push tools all take. `make image` builds meshvol's image with it; the sandbox
// builds its pause and workload images the same way.
//
// Nothing here needs root but Verify's run of the entrypoint, which chroots into
// the extracted image.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// File is one file placed into the image at Path (absolute) from Source on disk.
type File struct {
	Path   string
	Source string
	Mode   fs.FileMode
}

// Spec describes an image.
type Spec struct {
	// RootFS, when set, is a directory whose whole tree becomes the first layer
	// (a debootstrapped Debian, for example). Device nodes are skipped: a
	// container runtime provides /dev.
	RootFS string
	// Files become one more layer on top.
	Files []File
	// Entrypoint and Cmd are the image config's.
	Entrypoint []string
	Cmd        []string
	Env        []string
	Labels     map[string]string
	// Ref is the name recorded in the layout's index
	// (org.opencontainers.image.ref.name), e.g. "docker.io/meshvol/meshvol:v0.1.0";
	// `ctr images import` names the image after it.
	Ref string
	// Created stamps the config; the zero time keeps builds reproducible.
	Created time.Time
}

// Build makes the image described by spec.
func Build(spec Spec) (v1.Image, error) {
	if len(spec.Entrypoint) == 0 && len(spec.Cmd) == 0 {
		return nil, errors.New("ociimage: spec needs an Entrypoint or a Cmd")
	}
	var layers []v1.Layer
	if spec.RootFS != "" {
		l, err := layerFromTar(func(tw *tar.Writer) error { return addTree(tw, spec.RootFS) })
		if err != nil {
			return nil, fmt.Errorf("ociimage: rootfs %s: %w", spec.RootFS, err)
		}
		layers = append(layers, l)
	}
	if len(spec.Files) > 0 {
		l, err := layerFromTar(func(tw *tar.Writer) error { return addFiles(tw, spec.Files) })
		if err != nil {
			return nil, fmt.Errorf("ociimage: files: %w", err)
		}
		layers = append(layers, l)
	}
	if len(layers) == 0 {
		return nil, errors.New("ociimage: spec has neither a RootFS nor Files")
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = spec.Env
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cf.Config.Labels = spec.Labels
	return mutate.ConfigFile(img, cf)
}

// WriteArchive writes img as an OCI image layout packed in a tar file at out.
func WriteArchive(img v1.Image, ref, out string) error {
	var refs []string
	if ref != "" {
		refs = []string{ref}
	}
	return WriteArchiveRefs(img, refs, out)
}

// WriteArchiveRefs writes img as an OCI image layout packed in a tar file at
// out, named by every one of refs: `ctr images import` gives it each name,
// and stores its blobs once.
func WriteArchiveRefs(img v1.Image, refs []string, out string) error {
	dir, err := os.MkdirTemp("", "ociimage-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if len(refs) == 0 {
		if err := p.AppendImage(img); err != nil {
			return err
		}
	}
	for _, ref := range refs {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
			return err
		}
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	if err := addTree(tw, dir); err != nil {
		f.Close()
		return err
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// Read opens the single image of an OCI archive written by WriteArchive (or any
// OCI layout tar with one image). The returned cleanup removes the unpacked copy.
func Read(archive string) (v1.Image, func(), error) {
	dir, err := os.MkdirTemp("", "ociimage-read-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	if err := untar(archive, dir); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("ociimage: %s: %w", archive, err)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("ociimage: %s is not an OCI image layout: %w", archive, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	if len(m.Manifests) != 1 {
		cleanup()
		return nil, nil, fmt.Errorf("ociimage: %s holds %d manifests, want 1", archive, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return img, cleanup, nil
}

// Verify checks that archive is a valid OCI image (every digest and size matches
// its content, media types are OCI's), then extracts its filesystem and runs its
// entrypoint with its cmd in a chroot (root only), returning what it printed.
func Verify(ctx context.Context, archive string) (string, error) {
	img, cleanup, err := Read(archive)
	if err != nil {
		return "", err
	}
	defer cleanup()
	if err := validate.Image(img); err != nil {
		return "", fmt.Errorf("ociimage: %s is not a valid image: %w", archive, err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return "", err
	}
	if mt != types.OCIManifestSchema1 {
		return "", fmt.Errorf("ociimage: manifest media type %s, want %s", mt, types.OCIManifestSchema1)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	argv := append(append([]string{}, cf.Config.Entrypoint...), cf.Config.Cmd...)
	if len(argv) == 0 {
		return "", errors.New("ociimage: the image has no entrypoint and no cmd")
	}
	root, err := os.MkdirTemp("", "ociimage-rootfs-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(root)
	rc := mutate.Extract(img)
	defer rc.Close()
	if err := untarReader(rc, root); err != nil {
		return "", fmt.Errorf("ociimage: extract: %w", err)
	}
	cmd := exec.CommandContext(ctx, "chroot", append([]string{root}, argv...)...)
	cmd.Env = cf.Config.Env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ociimage: running %q in the image: %w\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

func layerFromTar(write func(*tar.Writer) error) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := write(tw); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// addTree writes dir's tree into tw with paths relative to dir, in name order, with
// zero times so the same tree gives the same layer digest.
func addTree(tw *tar.Writer, dir string) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeSocket|fs.ModeNamedPipe) != 0 {
			continue
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		hdr.Uname, hdr.Gname = "", ""
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	return nil
}

func addFiles(tw *tar.Writer, files []File) error {
	dirs := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) {
			return fmt.Errorf("file path %q must be absolute", f.Path)
		}
		// Parent directories first, so the layer stands on its own.
		var parents []string
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
				return err
			}
		}
		fi, err := os.Stat(f.Source)
		if err != nil {
			return err
		}
		mode := f.Mode
		if mode == 0 {
			mode = fi.Mode().Perm()
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path[1:], Mode: int64(mode), Size: fi.Size(), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if err := copyFile(tw, f.Source); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	return untarReader(f, dir)
}

// untarReader unpacks regular files, directories and symlinks, refusing paths that
// leave dir.
func untarReader(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + hdr.Name)
		target := filepath.Join(dir, filepath.FromSlash(name))
		if !strings.HasPrefix(target, filepath.Clean(dir)+string(os.PathSeparator)) && target != filepath.Clean(dir) {
			return fmt.Errorf("tar entry %q leaves the target directory", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, fs.FileMode(hdr.Mode)&fs.ModePerm|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fs.FileMode(hdr.Mode)&fs.ModePerm)
			if err != nil {
				return err
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				return err
			}
			if err := f.Close(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			_ = os.Remove(target)
			if err := os.Symlink(hdr.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			src := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+hdr.Linkname)))
			_ = os.Remove(target)
			if err := os.Link(src, target); err != nil {
				return err
			}
		}
	}
}

// ExtractFile writes the regular file at path (absolute, as the container
// sees it) in the image of archive, as its top-most layer holding that path
// has it, to out.
func ExtractFile(archive, path, out string) error {
	img, cleanup, err := Read(archive)
	if err != nil {
		return err
	}
	defer cleanup()
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	want := strings.TrimPrefix(path, "/")
	for i := len(layers) - 1; i >= 0; i-- {
		rc, err := layers[i].Uncompressed()
		if err != nil {
			return err
		}
		found, err := extractTarFile(rc, want, out)
		rc.Close()
		if err != nil || found {
			return err
		}
	}
	return fmt.Errorf("ociimage: %s has no %s", archive, path)
}

func extractTarFile(r io.Reader, name, out string) (bool, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if strings.TrimPrefix(h.Name, "./") != name || h.Typeflag != tar.TypeReg {
			continue
		}
		f, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
		if err != nil {
			return false, err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return false, err
		}
		return true, f.Close()
	}
}

// AppendFiles returns img with one more layer holding files: what the
// image held at their paths, it holds no more.
func AppendFiles(img v1.Image, files []File) (v1.Image, error) {
	l, err := layerFromTar(func(tw *tar.Writer) error { return addFiles(tw, files) })
	if err != nil {
		return nil, fmt.Errorf("ociimage: files: %w", err)
	}
	return mutate.AppendLayers(img, l)
}
