// Command ociimage packs a root filesystem and the meshvol binary into an OCI image
// archive, and verifies one, without a container engine (internal/ociimage). `make image`
// runs it; see hack/image.sh.
//
//	ociimage build -rootfs DIR -binary FILE -ref NAME -out FILE
//	ociimage verify FILE
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/meshvol/meshvol/internal/ociimage"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "build":
		fs := flag.NewFlagSet("build", flag.ExitOnError)
		rootfs := fs.String("rootfs", "", "root filesystem directory (the first layer)")
		binary := fs.String("binary", "", "the meshvol binary, placed at /usr/local/bin/meshvol")
		ref := fs.String("ref", "", "image name recorded in the archive, e.g. docker.io/meshvol/meshvol:v0.1.0")
		version := fs.String("version", "dev", "the version label")
		out := fs.String("out", "", "the archive to write")
		_ = fs.Parse(os.Args[2:])
		if *rootfs == "" || *binary == "" || *out == "" || *ref == "" {
			fmt.Fprintln(os.Stderr, "ociimage build: -rootfs, -binary, -ref and -out are required")
			os.Exit(2)
		}
		img, err := ociimage.Build(ociimage.Spec{
			RootFS:     *rootfs,
			Files:      []ociimage.File{{Path: "/usr/local/bin/meshvol", Source: *binary, Mode: 0o755}},
			Entrypoint: []string{"/usr/local/bin/meshvol"},
			Cmd:        []string{"version"},
			Labels: map[string]string{
				"org.opencontainers.image.title":   "meshvol",
				"org.opencontainers.image.version": *version,
				"org.opencontainers.image.source":  "https://github.com/meshvol/meshvol",
			},
			Ref: *ref,
		})
		check(err)
		check(ociimage.WriteArchive(img, *ref, *out))
		d, err := img.Digest()
		check(err)
		fmt.Printf("ociimage: wrote %s (%s, %s)\n", *out, *ref, d)
	case "verify":
		if len(os.Args) != 3 {
			usage()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := ociimage.Verify(ctx, os.Args[2])
		check(err)
		fmt.Printf("ociimage: %s is a valid OCI image; its entrypoint printed: %s\n", os.Args[2], strings.TrimSpace(out))
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ociimage build -rootfs DIR -binary FILE -ref NAME -out FILE | ociimage verify FILE")
	os.Exit(2)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
