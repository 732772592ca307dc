// Command kubectl-meshvol is the kubectl plugin `kubectl meshvol` (status, nodes):
// put it on PATH and kubectl finds it. The logic lives in pkg/kubectlmeshvol.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"

	"github.com/meshvol/meshvol/pkg/kubectlmeshvol"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := kubectlmeshvol.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
