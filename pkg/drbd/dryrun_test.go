package drbd

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dryRunExec runs drbdadm for real with --dry-run (-d), which makes it
// print the drbdsetup/drbdmeta commands it would run instead of running
// them. It proves the driver's argv is one drbdadm 9.22 accepts, and shows
// what each option turns into in the kernel.
type dryRunExec struct {
	t      *testing.T
	output []string
}

func (e *dryRunExec) Run(ctx context.Context, argv, env []string) (Result, error) {
	if argv[0] != "drbdadm" {
		e.t.Fatalf("dry run of non-drbdadm command %q", argv)
	}
	bin, err := drbdadmPath()
	if err != nil {
		e.t.Fatal(err)
	}
	full := append([]string{bin, "-d"}, argv[1:]...)
	res, err := OSExecutor{}.Run(ctx, full, env)
	if err == nil && res.ExitCode != 0 {
		e.t.Fatalf("drbdadm -d %q: exit %d: %s", argv[1:], res.ExitCode, res.Stderr)
	}
	e.output = append(e.output, string(res.Stdout))
	return res, err
}

func (e *dryRunExec) Stream(context.Context, []string, []string) (io.ReadCloser, error) {
	e.t.Fatal("no streams in a dry run")
	return nil, nil
}

func TestExecDriverArgvAcceptedByDrbdadm(t *testing.T) {
	dir := t.TempDir()
	m := goldenModels()["2d-tb-from-d"]
	text := renderChecked(t, m.r, m.f)
	if err := os.WriteFile(filepath.Join(dir, m.r.Name+".res"), text, 0o600); err != nil {
		t.Fatal(err)
	}
	ex := &dryRunExec{t: t}
	d := NewExecDriver(ExecConfig{NodeName: m.r.Self.Name, ConfDir: dir, Exec: ex})
	ctx := context.Background()
	name := m.r.Name
	steps := []struct {
		do   func() error
		want []string
	}{
		{func() error { return d.CreateMetadata(ctx, name, 7) },
			[]string{"drbdmeta 1002 v09 /dev/vg0/pvc-2dtb_00000 internal create-md 7 --force"}},
		{func() error { return d.Up(ctx, name) }, []string{
			"drbdsetup new-resource pvc-2dtb 0 --auto-promote=no --quorum=majority --quorum-minimum-redundancy=off --on-no-quorum=suspend-io --on-no-data-accessible=io-error",
			"drbdsetup new-minor pvc-2dtb 1002 0",
			"drbdsetup new-peer pvc-2dtb 1 --_name=node-b --ping-timeout=5 --allow-two-primaries=no --protocol=C --allow-remote-read=yes",
			"drbdsetup new-peer pvc-2dtb 2 --_name=node-t --ping-timeout=5 --allow-two-primaries=no --protocol=C --allow-remote-read=yes",
			"drbdsetup new-path pvc-2dtb 2 ipv4:10.0.0.1:7002 ipv4:10.0.0.9:7002",
			// c-max-rate, rendered in this volume's disk section, reaches the
			// peer device on every connection; the diskless TieBreaker gets
			// no bitmap slot.
			"drbdsetup peer-device-options pvc-2dtb 1 0 --c-max-rate=102400",
			"drbdsetup peer-device-options pvc-2dtb 2 0 --c-max-rate=102400 --bitmap=no",
			"drbdsetup attach 1002 /dev/vg0/pvc-2dtb_00000 /dev/vg0/pvc-2dtb_00000 internal --discard-zeroes-if-aligned=yes --rs-discard-granularity=0",
			"drbdsetup connect pvc-2dtb 2",
		}},
		{func() error { return d.Adjust(ctx, name) }, []string{"drbdsetup new-resource pvc-2dtb 0"}},
		{func() error { return d.Primary(ctx, name, NoForce) }, []string{"drbdsetup primary pvc-2dtb\n"}},
		{func() error { return d.Primary(ctx, name, "test") }, []string{"drbdsetup primary pvc-2dtb --force"}},
		{func() error { return d.Secondary(ctx, name) }, []string{"drbdsetup secondary pvc-2dtb"}},
		{func() error { return d.NewCurrentUUIDClearBitmap(ctx, name) }, []string{"drbdsetup new-current-uuid 1002 --clear-bitmap"}},
		{func() error { return d.Resize(ctx, name) }, []string{"drbdsetup resize 1002", "drbdsetup check-resize 1002"}},
		{func() error { return d.Down(ctx, name) }, []string{"drbdsetup down pvc-2dtb"}},
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		out := ex.output[len(ex.output)-1]
		for _, w := range s.want {
			if !strings.Contains(out, w) {
				t.Errorf("step %d: drbdadm -d printed\n%s\nwithout %q", i, out, w)
			}
		}
	}
}

// What each rendered option becomes in the kernel, per drbdadm's own
// translation: allow-remote-read lands on the one connection it was set
// for, the secret and ping-timeout on every peer, c-max-rate (a
// peer-device option in the disk section) on every peer device, the
// resource options on new-resource.
func TestRenderedOptionsReachTheKernel(t *testing.T) {
	m := goldenModels()["options-overridden"]
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, m.r.Name+".res"), renderChecked(t, m.r, m.f), 0o600); err != nil {
		t.Fatal(err)
	}
	ex := &dryRunExec{t: t}
	d := NewExecDriver(ExecConfig{NodeName: m.r.Self.Name, ConfDir: dir, Exec: ex})
	if err := d.Up(context.Background(), m.r.Name); err != nil {
		t.Fatal(err)
	}
	out := ex.output[0]
	for _, w := range []string{
		"new-resource pvc-tuned 0 --auto-promote=no --quorum=all --quorum-minimum-redundancy=off --on-no-quorum=io-error --on-no-data-accessible=suspend-io",
		"new-peer pvc-tuned 1 --_name=node-b --ping-timeout=10 --shared-secret=Zq3-not-a-real-secret_9x --cram-hmac-alg=sha256 --allow-two-primaries=no --protocol=C --allow-remote-read=yes",
		"new-peer pvc-tuned 2 --_name=node-t --ping-timeout=10 --shared-secret=Zq3-not-a-real-secret_9x --cram-hmac-alg=sha256 --allow-two-primaries=no --protocol=C --allow-remote-read=no",
		"peer-device-options pvc-tuned 1 0 --c-max-rate=4096\n",
		"peer-device-options pvc-tuned 2 0 --c-max-rate=4096 --bitmap=no",
		"--discard-zeroes-if-aligned=no --rs-discard-granularity=65536",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("drbdadm -d up printed\n%s\nwithout %q", out, w)
		}
	}
}
