// Package drbdsimd serves a drbdsim cluster to drbd-utils stand-ins, so
// that a node agent drives the simulated DRBD kernel module the way it
// drives the real one: through drbdadm, drbdsetup and drbdmeta, with
// pkg/drbd's ExecDriver and parsers unchanged. One process (the sandbox)
// simulates every node's kernel; each node reaches it through a unix socket
// of its own, so the socket says whose kernel a command runs on, as the
// machine a real drbdsetup runs on does.
//
// What the stand-ins print is what drbdsim prints, which reproduces
// drbd-utils 9.22 on DRBD 9.2.18 (pkg/drbd/drbdsim's doc): status and show
// JSON, events2 lines, and a refused command's stderr and exit code, which
// ExecDriver classifies as it does the real tools'. drbdadm's configuration
// file is parsed back into the model it was rendered from (parseRes), as
// drbdadm parses it before it drives the kernel.
package drbdsimd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/meshvol/meshvol/internal/drbdsimd/wire"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// Service serves a drbdsim cluster on one socket per node.
type Service struct {
	cluster *drbdsim.Cluster
	ctx     context.Context
	cancel  context.CancelFunc

	mu        sync.Mutex
	listeners map[string]net.Listener
	// minors maps each node's device minors to their resources, from the
	// configurations drbdadm was given: drbdmeta names a minor and a disk,
	// not a resource.
	minors map[string]map[int]string
	wg     sync.WaitGroup
}

// New returns a service of c that listens on nothing yet (see Listen).
func New(c *drbdsim.Cluster) *Service {
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{cluster: c, ctx: ctx, cancel: cancel, listeners: map[string]net.Listener{}, minors: map[string]map[int]string{}}
}

// Listen serves node's simulated kernel on a unix socket at path (replaced
// if it exists).
func (s *Service) Listen(node, path string) error {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("drbdsimd: %w", err)
	}
	s.mu.Lock()
	if old := s.listeners[node]; old != nil {
		old.Close()
	}
	s.listeners[node] = l
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(node, conn)
			}()
		}
	}()
	return nil
}

// Stop closes node's socket: its commands then fail as on a machine whose
// kernel is gone. Commands already running go on.
func (s *Service) Stop(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.listeners[node]; l != nil {
		l.Close()
		delete(s.listeners, node)
	}
}

// Close stops every socket, ends the running commands (an events2 stream
// among them) and waits for them.
func (s *Service) Close() error {
	s.mu.Lock()
	for n, l := range s.listeners {
		l.Close()
		delete(s.listeners, n)
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// frames writes stdout or stderr frames to the connection; the two share
// it, hence the lock.
type frames struct {
	mu   *sync.Mutex
	conn net.Conn
	kind byte
}

func (f frames) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := wire.WriteFrame(f.conn, f.kind, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (s *Service) serve(node string, conn net.Conn) {
	defer conn.Close()
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	br := bufio.NewReader(conn)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return
	}
	var req wire.Request
	var mu sync.Mutex
	stdout := frames{mu: &mu, conn: conn, kind: wire.Stdout}
	stderr := frames{mu: &mu, conn: conn, kind: wire.Stderr}
	if err := json.Unmarshal(line, &req); err != nil || len(req.Argv) == 0 {
		fmt.Fprintf(stderr, "drbdsimd: bad request: %v\n", err)
		_ = wire.WriteExit(conn, 20)
		return
	}
	// The stand-in closes the connection when it is killed (a command
	// timeout): the command ends with it, as a killed drbdsetup's does.
	go func() {
		_, _ = io.Copy(io.Discard, br)
		cancel()
	}()
	code := s.run(ctx, node, req, stdout, stderr)
	mu.Lock()
	defer mu.Unlock()
	_ = wire.WriteExit(conn, code)
}

// run executes one command on node's simulated kernel and returns its exit
// code.
func (s *Service) run(ctx context.Context, node string, req wire.Request, stdout, stderr io.Writer) int {
	if req.Node != "" && req.Node != node {
		fmt.Fprintf(stderr, "drbdsimd: __DRBD_NODE__=%s on the socket of node %s\n", req.Node, node)
		return 20
	}
	args := req.Argv[1:]
	switch req.Argv[0] {
	case "drbdadm":
		return s.drbdadm(ctx, node, args, req.Files, stdout, stderr)
	case "drbdsetup":
		return s.drbdsetup(ctx, node, args, stdout, stderr)
	case "drbdmeta":
		return s.drbdmeta(ctx, node, args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "drbdsimd: unknown program %q\n", req.Argv[0])
	return 20
}

// exitCode prints a failed command's stderr as the real tool does and
// returns its exit code. drbdsim's refusals carry drbdsetup's stderr and
// exit code; its other errors (a crashed node, a hung command ended by its
// context) have none, and print their message with drbdadm's exit 20.
func exitCode(stderr io.Writer, err error) int {
	var ce *drbd.CommandError
	if errors.As(err, &ce) && ce.ExitCode > 0 && ce.Stderr != "" {
		io.WriteString(stderr, ce.Stderr)
		if !strings.HasSuffix(ce.Stderr, "\n") {
			io.WriteString(stderr, "\n")
		}
		return ce.ExitCode
	}
	fmt.Fprintln(stderr, err)
	return 20
}

func unsupported(stderr io.Writer, prog string, args []string) int {
	fmt.Fprintf(stderr, "drbdsimd: %s %s is not simulated (the stand-ins serve what pkg/drbd's ExecDriver runs)\n", prog, strings.Join(args, " "))
	return 20
}

// loneHostAddress is this host's address in a resource without peers,
// whose file names none (see drbdadm).
var loneHostAddress = drbd.Address{IP: netip.MustParseAddr("192.0.2.1"), Port: drbd.MaxPort}

// drbdadmVersion is `drbdadm --version` of drbd-utils 9.22.0 with DRBD
// 9.2.18 loaded (pkg/drbd/internal/captures/testdata/drbdadm--version.txt).
const drbdadmVersion = `DRBDADM_BUILDTAG=GIT-hash:\ 409097fe02187f83790b88ac3e0d94f3c167adab\ reproducible\ build\,\ 2023-01-09\ 14:51:18
DRBDADM_API_VERSION=2
DRBD_KERNEL_VERSION_CODE=0x090212
DRBD_KERNEL_VERSION=9.2.18
DRBDADM_VERSION_CODE=0x091600
DRBDADM_VERSION=9.22.0
`

func (s *Service) drbdadm(ctx context.Context, node string, args []string, files map[string]string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "--version" {
		io.WriteString(stdout, drbdadmVersion)
		return 0
	}
	if len(args) < 4 || args[0] != "-c" {
		return unsupported(stderr, "drbdadm", args)
	}
	path, cmd, rest := args[1], args[2], args[3:]
	text, ok := files[path]
	if !ok {
		fmt.Fprintf(stderr, "Can not open '%s'.\n", path)
		return 20
	}
	r, err := parseRes(text)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", path, err)
		return 10
	}
	if len(r.Peers) == 0 && !r.Self.Address.IP.IsValid() {
		// A resource with no peer has no connection, so its file names no
		// address of this host (the address is a connection path's), and
		// DRBD needs none. drbdsim's resource model always has one: give
		// it an address no node has (TEST-NET-1, RFC 5737), never used
		// without a connection; the adjust that adds a peer brings the
		// real one.
		r.Self.Address = loneHostAddress
	}
	if err := r.Validate(drbd.Features{}); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", path, err)
		return 10
	}
	target := rest[len(rest)-1]
	if cmd == "new-current-uuid" {
		target = strings.TrimSuffix(target, "/"+strconv.Itoa(drbd.VolumeNumber))
	}
	if target != r.Name || r.Self.Name != node {
		fmt.Fprintf(stderr, "'%s' not defined in your config (for this host).\n", target)
		return 10
	}
	n := s.cluster.Node(node)
	if err := n.WriteConfig(ctx, r); err != nil {
		return exitCode(stderr, err)
	}
	s.mu.Lock()
	if s.minors[node] == nil {
		s.minors[node] = map[int]string{}
	}
	s.minors[node][r.Minor] = r.Name
	s.mu.Unlock()
	flags := strings.Join(rest[:len(rest)-1], " ")
	switch {
	case cmd == "dump" && flags == "":
		io.WriteString(stdout, text)
	case cmd == "create-md" && strings.HasPrefix(flags, "--max-peers=") && strings.HasSuffix(flags, " --force"):
		peers, perr := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(flags, "--max-peers="), " --force"))
		if perr != nil {
			fmt.Fprintf(stderr, "create-md: %v\n", perr)
			return 20
		}
		err = n.CreateMetadata(ctx, r.Name, peers)
	case cmd == "up" && flags == "":
		err = n.Up(ctx, r.Name)
	case cmd == "adjust" && flags == "":
		err = n.Adjust(ctx, r.Name)
	case cmd == "down" && flags == "":
		err = n.Down(ctx, r.Name)
	case cmd == "primary" && flags == "":
		err = n.Primary(ctx, r.Name, drbd.NoForce)
	case cmd == "primary" && flags == "--force":
		err = n.Primary(ctx, r.Name, "drbdadm primary --force")
	case cmd == "secondary" && flags == "":
		err = n.Secondary(ctx, r.Name)
	case cmd == "new-current-uuid" && flags == "--clear-bitmap":
		err = n.NewCurrentUUIDClearBitmap(ctx, r.Name)
	case cmd == "resize" && flags == "":
		err = n.Resize(ctx, r.Name)
	case cmd == "suspend-io" && flags == "":
		err = n.SuspendIO(ctx, r.Name)
	case cmd == "resume-io" && flags == "":
		err = n.ResumeIO(ctx, r.Name)
	default:
		return unsupported(stderr, "drbdadm", args)
	}
	if err != nil {
		return exitCode(stderr, err)
	}
	return 0
}

// diskOptionsHelp is the head of `drbdsetup help disk-options`: what
// ExecDriver.ProbeFeatures reads is whether --non-voting is listed, and
// upstream DRBD 9.2, which drbdsim simulates, has no such option.
const diskOptionsHelp = `USAGE: disk-options {minor} [{options}]

OPTIONS:
 --set-defaults
 --on-io-error={pass_on|call-local-io-error|detach}
 --disk-barrier={yes|no}
 --disk-flushes={yes|no}
 --disk-drain={yes|no}
 --md-flushes={yes|no}
 --resync-after=<...>
 --al-extents=(67 ... 65534)
 --al-updates={yes|no}
 --discard-zeroes-if-aligned={yes|no}
 --disable-write-same={yes|no}
 --disk-timeout=(0 ... 6000)
 --read-balancing={prefer-local|prefer-remote|round-robin|least-pending|when-congested-remote|32K-striping|64K-striping|128K-striping|256K-striping|512K-striping|1M-striping}
 --rs-discard-granularity=(0 ... 1048576)
`

func (s *Service) drbdsetup(ctx context.Context, node string, args []string, stdout, stderr io.Writer) int {
	n := s.cluster.Node(node)
	line := strings.Join(args, " ")
	var out []byte
	var err error
	switch {
	case line == "help disk-options":
		io.WriteString(stdout, diskOptionsHelp)
		return 0
	case len(args) == 5 && strings.HasPrefix(line, "status --json --verbose --statistics "):
		out, err = n.StatusJSON(ctx, args[4])
	case len(args) == 3 && args[0] == "show" && args[1] == "--json":
		out, err = n.ShowJSON(ctx, args[2])
	case line == "events2 --timestamps --statistics --full all", line == "events2 --timestamps --statistics all":
		return events(ctx, n, strings.Contains(line, "--full"), stdout, stderr)
	case len(args) == 3 && args[0] == "forget-peer":
		id, perr := strconv.Atoi(args[2])
		if perr != nil {
			return unsupported(stderr, "drbdsetup", args)
		}
		err = n.ForgetPeer(ctx, args[1], id)
	case len(args) == 3 && (args[0] == "disconnect" || args[0] == "connect"),
		len(args) == 4 && args[0] == "disconnect" && args[3] == "--force":
		// The agent's Reconnect: disconnect (forced or not), then connect, of one peer.
		id, perr := strconv.Atoi(args[2])
		if perr != nil {
			return unsupported(stderr, "drbdsetup", args)
		}
		if args[0] == "disconnect" {
			force := drbd.NoForce
			if len(args) == 4 {
				force = "drbdsetup disconnect --force"
			}
			err = n.Disconnect(ctx, args[1], id, force)
		} else {
			err = n.Connect(ctx, args[1], id)
		}
	case len(args) == 3 && args[0] == "resource-options" && args[2] == "--on-no-quorum="+string(drbd.OnNoQuorumIOError):
		err = n.FailIOWithoutQuorum(ctx, args[1])
	case len(args) == 3 && args[0] == "resource-options" && strings.HasPrefix(args[2], "--quorum="):
		// The agent's RecomputeQuorum: two option changes, each recomputing quorum.
		q, perr := drbd.ParseQuorum(strings.TrimPrefix(args[2], "--quorum="))
		if perr != nil {
			return unsupported(stderr, "drbdsetup", args)
		}
		err = n.SetQuorum(ctx, args[1], q)
	case len(args) == 4 && args[0] == "verify" && args[3] == strconv.Itoa(drbd.VolumeNumber):
		id, perr := strconv.Atoi(args[2])
		if perr != nil {
			return unsupported(stderr, "drbdsetup", args)
		}
		err = n.Verify(ctx, args[1], id)
	default:
		return unsupported(stderr, "drbdsetup", args)
	}
	if err != nil {
		return exitCode(stderr, err)
	}
	_, _ = stdout.Write(out)
	return 0
}

// events streams the node's events2 until the caller goes away (its
// context ends) or the service closes.
func events(ctx context.Context, n *drbdsim.Node, full bool, stdout, stderr io.Writer) int {
	rc, err := n.EventsWith(ctx, full)
	if err != nil {
		return exitCode(stderr, err)
	}
	go func() {
		<-ctx.Done()
		rc.Close()
	}()
	_, _ = io.Copy(stdout, rc)
	rc.Close()
	return 0
}

// drbdmeta answers `drbdmeta <minor> v09 <disk> internal dstate`, the
// metadata probe of ExecDriver.HasMetadata, with drbdmeta's output: the
// disk state on a device with metadata, "No valid meta data found" (exit
// 255) on one without.
func (s *Service) drbdmeta(ctx context.Context, node string, args []string, stdout, stderr io.Writer) int {
	if len(args) != 5 || args[1] != "v09" || args[3] != drbd.MetaDiskInternal || args[4] != "dstate" {
		return unsupported(stderr, "drbdmeta", args)
	}
	minor, err := strconv.Atoi(args[0])
	if err != nil {
		return unsupported(stderr, "drbdmeta", args)
	}
	s.mu.Lock()
	name, ok := s.minors[node][minor]
	s.mu.Unlock()
	has := false
	if ok {
		if has, err = s.cluster.Node(node).HasMetadata(ctx, name); err != nil {
			return exitCode(stderr, err)
		}
	}
	if !has {
		io.WriteString(stderr, "No valid meta data found\n")
		return 255
	}
	io.WriteString(stdout, "Consistent/DUnknown\n")
	return 0
}
