package drbd

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

const nodeEnv = "__DRBD_NODE__=node-b"

func newTestDriver(t *testing.T, steps ...fakeStep) (*ExecDriver, string) {
	dir := t.TempDir()
	d := NewExecDriver(ExecConfig{
		NodeName: "node-b", ConfDir: dir, Timeout: 5 * time.Second,
		ProcDRBD: captures.Path(t, "proc-drbd.txt"),
		Exec:     newFakeExec(t, steps...),
	})
	return d, dir
}

func TestExecDriverArgv(t *testing.T) {
	ctx := context.Background()
	type call struct {
		name string
		do   func(d *ExecDriver) error
		argv func(dir string) []string
	}
	adm := func(dir string, args ...string) []string {
		return append([]string{"drbdadm", "-c", filepath.Join(dir, "pvc-1.res")}, args...)
	}
	calls := []call{
		{"up", func(d *ExecDriver) error { return d.Up(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "up", "pvc-1") }},
		{"adjust", func(d *ExecDriver) error { return d.Adjust(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "adjust", "pvc-1") }},
		{"down", func(d *ExecDriver) error { return d.Down(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "down", "pvc-1") }},
		{"primary", func(d *ExecDriver) error { return d.Primary(ctx, "pvc-1", NoForce) }, func(dir string) []string { return adm(dir, "primary", "pvc-1") }},
		{"primary forced", func(d *ExecDriver) error {
			return d.Primary(ctx, "pvc-1", "formation: first primary of an empty volume")
		},
			func(dir string) []string { return adm(dir, "primary", "--force", "pvc-1") }},
		{"secondary", func(d *ExecDriver) error { return d.Secondary(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "secondary", "pvc-1") }},
		{"create-md", func(d *ExecDriver) error { return d.CreateMetadata(ctx, "pvc-1", 7) },
			func(dir string) []string { return adm(dir, "create-md", "--max-peers=7", "--force", "pvc-1") }},
		{"new-current-uuid", func(d *ExecDriver) error { return d.NewCurrentUUIDClearBitmap(ctx, "pvc-1") },
			func(dir string) []string { return adm(dir, "new-current-uuid", "--clear-bitmap", "pvc-1/0") }},
		{"resize", func(d *ExecDriver) error { return d.Resize(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "resize", "pvc-1") }},
		{"suspend-io", func(d *ExecDriver) error { return d.SuspendIO(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "suspend-io", "pvc-1") }},
		{"resume-io", func(d *ExecDriver) error { return d.ResumeIO(ctx, "pvc-1") }, func(dir string) []string { return adm(dir, "resume-io", "pvc-1") }},
		{"forget-peer", func(d *ExecDriver) error { return d.ForgetPeer(ctx, "pvc-1", 3) },
			func(string) []string { return []string{"drbdsetup", "forget-peer", "pvc-1", "3"} }},
		{"verify", func(d *ExecDriver) error { return d.Verify(ctx, "pvc-1", 2) },
			func(string) []string { return []string{"drbdsetup", "verify", "pvc-1", "2", "0"} }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			// The directory is known only after the driver exists; build the
			// fake with a placeholder and fix its argv.
			f := newFakeExec(t)
			dir := t.TempDir()
			d := NewExecDriver(ExecConfig{NodeName: "node-b", ConfDir: dir, Exec: f})
			f.steps = []fakeStep{{argv: c.argv(dir), env: []string{nodeEnv}}}
			if err := c.do(d); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Reconnect disconnects one peer and connects it again with drbdsetup, with
// --force when asked; a disconnect DRBD refuses (a peer's veto, as a quorate Primary gives one that
// would take its quorum) is returned classified, naming the resource and the
// peer, and no connect follows it.
func TestExecDriverReconnect(t *testing.T) {
	ctx := context.Background()
	d, _ := newTestDriver(t,
		fakeStep{argv: []string{"drbdsetup", "disconnect", "pvc-1", "2"}, env: []string{nodeEnv}},
		fakeStep{argv: []string{"drbdsetup", "connect", "pvc-1", "2"}, env: []string{nodeEnv}},
		fakeStep{argv: []string{"drbdsetup", "disconnect", "pvc-1", "0", "--force"}, env: []string{nodeEnv}},
		fakeStep{argv: []string{"drbdsetup", "connect", "pvc-1", "0"}, env: []string{nodeEnv}},
	)
	if err := d.Reconnect(ctx, "pvc-1", 2, NoForce); err != nil {
		t.Fatal(err)
	}
	if err := d.Reconnect(ctx, "pvc-1", 0, "test: a refused disconnect"); err != nil {
		t.Fatal(err)
	}
	d, _ = newTestDriver(t, fakeStep{argv: []string{"drbdsetup", "disconnect", "pvc-1", "0"}, env: []string{nodeEnv},
		res: Result{Stderr: []byte("pvc-1: State change failed: (-10) State change was refused by peer node\n"), ExitCode: 11}})
	err := d.Reconnect(ctx, "pvc-1", 0, NoForce)
	if !errors.Is(err, ErrStateChangeRefused) || !strings.Contains(err.Error(), "disconnect pvc-1 from peer node-id 0") {
		t.Fatalf("refused disconnect: got %v, want ErrStateChangeRefused naming pvc-1 and peer 0", err)
	}
	if err := d.Reconnect(ctx, "pvc-1", 32, NoForce); err == nil {
		t.Fatal("peer node-id 32 accepted")
	}
}

func TestExecDriverRejectsBadArguments(t *testing.T) {
	d, _ := newTestDriver(t) // no command may run
	ctx := context.Background()
	for name, err := range map[string]error{
		"bad name":       d.Up(ctx, "a b"),
		"peer id":        d.ForgetPeer(ctx, "pvc-1", 32),
		"verify peer":    d.Verify(ctx, "pvc-1", -1),
		"max peers":      d.CreateMetadata(ctx, "pvc-1", 0),
		"status name":    func() error { _, err := d.Status(ctx, "-x"); return err }(),
		"config vs node": d.WriteConfig(ctx, goldenModels()["3d"].r.withSelfName("node-z")),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func (r *Resource) withSelfName(n string) *Resource {
	c := *r
	c.Self.Name = n
	return &c
}

// A refused promotion carries DRBD's words and is classified. The text
// follows drbdsetup's print_config_error format ("<obj>: State change
// failed: (<code>) <string>", kernel detail after "additional info from
// kernel:", exit 11) and the -25 messages recorded in docs/drbd-quorum.md; the
// captures hold a refused write (EIO), not a refused promotion.
func TestExecDriverClassifiesErrors(t *testing.T) {
	cases := []struct {
		stderr string
		exit   int
		kind   error
		code   int
	}{
		{"pvc-1: State change failed: (-25) No quorum\nadditional info from kernel:\nNo UpToDate peer with quorum\nCommand 'drbdsetup primary pvc-1' terminated with exit code 11\n", 11, ErrNoQuorum, -25},
		{"pvc-1: State change failed: (-25) No quorum\nadditional info from kernel:\n1 of 3 nodes visible, need 2 for quorum\n", 11, ErrNoQuorum, -25},
		{"pvc-1: State change failed: (-2) Need access to UpToDate data\nCommand 'drbdsetup primary pvc-1' terminated with exit code 17\n", 17, ErrNoUpToDateData, -2},
		{"pvc-1: State change failed: (-12) Device is held open by someone\n", 11, ErrDeviceInUse, -12},
		{"pvc-1: State change failed: (-1) Multiple primaries not allowed by config\n", 11, ErrTwoPrimaries, -1},
		{"pvc-1: State change failed: (-10) State change was refused by peer node\n", 11, ErrStateChangeRefused, -10},
		{"pvc-1: Failure: (158) Unknown resource\n", 10, ErrUnknownResource, 158},
		{"pvc-1: Failure: (119) No valid meta-data signature found.\n", 10, ErrNoMetadata, 119},
		{"'pvc-1' not defined in your config (for this host).\n", 10, ErrUnknownResource, 0},
		{"something else entirely\n", 20, ErrCommandFailed, 0},
	}
	for _, c := range cases {
		d, dir := newTestDriver(t, fakeStep{
			argv: []string{"drbdadm", "-c", "", "primary", "pvc-1"}, env: []string{nodeEnv},
			res: Result{Stderr: []byte(c.stderr), ExitCode: c.exit},
		})
		d.cfg.Exec.(*fakeExec).steps[0].argv[2] = filepath.Join(dir, "pvc-1.res")
		err := d.Primary(context.Background(), "pvc-1", NoForce)
		var ce *CommandError
		if !errors.Is(err, c.kind) || !errors.As(err, &ce) || ce.StateCode != c.code || ce.ExitCode != c.exit {
			t.Errorf("stderr %q: got %v (code %d), want kind %v code %d", c.stderr, err, ce.StateCode, c.kind, c.code)
			continue
		}
		if !strings.Contains(err.Error(), strings.TrimSpace(strings.SplitN(c.stderr, "\n", 2)[0])) ||
			!strings.Contains(err.Error(), "drbdadm -c "+dir) {
			t.Errorf("error does not keep command line and stderr: %v", err)
		}
	}
}

func TestExecDriverTimeoutKills(t *testing.T) {
	d, dir := newTestDriver(t, fakeStep{argv: []string{"drbdadm", "-c", "", "adjust", "pvc-1"}, env: []string{nodeEnv}, hang: true})
	d.cfg.Exec.(*fakeExec).steps[0].argv[2] = filepath.Join(dir, "pvc-1.res")
	d.cfg.Timeout = 20 * time.Millisecond
	err := d.Adjust(context.Background(), "pvc-1")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("want ErrTimeout, got %v", err)
	}
	if !strings.Contains(err.Error(), "drbdadm -c "+filepath.Join(dir, "pvc-1.res")+" adjust pvc-1") {
		t.Fatalf("timeout error lacks the command line: %v", err)
	}
}

// The real executor kills the whole process group: a hung grandchild (as
// drbdsetup under drbdadm) must not keep the call alive.
func TestOSExecutorKillsProcessGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := OSExecutor{KillGrace: 100 * time.Millisecond}.Run(ctx, []string{"sh", "-c", "sleep 60 & sleep 60; wait"}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want deadline exceeded, got %v", err)
	}
	if time.Since(start) > 20*time.Second {
		t.Fatalf("hung command was not killed")
	}
	res, err := OSExecutor{}.Run(context.Background(), []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, []string{"X=1"})
	if err != nil || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" || res.ExitCode != 3 {
		t.Fatalf("run: %+v %v", res, err)
	}
}

func TestExecDriverWriteConfig(t *testing.T) {
	dir := t.TempDir()
	f := newFakeExec(t, realDrbdadmDump(dir, "pvc-3d", []string{nodeEnv}))
	d := NewExecDriver(ExecConfig{NodeName: "node-b", ConfDir: dir, Exec: f})
	r := goldenModels()["3d"].r
	if err := d.WriteConfig(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "pvc-3d.res"))
	if err != nil {
		t.Fatal(err)
	}
	want := renderChecked(t, r, Features{})
	if string(got) != string(want) {
		t.Fatalf("written file differs from Render")
	}
	st, _ := os.Stat(filepath.Join(dir, "pvc-3d.res"))
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600 (the file may hold the shared secret)", st.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temp files left behind: %v", entries)
	}
	if p := d.DevicePath("pvc-3d"); p != "/dev/drbd1001" {
		t.Fatalf("DevicePath = %q", p)
	}
	// After an agent restart the minor is read back from the file.
	d2 := NewExecDriver(ExecConfig{NodeName: "node-b", ConfDir: dir, Exec: newFakeExec(t)})
	if p := d2.DevicePath("pvc-3d"); p != "/dev/drbd1001" {
		t.Fatalf("DevicePath after restart = %q", p)
	}
	if p := d2.DevicePath("pvc-unknown"); p != "/dev/drbd/by-res/pvc-unknown/0" {
		t.Fatalf("DevicePath of unknown = %q", p)
	}
	if err := d2.RemoveConfig(context.Background(), "pvc-3d"); err != nil {
		t.Fatal(err)
	}
	if err := d2.RemoveConfig(context.Background(), "pvc-3d"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

func TestExecDriverWriteConfigRejectedByDrbdadm(t *testing.T) {
	dir := t.TempDir()
	step := realDrbdadmDump(dir, "pvc-3d", []string{nodeEnv})
	step.real = false
	step.res = Result{ExitCode: 10, Stderr: []byte("x.res:3: Parse error: 'an option keyword' expected,\n\tbut got 'non-voting'\n")}
	d := NewExecDriver(ExecConfig{NodeName: "node-b", ConfDir: dir, Exec: newFakeExec(t, step)})
	err := d.WriteConfig(context.Background(), goldenModels()["3d"].r)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "non-voting") {
		t.Fatalf("want ErrInvalidConfig with drbdadm's words, got %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("rejected file left in place: %v", entries)
	}
}

func TestExecDriverHasMetadata(t *testing.T) {
	dir := t.TempDir()
	r := goldenModels()["3d"].r
	env := []string{nodeEnv}
	statusArgv := []string{"drbdsetup", "status", "--json", "--verbose", "--statistics", "pvc-3d"}
	dstate := []string{"drbdmeta", "1001", "v09", "/dev/vg0/pvc-3d_00000", "internal", "dstate"}
	f := newFakeExec(t,
		realDrbdadmDump(dir, "pvc-3d", env),
		// Not up, and drbdmeta finds no metadata.
		fakeStep{argv: statusArgv, env: env, res: Result{ExitCode: 10, Stderr: []byte("pvc-3d: No such resource\n")}},
		fakeStep{argv: dstate, env: env, res: Result{ExitCode: 255, Stderr: []byte("No valid meta data found\n")}},
		// Not up, metadata present.
		fakeStep{argv: statusArgv, env: env, res: Result{ExitCode: 10, Stderr: []byte("pvc-3d: No such resource\n")}},
		fakeStep{argv: dstate, env: env, res: Result{Stdout: []byte("Inconsistent\n")}},
		// Up and attached: the kernel holds the device, no drbdmeta call.
		fakeStep{argv: statusArgv, env: env, res: Result{Stdout: captures.Read(t, "01-up-inconsistent/node1.status-json-verbose-statistics.json")}},
	)
	d := NewExecDriver(ExecConfig{NodeName: "node-b", ConfDir: dir, Exec: f})
	ctx := context.Background()
	if err := d.WriteConfig(ctx, r); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true, true} {
		got, err := d.HasMetadata(ctx, "pvc-3d")
		if err != nil || got != want {
			t.Fatalf("call %d: HasMetadata = %v, %v; want %v", i, got, err, want)
		}
	}
	if _, err := d.HasMetadata(ctx, "pvc-missing"); !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("missing config: %v", err)
	}
}

func TestExecDriverStatusShowEvents(t *testing.T) {
	env := []string{nodeEnv}
	d, _ := newTestDriver(t,
		fakeStep{argv: []string{"drbdsetup", "status", "--json", "--verbose", "--statistics", "all"}, env: env,
			res: Result{Stdout: captures.Read(t, "03-primary-with-data/node1.status-json-verbose-statistics.json")}},
		fakeStep{argv: []string{"drbdsetup", "show", "--json", "r0"}, env: env,
			res: Result{Stdout: captures.Read(t, "03-primary-with-data/node1.show-json.json")}},
		fakeStep{argv: []string{"drbdsetup", "status", "--json", "--verbose", "--statistics", "r9"}, env: env,
			res: Result{ExitCode: 10, Stderr: []byte("r9: No such resource\n")}},
		fakeStep{argv: []string{"drbdsetup", "events2", "--timestamps", "--statistics", "--full", "all"}, env: env,
			stream: string(captures.Read(t, "04-failover-event-stream/node1.events2-timestamps-statistics-stream.txt"))},
		fakeStep{argv: []string{"drbdadm", "--version"}, env: env, res: Result{Stdout: captures.Read(t, "drbdadm--version.txt")}},
		fakeStep{argv: []string{"drbdsetup", "help", "disk-options"}, env: env, res: Result{Stdout: mustRead(t, "testdata/exec/drbdsetup-help-disk-options.txt")}},
	)
	ctx := context.Background()
	st, err := d.Status(ctx, "")
	if err != nil || len(st) != 1 || st[0].Role != "Primary" {
		t.Fatalf("status: %+v %v", st, err)
	}
	sh, err := d.Show(ctx, "r0")
	if err != nil || len(sh) != 1 || sh[0].Resource != "r0" {
		t.Fatalf("show: %+v %v", sh, err)
	}
	if _, err := d.Status(ctx, "r9"); !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("unknown resource: %v", err)
	}
	rc, err := d.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rc.Close()
	v, err := d.Version(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.UtilsVersion != "9.22.0" || v.UtilsVersionCode != 0x091600 || v.KernelVersion != "9.2.18" ||
		v.KernelVersionCode != 0x090212 || v.ProcVersion != "9.2.18" || v.ProtoMin != 118 || v.ProtoMax != 124 ||
		len(v.Transports) != 1 || v.Transports[0] != "tcp" || !v.KernelLoaded() ||
		!strings.Contains(v.UtilsBuildTag, "reproducible build, 2023-01-09") {
		t.Fatalf("version: %+v", v)
	}
	feat, err := d.ProbeFeatures(ctx)
	if err != nil || feat.NonVoting {
		t.Fatalf("drbd-utils 9.22 has no non-voting: %+v %v", feat, err)
	}
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseVersionWithoutModule(t *testing.T) {
	// As printed here, where drbd-utils is installed but no module is loaded.
	out := "DRBDADM_BUILDTAG=GIT-hash:\\ 409097fe\\ reproducible\\ build\\,\\ 2023-01-09\nDRBDADM_API_VERSION=2\nDRBD_KERNEL_VERSION_CODE=0x000000\nDRBD_KERNEL_VERSION=0\nDRBDADM_VERSION_CODE=0x091600\nDRBDADM_VERSION=9.22.0\n"
	v, err := ParseDrbdadmVersion([]byte(out))
	if err != nil || v.KernelLoaded() || v.UtilsVersion != "9.22.0" {
		t.Fatalf("%+v %v", v, err)
	}
	if _, err := ParseDrbdadmVersion([]byte("garbage")); err == nil {
		t.Fatal("garbage accepted")
	}
	if err := ParseProcDRBD([]byte("nothing"), &v); err == nil {
		t.Fatal("bad /proc/drbd accepted")
	}
}

// A stream whose program fails says why when it ends; Close of a running
// one kills it.
func TestOSExecutorStream(t *testing.T) {
	rc, err := OSExecutor{}.Stream(context.Background(), []string{"sh", "-c", "echo exists -; echo Failed to modprobe drbd >&2; exit 20"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	var ce *CommandError
	if string(b) != "exists -\n" || !errors.As(err, &ce) || ce.ExitCode != 20 || !strings.Contains(err.Error(), "Failed to modprobe drbd") {
		t.Fatalf("read %q, err %v", b, err)
	}
	rc.Close()

	rc, err = OSExecutor{}.Stream(context.Background(), []string{"sh", "-c", "echo x; exec sleep 60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(rc, buf); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rc.Close()
	if time.Since(start) > 20*time.Second {
		t.Fatal("Close did not kill the stream")
	}
}
