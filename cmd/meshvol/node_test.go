package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestNodeNeedsNodeName(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	var out, errb bytes.Buffer
	if code := run([]string{"node"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--node-name") {
		t.Fatalf("exit %d, stderr %q; want 2 naming --node-name", code, errb.String())
	}
	if code := run([]string{"node", "--address", "not-an-ip", "--node-name", "n1"}, &out, &errb); code != 2 {
		t.Fatalf("bad --address: exit %d, want 2", code)
	}
}

func TestNodeRegistrationNeedsCSIEndpoint(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"node", "--node-name", "n1", "--kubelet-registration-dir", t.TempDir()}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--csi-endpoint") {
		t.Fatalf("exit %d, stderr %q: want 2 and a word about --csi-endpoint", code, errb.String())
	}
}

func TestKernelAlgorithms(t *testing.T) {
	p := filepath.Join(t.TempDir(), "crypto")
	data := "name         : hmac(sha256)\ndriver       : hmac(sha256-generic)\n\nname         : crc32c\n\nname         : sha1\n"
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	hmac, verify := kernelAlgorithms(p)
	if !slices.Equal(hmac, []string{"sha256", "sha1"}) || !slices.Equal(verify, []string{"crc32c", "sha1"}) {
		t.Fatalf("hmac %v verify %v", hmac, verify)
	}
}

func TestNodeLeaseFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--lease-duration", "1500ms"}, {"--lease-duration", "0s"}, {"--lease-renew-interval", "0s"},
		{"--lease-duration", "4s", "--lease-renew-interval", "3s"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"node", "--node-name", "n1"}, args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "--lease-duration") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming --lease-duration", args, code, errb.String())
		}
	}
}
