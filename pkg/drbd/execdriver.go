package drbd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ExecConfig configures an ExecDriver. Zero values get the defaults noted.
type ExecConfig struct {
	// NodeName is this node's name as rendered in the "on" section. drbdadm
	// finds "its" host section by comparing with uname -n; when the
	// Kubernetes node name differs from the kernel host name, the driver
	// tells drbdadm through __DRBD_NODE__ (drbdadm's own override). Empty:
	// rely on uname -n. drbdadm then opens its stderr with "found
	// __DRBD_NODE__ in environment / PRETENDING that I am >>node<<"; the
	// driver drops those lines from its errors (cleanStderr).
	NodeName string
	// ConfDir holds one <name>.res per resource. Every drbdadm call names
	// its file with -c, so nothing depends on /etc/drbd.conf includes.
	// Default /var/lib/meshvol/drbd.d.
	ConfDir string
	// Program paths; defaults drbdadm, drbdsetup, drbdmeta (from PATH).
	Drbdadm, Drbdsetup, Drbdmeta string
	// Timeout bounds every command. Default 30s. Commands that legitimately
	// take longer (create-md on a large device) get SlowTimeout, default 5m.
	Timeout     time.Duration
	SlowTimeout time.Duration
	// Features the installed DRBD supports (see ProbeFeatures).
	Features Features
	// ProcDRBD is /proc/drbd (for Version); overridable in tests.
	ProcDRBD string
	Exec     Executor
	Log      *slog.Logger
}

// ExecDriver drives the real DRBD through drbd-utils.
type ExecDriver struct {
	cfg ExecConfig

	mu     sync.Mutex
	minors map[string]int // resource → this node's minor, from WriteConfig or the file
}

var _ Driver = (*ExecDriver)(nil)

// NewExecDriver returns a driver with cfg's defaults filled in.
func NewExecDriver(cfg ExecConfig) *ExecDriver {
	if cfg.ConfDir == "" {
		cfg.ConfDir = "/var/lib/meshvol/drbd.d"
	}
	if cfg.Drbdadm == "" {
		cfg.Drbdadm = "drbdadm"
	}
	if cfg.Drbdsetup == "" {
		cfg.Drbdsetup = "drbdsetup"
	}
	if cfg.Drbdmeta == "" {
		cfg.Drbdmeta = "drbdmeta"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.SlowTimeout == 0 {
		cfg.SlowTimeout = 5 * time.Minute
	}
	if cfg.ProcDRBD == "" {
		cfg.ProcDRBD = "/proc/drbd"
	}
	if cfg.Exec == nil {
		cfg.Exec = OSExecutor{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &ExecDriver{cfg: cfg, minors: map[string]int{}}
}

// ConfPath is the .res file of a resource.
func (d *ExecDriver) ConfPath(name string) string {
	return filepath.Join(d.cfg.ConfDir, name+".res")
}

func (d *ExecDriver) env() []string {
	if d.cfg.NodeName == "" {
		return nil
	}
	return []string{"__DRBD_NODE__=" + d.cfg.NodeName}
}

// run executes argv with a per-call timeout and turns failure into a
// classified *CommandError.
func (d *ExecDriver) run(ctx context.Context, timeout time.Duration, argv ...string) (Result, error) {
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res, err := d.cfg.Exec.Run(callCtx, argv, d.env())
	d.cfg.Log.Debug("drbd command", "argv", argv, "exit", res.ExitCode, "took", time.Since(start))
	if err != nil {
		ce := &CommandError{Args: argv, ExitCode: -1, Stderr: cleanStderr(res.Stderr), Err: err, Kind: ErrCommandFailed}
		if errors.Is(callCtx.Err(), context.DeadlineExceeded) {
			// Killed: whether the kernel applied the change is unknown, so
			// the caller must re-observe, not assume.
			ce.Kind = ErrTimeout
			ce.Err = fmt.Errorf("killed after %s", timeout)
			d.cfg.Log.Warn("drbd command timed out and was killed", "argv", argv, "timeout", timeout)
		}
		return res, ce
	}
	if res.ExitCode != 0 {
		stderr := cleanStderr(res.Stderr)
		code, kind := classify(stderr)
		return res, &CommandError{Args: argv, ExitCode: res.ExitCode, Stderr: stderr, StateCode: code, Kind: kind}
	}
	return res, nil
}

// checkName refuses a resource name before it reaches a command line, where
// "-x" would read as an option and "all" as every resource.
func checkName(name string) error {
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("resource name %q: %w", name, err)
	}
	return nil
}

func (d *ExecDriver) adm(ctx context.Context, timeout time.Duration, name string, args ...string) error {
	if err := checkName(name); err != nil {
		return err
	}
	argv := append([]string{d.cfg.Drbdadm, "-c", d.ConfPath(name)}, args...)
	_, err := d.run(ctx, timeout, argv...)
	return err
}

// WriteConfig validates and renders r, has drbdadm parse the result, and
// only then replaces <confdir>/<name>.res atomically (temp file, fsync,
// rename, fsync of the directory): a crash leaves the old or the new file,
// never half of one, and a file drbdadm rejects never becomes live.
func (d *ExecDriver) WriteConfig(ctx context.Context, r *Resource) error {
	if d.cfg.NodeName != "" && r != nil && r.Self.Name != d.cfg.NodeName {
		return fmt.Errorf("resource %q: self.name %q is not this node (%q)", r.Name, r.Self.Name, d.cfg.NodeName)
	}
	text, err := Render(r, d.cfg.Features)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.cfg.ConfDir, 0o700); err != nil {
		return fmt.Errorf("write config %q: %w", r.Name, err)
	}
	// The temp file does not end in .res, so it is never picked up by a
	// glob include while it is incomplete.
	tmp, err := os.CreateTemp(d.cfg.ConfDir, "."+r.Name+".res.tmp-*")
	if err != nil {
		return fmt.Errorf("write config %q: %w", r.Name, err)
	}
	tmpName := tmp.Name()
	keep := false
	defer func() {
		if !keep {
			os.Remove(tmpName)
		}
	}()
	// 0600: the file may carry the shared secret.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write config %q: %w", r.Name, err)
	}
	if _, err := tmp.Write(text); err != nil {
		tmp.Close()
		return fmt.Errorf("write config %q: %w", r.Name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write config %q: fsync: %w", r.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write config %q: %w", r.Name, err)
	}
	if _, err := d.run(ctx, d.cfg.Timeout, d.cfg.Drbdadm, "-c", tmpName, "dump", r.Name); err != nil {
		var ce *CommandError
		if errors.As(err, &ce) && ce.Kind != ErrTimeout {
			ce.Kind = ErrInvalidConfig
		}
		return fmt.Errorf("write config %q: drbdadm rejected the rendered file: %w", r.Name, err)
	}
	final := d.ConfPath(r.Name)
	if err := os.Rename(tmpName, final); err != nil {
		return fmt.Errorf("write config %q: %w", r.Name, err)
	}
	keep = true
	if err := syncDir(d.cfg.ConfDir); err != nil {
		return fmt.Errorf("write config %q: fsync %s: %w", r.Name, d.cfg.ConfDir, err)
	}
	d.mu.Lock()
	d.minors[r.Name] = r.Minor
	d.mu.Unlock()
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func (d *ExecDriver) RemoveConfig(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := os.Remove(d.ConfPath(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove config %q: %w", name, err)
	}
	d.mu.Lock()
	delete(d.minors, name)
	d.mu.Unlock()
	return syncDir(d.cfg.ConfDir)
}

// selfVolume reads this node's minor and backing device back from the
// resource's rendered file. The renderer writes this node's "on" section
// first, so that is the one read.
func (d *ExecDriver) selfVolume(name string) (minor int, disk string, err error) {
	f, err := os.Open(d.ConfPath(name))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, "", &CommandError{Args: []string{"read", d.ConfPath(name)}, ExitCode: -1,
				Kind: ErrUnknownResource, Err: err}
		}
		return 0, "", err
	}
	defer f.Close()
	return parseSelfVolume(f)
}

func parseSelfVolume(r io.Reader) (minor int, disk string, err error) {
	sc := bufio.NewScanner(r)
	inOn, haveMinor := false, false
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(l, "on ") && strings.HasSuffix(l, "{"):
			if inOn { // reached the second host: done
				return minor, disk, finishSelf(haveMinor, disk)
			}
			inOn = true
		case inOn && strings.HasPrefix(l, "device minor "):
			minor, err = strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(l, "device minor "), ";"))
			if err != nil {
				return 0, "", fmt.Errorf("rendered file: bad device line %q", l)
			}
			haveMinor = true
		case inOn && strings.HasPrefix(l, "disk ") && strings.HasSuffix(l, ";"):
			disk = strings.Trim(strings.TrimSuffix(strings.TrimPrefix(l, "disk "), ";"), `"`)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, "", err
	}
	return minor, disk, finishSelf(haveMinor, disk)
}

func finishSelf(haveMinor bool, disk string) error {
	if !haveMinor || disk == "" {
		return errors.New("rendered file has no device minor / disk in its first host section")
	}
	return nil
}

// HasMetadata asks drbdmeta for the disk state recorded in the metadata
// (cheap, unlike dump-md which prints the whole bitmap). A device that is
// attached to the kernel obviously has metadata; drbdmeta refuses to open
// it, so that case is answered from status first.
func (d *ExecDriver) HasMetadata(ctx context.Context, name string) (bool, error) {
	minor, disk, err := d.selfVolume(name)
	if err != nil {
		return false, fmt.Errorf("has metadata %q: %w", name, err)
	}
	if disk == "none" {
		return false, nil // diskless: there is nothing to carry metadata
	}
	st, err := d.Status(ctx, name)
	switch {
	case err == nil:
		for _, r := range st {
			for _, dev := range r.Devices {
				if dev.Volume == VolumeNumber && dev.DiskState != "Diskless" && dev.DiskState != "DUnknown" {
					return true, nil
				}
			}
		}
	case errors.Is(err, ErrUnknownResource):
		// not up: ask drbdmeta
	default:
		return false, err
	}
	_, err = d.run(ctx, d.cfg.Timeout, d.cfg.Drbdmeta, strconv.Itoa(minor), "v09", disk, MetaDiskInternal, "dstate")
	if err == nil {
		return true, nil
	}
	if errors.Is(err, ErrNoMetadata) {
		return false, nil
	}
	return false, err
}

func (d *ExecDriver) CreateMetadata(ctx context.Context, name string, maxPeers int) error {
	if maxPeers < 1 || maxPeers > MaxNodeID {
		return fmt.Errorf("create metadata %q: maxPeers %d must be in 1..%d", name, maxPeers, MaxNodeID)
	}
	// --force only suppresses drbdmeta's interactive "overwrite?" question;
	// the agent has already established that there is no metadata.
	return d.adm(ctx, d.cfg.SlowTimeout, name, "create-md", "--max-peers="+strconv.Itoa(maxPeers), "--force", name)
}

func (d *ExecDriver) Up(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.Timeout, name, "up", name)
}

func (d *ExecDriver) Adjust(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.Timeout, name, "adjust", name)
}

func (d *ExecDriver) Down(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.Timeout, name, "down", name)
}

func (d *ExecDriver) Primary(ctx context.Context, name string, force ForceReason) error {
	if force == NoForce {
		return d.adm(ctx, d.cfg.Timeout, name, "primary", name)
	}
	d.cfg.Log.Warn("forcing DRBD promotion", "resource", name, "reason", string(force))
	return d.adm(ctx, d.cfg.Timeout, name, "primary", "--force", name)
}

func (d *ExecDriver) Secondary(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.Timeout, name, "secondary", name)
}

func (d *ExecDriver) NewCurrentUUIDClearBitmap(ctx context.Context, name string) error {
	d.cfg.Log.Info("skipping initial sync: new current UUID with cleared bitmap", "resource", name)
	return d.adm(ctx, d.cfg.Timeout, name, "new-current-uuid", "--clear-bitmap", name+"/"+strconv.Itoa(VolumeNumber))
}

func (d *ExecDriver) Resize(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.SlowTimeout, name, "resize", name)
}

func (d *ExecDriver) SuspendIO(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.Timeout, name, "suspend-io", name)
}

func (d *ExecDriver) ResumeIO(ctx context.Context, name string) error {
	return d.adm(ctx, d.cfg.Timeout, name, "resume-io", name)
}

// FailIOWithoutQuorum switches the running resource to on-no-quorum
// io-error with drbdsetup, not drbdadm: drbdadm would apply the options of
// the configuration file, which say suspend-io.
func (d *ExecDriver) FailIOWithoutQuorum(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	_, err := d.setup(ctx, "resource-options", name, "--on-no-quorum="+string(OnNoQuorumIOError))
	return err
}

// RecomputeQuorum sets the quorum option to a neighbouring count and back
// with drbdsetup (see Driver); each change is a state change of its own.
func (d *ExecDriver) RecomputeQuorum(ctx context.Context, name string, q Quorum) error {
	if err := checkName(name); err != nil {
		return err
	}
	via, err := q.Neighbour()
	if err != nil {
		return err
	}
	for _, v := range []Quorum{via, q} {
		if _, err := d.setup(ctx, "resource-options", name, "--quorum="+v.String()); err != nil {
			return err
		}
	}
	return nil
}

func (d *ExecDriver) setup(ctx context.Context, args ...string) (Result, error) {
	return d.run(ctx, d.cfg.Timeout, append([]string{d.cfg.Drbdsetup}, args...)...)
}

func checkPeer(name string, peerNodeID int) error {
	if err := checkName(name); err != nil {
		return err
	}
	if peerNodeID < 0 || peerNodeID > MaxNodeID {
		return fmt.Errorf("peer node-id %d: must be in 0..%d", peerNodeID, MaxNodeID)
	}
	return nil
}

// ForgetPeer frees the peer's bitmap slot (drbdsetup forget-peer). The peer
// must already be disconnected and removed from the configuration.
func (d *ExecDriver) ForgetPeer(ctx context.Context, name string, peerNodeID int) error {
	if err := checkPeer(name, peerNodeID); err != nil {
		return err
	}
	_, err := d.setup(ctx, "forget-peer", name, strconv.Itoa(peerNodeID))
	return err
}

// Reconnect is `drbdsetup disconnect` and `drbdsetup connect` of one peer
// (see Driver). A disconnect that fails is returned as it is, and nothing is
// connected: the connection is then as DRBD left it (still up, when refused).
func (d *ExecDriver) Reconnect(ctx context.Context, name string, peerNodeID int, force ForceReason) error {
	if err := checkPeer(name, peerNodeID); err != nil {
		return err
	}
	id := strconv.Itoa(peerNodeID)
	args := []string{"disconnect", name, id}
	if force != NoForce {
		d.cfg.Log.Warn("forcing a DRBD disconnect", "resource", name, "peer", peerNodeID, "reason", string(force))
		args = append(args, "--force")
	}
	if _, err := d.setup(ctx, args...); err != nil {
		return fmt.Errorf("disconnect %s from peer node-id %s: %w", name, id, err)
	}
	if _, err := d.setup(ctx, "connect", name, id); err != nil {
		return fmt.Errorf("connect %s to peer node-id %s again: %w", name, id, err)
	}
	return nil
}

// Verify starts an online verify against one peer; progress shows in status.
func (d *ExecDriver) Verify(ctx context.Context, name string, peerNodeID int) error {
	if err := checkPeer(name, peerNodeID); err != nil {
		return err
	}
	_, err := d.setup(ctx, "verify", name, strconv.Itoa(peerNodeID), strconv.Itoa(VolumeNumber))
	return err
}

func objName(name string) (string, error) {
	if name == "" || name == "all" {
		return "all", nil
	}
	if err := checkName(name); err != nil {
		return "", err
	}
	return name, nil
}

func (d *ExecDriver) Status(ctx context.Context, name string) ([]StatusResource, error) {
	obj, err := objName(name)
	if err != nil {
		return nil, err
	}
	res, err := d.setup(ctx, "status", "--json", "--verbose", "--statistics", obj)
	if err != nil {
		return nil, err
	}
	return ParseStatusJSON(res.Stdout)
}

func (d *ExecDriver) Show(ctx context.Context, name string) ([]ShowResource, error) {
	obj, err := objName(name)
	if err != nil {
		return nil, err
	}
	res, err := d.setup(ctx, "show", "--json", obj)
	if err != nil {
		return nil, err
	}
	return ParseShowJSON(res.Stdout)
}

// Events starts the long-running event stream. It has no timeout (it is
// meant to run forever); ctx ends it.
func (d *ExecDriver) Events(ctx context.Context) (io.ReadCloser, error) {
	argv := []string{d.cfg.Drbdsetup, "events2", "--timestamps", "--statistics", "--full", "all"}
	rc, err := d.cfg.Exec.Stream(ctx, argv, d.env())
	if err != nil {
		return nil, &CommandError{Args: argv, ExitCode: -1, Kind: ErrCommandFailed, Err: err}
	}
	return rc, nil
}

// DevicePath is /dev/drbd<minor>. The minor comes from the last
// WriteConfig or, after an agent restart, from the rendered file; if
// neither is known the udev by-res link is returned.
func (d *ExecDriver) DevicePath(name string) string {
	d.mu.Lock()
	minor, ok := d.minors[name]
	d.mu.Unlock()
	if !ok {
		if m, _, err := d.selfVolume(name); err == nil {
			minor, ok = m, true
			d.mu.Lock()
			d.minors[name] = m
			d.mu.Unlock()
		}
	}
	if !ok {
		return "/dev/drbd/by-res/" + name + "/" + strconv.Itoa(VolumeNumber)
	}
	return "/dev/drbd" + strconv.Itoa(minor)
}
