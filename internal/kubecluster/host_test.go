package kubecluster

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestKillProcessesWithRoot: after a cluster's process was killed, the next
// start kills the control plane it left (a kube-apiserver naming the
// cluster's directory, and the etcd it used, which does not), and nothing
// else, not even a program that names the directory.
func TestKillProcessesWithRoot(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "cluster")
	// A script's command name (comm) is its file name: stand-ins named
	// like the components, blocked reading a pipe nobody writes.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer r.Close()
	start := func(name string, args ...string) *exec.Cmd {
		t.Helper()
		bin := filepath.Join(tmp, name)
		if err := os.WriteFile(bin, []byte("#!/bin/sh\nread x\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdin = r
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	apiserver := start("kube-apiserver", "--etcd-servers=http://127.0.0.1:1", "--kubelet-client-key="+dir+"/pki/key")
	etcd := start("etcd", "--listen-client-urls=http://127.0.0.1:1", "--data-dir="+tmp+"/etcd")
	otherEtcd := start("etcd", "--listen-client-urls=http://127.0.0.1:2")
	tail := start("tail", dir+"/logs/kubelet.log")

	if err := killProcessesWithRoot(dir); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*exec.Cmd{"kube-apiserver": apiserver, "its etcd": etcd} {
		if processAlive(c.Process.Pid) {
			t.Errorf("%s (pid %d) survived", name, c.Process.Pid)
		}
	}
	for name, c := range map[string]*exec.Cmd{"another etcd": otherEtcd, "a tail of a log": tail} {
		if !processAlive(c.Process.Pid) {
			t.Errorf("%s (pid %d) was killed", name, c.Process.Pid)
		}
	}
}

// TestPodNetnsAreContainerdsOnly: of the network namespaces made while a
// cluster ran, its teardown removes only those containerd named for pods;
// another program's (a qemu guest's of test/vm, `ip netns add x`) and those
// that were there before stay.
func TestPodNetnsAreContainerdsOnly(t *testing.T) {
	d := t.TempDir()
	for _, n := range []string{"cni-0c1a7f30-5d1e-2b44-9e3f-1a2b3c4d5e6f", "cni-before", "meshvol-drbdvm-101", "qemu-net"} {
		if err := os.WriteFile(filepath.Join(d, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := podNetns(d, []string{"cni-before", "qemu-net"})
	if want := []string{"cni-0c1a7f30-5d1e-2b44-9e3f-1a2b3c4d5e6f"}; !slices.Equal(got, want) {
		t.Fatalf("podNetns = %v, want %v: only the pods' new namespaces are the cluster's", got, want)
	}
}
