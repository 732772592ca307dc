package kubecluster

import (
	"os"
	"os/exec"
	"path/filepath"
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
