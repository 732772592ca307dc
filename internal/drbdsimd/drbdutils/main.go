// Command drbdutils stands in for drbd-utils' drbdadm, drbdsetup and
// drbdmeta where the DRBD kernel module is simulated (internal/drbdsimd): it
// is installed under those three names (symlinks to it), sends its command
// line — and the configuration file drbdadm -c names, which lives in the
// caller's mount namespace — to the drbdsim service's socket, and prints
// what the service answers, as drbd-utils print it, with drbd-utils' exit
// code. So pkg/drbd's ExecDriver and its parsers run unchanged on the
// simulation. It is a test harness: the sandbox mounts it into the node
// pods; no image carries it.
//
// The socket is $DRBDSIM_SOCKET, or drbdsim.sock beside the binary (the
// directory the sandbox mounts holds both).
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/meshvol/meshvol/internal/drbdsimd/wire"
)

func main() { os.Exit(run()) }

func run() int {
	prog := filepath.Base(os.Args[0])
	args := os.Args[1:]
	switch prog {
	case "drbdadm", "drbdsetup", "drbdmeta":
	default:
		fmt.Fprintf(os.Stderr, "%s: run me as drbdadm, drbdsetup or drbdmeta (a symlink of that name)\n", prog)
		return 20
	}
	req := wire.Request{Argv: append([]string{prog}, args...), Node: os.Getenv("__DRBD_NODE__")}
	if prog == "drbdadm" {
		for i, a := range args {
			if a != "-c" || i+1 >= len(args) {
				continue
			}
			path := args[i+1]
			b, err := os.ReadFile(path)
			if err != nil {
				// drbdadm's words and exit code for a missing file.
				fmt.Fprintf(os.Stderr, "Can not open '%s'.\n: %v\n", path, err)
				return 20
			}
			req.Files = map[string]string{path: string(b)}
		}
	}
	sock := os.Getenv("DRBDSIM_SOCKET")
	if sock == "" {
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", prog, err)
			return 20
		}
		sock = filepath.Join(filepath.Dir(exe), "drbdsim.sock")
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		// What drbdsetup says when the module is not loaded.
		fmt.Fprintf(os.Stderr, "Could not connect to 'drbd' generic netlink family (the drbdsim service at %s: %v)\n", sock, err)
		return 20
	}
	defer conn.Close()
	// Killed or interrupted: closing the connection ends the command in
	// the service, as killing drbdsetup ends its netlink request.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGPIPE)
	go func() {
		<-sigs
		conn.Close()
		os.Exit(20)
	}()
	if err := wire.WriteRequest(conn, req); err != nil {
		fmt.Fprintf(os.Stderr, "%s: sending to the drbdsim service: %v\n", prog, err)
		return 20
	}
	for {
		kind, payload, err := wire.ReadFrame(conn)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: the drbdsim service ended the command without an exit code: %v\n", prog, err)
			return 20
		}
		switch kind {
		case wire.Stdout:
			if _, err := os.Stdout.Write(payload); err != nil {
				return 20 // the reader went away (events2 closed)
			}
		case wire.Stderr:
			os.Stderr.Write(payload)
		case wire.Exit:
			return wire.ExitCode(payload)
		}
	}
}
