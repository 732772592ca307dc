// Command meshvol is the meshvol binary: one binary with a subcommand per role.
// Each subcommand lives in a file of its own.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"

	"github.com/meshvol/meshvol/internal/memlimit"
	"github.com/meshvol/meshvol/pkg/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func usage(w io.Writer) {
	fmt.Fprintln(w, `usage: meshvol <command> [flags]

commands:
  controller run the control plane (meshvol controller --help explains its flags)
  node       run the node agent of one node (meshvol node --help)
  version    print the version of this binary (-o json for JSON)`)
}

// run executes one command and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "controller":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runController(ctx, args[1:], stdout, stderr)
	case "version":
		fs := flag.NewFlagSet("version", flag.ContinueOnError)
		fs.SetOutput(stderr)
		output := fs.String("o", "text", "output format: text or json")
		if err := fs.Parse(args[1:]); err != nil {
			return 2
		}
		info := version.Get()
		switch *output {
		case "text":
			fmt.Fprintln(stdout, info)
		case "json":
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(info); err != nil {
				fmt.Fprintln(stderr, err)
				return 1
			}
		default:
			fmt.Fprintf(stderr, "meshvol version: -o must be text or json, not %q\n", *output)
			return 2
		}
		return 0
	case "node":
		return runNode(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "meshvol: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
}

// applyMemoryLimit gives the Go runtime a soft memory limit below the memory
// limit of the process's container, so that the heap stays within what the
// chart allows the pod instead of growing to twice what is live
// (internal/memlimit). Not finding the limit is logged, not fatal: the process
// runs as it would without it.
func applyMemoryLimit(log logr.Logger) {
	cgroup, soft, err := memlimit.Apply()
	switch {
	case err != nil:
		log.Info("no soft memory limit: the container's memory limit could not be read", "error", err.Error())
	case soft > 0:
		log.Info("soft memory limit set from the container's", "containerLimitBytes", cgroup, "softLimitBytes", soft)
	}
}
