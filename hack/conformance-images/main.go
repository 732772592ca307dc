// Command conformance-images builds, without a registry or a container
// engine, the upstream test images the External Storage suite of
// Kubernetes' e2e.test runs its pods from, under the names e2e.test asks
// for, as OCI archives the sandbox imports into every node's containerd
// (`make conformance`, docs/conformance.md):
//
//   - registry.k8s.io/e2e-test-images/busybox:1.36.1-1: Debian's static
//     busybox with a link per applet, as the sandbox's own busybox image.
//   - registry.k8s.io/e2e-test-images/agnhost:2.53: agnhost built from
//     k8s.io/kubernetes/test/images/agnhost at the suite's version (the
//     subPath specs run its mounttest; the host-exec pods its pause) as
//     /agnhost, its entrypoint, on Debian.
//   - registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7 and nginx:1.14-4:
//     Debian. The block multiVolume specs run `dd … oflag=nocache`, which
//     busybox's dd refuses: jessie-dnsutils needs GNU dd and a /bin/sh that
//     is not busybox (dash). The specs use nginx's image only for /bin/sh.
//
// The Debian root filesystem is the one `make image` debootstraps for
// meshvol's own image (bin/image/rootfs: bookworm minbase with coreutils,
// dash, util-linux and mount), so nothing more is downloaded.
//
//	conformance-images -rootfs DIR -agnhost FILE [-busybox FILE] -out DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshvol/meshvol/internal/kubecluster"
	"github.com/meshvol/meshvol/internal/ociimage"
)

// The names e2e.test v1.33 gives these images (k8s.io/kubernetes/test/utils/image/manifest.go).
const (
	registry      = "registry.k8s.io/e2e-test-images/"
	busyboxRef    = registry + "busybox:1.36.1-1"
	agnhostRef    = registry + "agnhost:2.53"
	dnsutilsRef   = registry + "jessie-dnsutils:1.7"
	nginxRef      = registry + "nginx:1.14-4"
	debianArchive = "debian.tar"
)

func main() {
	rootfs := flag.String("rootfs", "bin/image/rootfs", "the Debian root filesystem `make image` builds")
	agnhost := flag.String("agnhost", "", "agnhost, built static from k8s.io/kubernetes/test/images/agnhost")
	busybox := flag.String("busybox", "/bin/busybox", "a static busybox (Debian's busybox-static)")
	out := flag.String("out", "", "the directory the archives are written to")
	flag.Parse()
	if *agnhost == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "conformance-images: -agnhost and -out are required")
		os.Exit(2)
	}
	if err := build(*rootfs, *agnhost, *busybox, *out); err != nil {
		fmt.Fprintln(os.Stderr, "conformance-images:", err)
		os.Exit(1)
	}
}

func build(rootfs, agnhost, busybox, out string) error {
	if fi, err := os.Stat(filepath.Join(rootfs, "usr", "bin", "dd")); err != nil || fi.IsDir() {
		return fmt.Errorf("-rootfs %s has no usr/bin/dd (GNU coreutils): run `make image` first", rootfs)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	p := filepath.Join(out, "busybox.tar")
	if err := kubecluster.WriteBusyboxImage(p, busyboxRef, busybox); err != nil {
		return err
	}
	fmt.Printf("conformance-images: %s (%s)\n", p, busyboxRef)

	// The two Debian images are one image under two names: the same
	// blobs, stored once by containerd.
	img, err := ociimage.Build(ociimage.Spec{RootFS: rootfs, Cmd: []string{"/bin/sh"}})
	if err != nil {
		return err
	}
	p = filepath.Join(out, debianArchive)
	if err := ociimage.WriteArchiveRefs(img, []string{dnsutilsRef, nginxRef}, p); err != nil {
		return err
	}
	fmt.Printf("conformance-images: %s (%s, %s)\n", p, dnsutilsRef, nginxRef)

	img, err = ociimage.Build(ociimage.Spec{
		RootFS:     rootfs,
		Files:      []ociimage.File{{Path: "/agnhost", Source: agnhost, Mode: 0o755}},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
	})
	if err != nil {
		return err
	}
	p = filepath.Join(out, "agnhost.tar")
	if err := ociimage.WriteArchive(img, agnhostRef, p); err != nil {
		return err
	}
	fmt.Printf("conformance-images: %s (%s)\n", p, agnhostRef)
	return nil
}
