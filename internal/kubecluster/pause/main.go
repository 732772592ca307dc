// Command pause is the sandbox (pod infrastructure) container of the kubelet
// nodes that internal/kubecluster runs: it holds the pod's namespaces by doing
// nothing until it is told to stop. No registry is reachable from the machines
// meshvol's sandbox and e2e suite run on, so the pause image is built locally
// from this program (static, CGO off) instead of pulled.
//
// As PID 1 of a pod it also reaps the zombies that processes joining the
// pod's PID namespace may leave, as the upstream pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
