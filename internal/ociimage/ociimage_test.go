package ociimage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestMeshvolImageRunsVersion builds the real meshvol binary, packs it the way `make
// image` does (over a small root filesystem instead of a debootstrapped Debian, which
// takes minutes), and checks that the archive is a valid OCI image whose entrypoint
// runs `meshvol version`.
func TestMeshvolImageRunsVersion(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("Verify chroots into the image: run the tests as root (make test does on the development machines and CI)")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "meshvol")
	build := exec.Command("go", "build", "-o", bin, "github.com/meshvol/meshvol/cmd/meshvol")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	rootfs := filepath.Join(dir, "rootfs")
	for _, d := range []string{"etc", "tmp", "usr/local/bin", "var/lib/meshvol"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc/os-release"), []byte("ID=test\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/local/bin", filepath.Join(rootfs, "bin")); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Spec{
		RootFS:     rootfs,
		Files:      []File{{Path: "/usr/local/bin/meshvol", Source: bin, Mode: 0o755}},
		Entrypoint: []string{"/usr/local/bin/meshvol"},
		Cmd:        []string{"version"},
		Labels:     map[string]string{"org.opencontainers.image.title": "meshvol"},
		Ref:        "docker.io/meshvol/meshvol:test",
	})
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("media type %s", mt)
	}
	archive := filepath.Join(dir, "meshvol.oci.tar")
	if err := WriteArchive(img, "docker.io/meshvol/meshvol:test", archive); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := Verify(ctx, archive)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "meshvol") {
		t.Errorf("the entrypoint printed %q, want meshvol's version", out)
	}
	t.Logf("entrypoint printed: %s", strings.TrimSpace(out))

	// Same inputs, same digest: builds are reproducible.
	img2, err := Build(Spec{
		RootFS:     rootfs,
		Files:      []File{{Path: "/usr/local/bin/meshvol", Source: bin, Mode: 0o755}},
		Entrypoint: []string{"/usr/local/bin/meshvol"},
		Cmd:        []string{"version"},
		Labels:     map[string]string{"org.opencontainers.image.title": "meshvol"},
	})
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same inputs have digests %s and %s", d1, d2)
	}
}

func TestVerifyRefusesBrokenArchive(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.tar")
	if err := os.WriteFile(bad, []byte("not a tar file at all"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(context.Background(), bad); err == nil {
		t.Fatal("a file that is not an archive was accepted")
	}
	if _, err := Build(Spec{}); err == nil || !strings.Contains(err.Error(), "Entrypoint") {
		t.Fatalf("an empty spec: %v, want an error naming the Entrypoint", err)
	}
}
