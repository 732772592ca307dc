package drbd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The failures below are DRBD 9.2.18's and drbd-utils 9.22's own output,
// recorded with this driver on three DRBD 9.2.18 machines (the setup
// test/vm/README.md reproduces), pid and time included.
const (
	pretend = "found __DRBD_NODE__ in environment\n   PRETENDING that I am >>node-b<<\n\n"
	// `down` of a Primary opened read-only: DRBD had already demoted it and
	// dropped its connections.
	downReadOnlyStderr = pretend + "r0: State change failed: (-2) Need access to UpToDate data\n" +
		"additional info from kernel:\ndrbd0 opened by agent (pid 120) at 2026-11-23 18:36:46.450\n" +
		"Command 'drbdsetup down r0' terminated with exit code 17\n"
	downReadWriteStderr = pretend + "r0: State change failed: (-12) Device is held open by someone\n" +
		"additional info from kernel:\ndrbd0 opened by agent (pid 356) at 2026-11-23 18:29:18.862\n" +
		"Command 'drbdsetup down r0' terminated with exit code 11\n"
	noConfigStderr = pretend + "Can not open '/var/lib/meshvol/drbd.d/r0.res'.\n.\n"
	// Promotion refused for lack of data, without an opener: still -2.
	noDataStderr = pretend + "r0: State change failed: (-2) Need access to UpToDate data\n" +
		"Command 'drbdsetup primary r0' terminated with exit code 17\n"
)

func TestExecDriverClassifiesRealFailures(t *testing.T) {
	cases := []struct {
		name   string
		cmd    string
		stderr string
		exit   int
		kind   error
		code   int
	}{
		{"down, opened read-only", "down", downReadOnlyStderr, 17, ErrDeviceInUse, -2},
		{"down, opened read-write", "down", downReadWriteStderr, 11, ErrDeviceInUse, -12},
		{"up without a configuration file", "up", noConfigStderr, 20, ErrUnknownResource, 0},
		{"primary without a configuration file", "primary", noConfigStderr, 20, ErrUnknownResource, 0},
		{"primary without data", "primary", noDataStderr, 17, ErrNoUpToDateData, -2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, dir := newTestDriver(t, fakeStep{
				argv: []string{"drbdadm", "-c", "", c.cmd, "r0"}, env: []string{nodeEnv},
				res: Result{Stderr: []byte(c.stderr), ExitCode: c.exit},
			})
			d.cfg.Exec.(*fakeExec).steps[0].argv[2] = filepath.Join(dir, "r0.res")
			var err error
			switch c.cmd {
			case "down":
				err = d.Down(context.Background(), "r0")
			case "up":
				err = d.Up(context.Background(), "r0")
			case "primary":
				err = d.Primary(context.Background(), "r0", NoForce)
			}
			var ce *CommandError
			if !errors.Is(err, c.kind) || !errors.As(err, &ce) || ce.StateCode != c.code || ce.ExitCode != c.exit {
				t.Fatalf("got %v, want kind %v code %d exit %d", err, c.kind, c.code, c.exit)
			}
			// drbdadm's note about __DRBD_NODE__ (set on purpose) is dropped;
			// DRBD's own words stay.
			for _, noise := range []string{"__DRBD_NODE__", "PRETENDING"} {
				if strings.Contains(err.Error(), noise) || strings.Contains(ce.Stderr, noise) {
					t.Errorf("error keeps drbdadm's %q line: %v", noise, err)
				}
			}
			if !strings.Contains(err.Error(), ": "+strings.SplitN(strings.TrimPrefix(c.stderr, pretend), "\n", 2)[0]) {
				t.Errorf("error lost DRBD's first line: %v", err)
			}
		})
	}
}

// The secret as drbdsetup show --json prints it (extra-real.txt).
const testSecret = `Lab-s3cret_9f3A!x#`

const showWithSecret = `[
    {
        "resource": "r0",
        "options": { "quorum": "majority", "on-no-quorum": "io-error", "auto-promote": false },
        "_this_host": { "node-id": 0, "volumes": [ { "volume_nr": 0, "device_minor": 0,
            "backing-disk": "/dev/vda", "meta-disk": "internal" } ] },
        "connections": [ {
            "path": { "_this_host": "ipv4 10.99.0.1:7000", "_remote_host": "ipv4 10.99.0.2:7000" },
            "net": { "_name": "node2", "cram-hmac-alg": "sha256", "shared-secret": "Lab-s3cret_9f3A!x#" },
            "_peer_node_id": 1 } ]
    }
]`

// Show output holds the shared secret in clear; no way of printing it, a
// resource or its options — fmt verbs, JSON, slog with either handler, a
// CommandError carrying it — shows the secret.
func TestSharedSecretNeverPrinted(t *testing.T) {
	show, err := ParseShowJSON([]byte(showWithSecret))
	if err != nil {
		t.Fatal(err)
	}
	if got := show[0].Connections[0].Net.Secret("shared-secret"); got != testSecret {
		t.Fatalf("Secret() = %q: the parsed value must stay usable", got)
	}
	r := goldenModels()["3d"].r
	r.Options.Net.CramHMACAlg, r.Options.Net.SharedSecret = "sha256", testSecret
	values := map[string]any{
		"show": show, "connection": show[0].Connections[0], "net": show[0].Connections[0].Net,
		"resource": r, "options": r.Options, "net options": r.Options.Net,
	}
	for name, v := range values {
		var outs []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			outs = append(outs, fmt.Sprintf(verb, v))
		}
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s: json: %v", name, err)
		}
		outs = append(outs, string(j))
		for _, h := range []func(*bytes.Buffer) slog.Handler{
			func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
			func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
		} {
			var b bytes.Buffer
			slog.New(h(&b)).Info("state", "value", v)
			outs = append(outs, b.String())
		}
		for _, out := range outs {
			if strings.Contains(out, testSecret) || strings.Contains(out, "s3cret") {
				t.Errorf("%s printed the secret: %s", name, out)
			}
		}
		if !strings.Contains(strings.Join(outs, ""), Redacted) {
			t.Errorf("%s: nothing says a secret was there", name)
		}
	}
	// A command error that carries show output or a configuration line
	// (drbdadm quotes what it cannot parse).
	for _, stderr := range []string{
		showWithSecret,
		`r0.res:14: shared-secret "` + testSecret + `"; parse error`,
		fmt.Sprintf("%v", map[string]string{"shared-secret": testSecret}),
	} {
		ce := &CommandError{Args: []string{"drbdsetup", "show", "--json", "r0"}, ExitCode: 10, Stderr: stderr, Kind: ErrCommandFailed}
		if strings.Contains(ce.Error(), "s3cret") || strings.Contains(fmt.Sprintf("%v", error(ce)), "s3cret") {
			t.Errorf("CommandError printed the secret: %v", ce)
		}
		if got := cleanStderr([]byte(stderr)); strings.Contains(got, "s3cret") {
			t.Errorf("cleanStderr kept the secret: %s", got)
		}
	}
	// A malformed secret in show output is named, not quoted.
	_, err = ParseShowJSON([]byte(strings.Replace(showWithSecret, `"Lab-s3cret_9f3A!x#"`, `["Lab-s3cret_9f3A!x#"]`, 1)))
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("parse error: %v", err)
	}
}

// verify-alg is rendered (and accepted by the real drbdadm, through
// TestMain's render hook), validated like cram-hmac-alg, and negotiated
// from what each node's kernel offers.
func TestVerifyAlg(t *testing.T) {
	r := goldenModels()["3d"].r
	r.Options.Net.VerifyAlg = "crc32c"
	out, err := Render(r, Features{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "\n        verify-alg crc32c;\n") {
		t.Fatalf("no verify-alg in the net section:\n%s", out)
	}
	r.Options.Net.VerifyAlg = ""
	if out, _ := Render(r, Features{}); strings.Contains(string(out), "verify-alg") {
		t.Fatalf("verify-alg rendered while unset")
	}
	r.Options.Net.VerifyAlg = "crc32c; shared-secret x"
	if err := r.Validate(Features{}); err == nil || !strings.Contains(err.Error(), "net.verifyAlg") {
		t.Fatalf("bad verify-alg accepted: %v", err)
	}
	// Resolve carries it through the override chain.
	o := Resolve(DefaultOptions(), OptionSet{Net: NetOptionSet{VerifyAlg: Ptr("sha256")}})
	if o.Net.VerifyAlg != "sha256" || !strings.Contains(o.String(), `verify-alg="sha256"`) {
		t.Fatalf("resolved %s", o)
	}

	procCrypto := "name         : crc32c\ndriver       : crc32c-intel\ntype         : shash\n\n" +
		"name         : hmac(sha256)\ntype         : shash\n\n" +
		"name         : sha256\ntype         : shash\n\n" +
		"name         : aes\ntype         : cipher\n\n" +
		"name         : crc32c\ndriver       : crc32c-generic\ntype         : shash\n\n" +
		"name         : md5\ntype         : ahash\n"
	got := ParseProcCrypto([]byte(procCrypto))
	if strings.Join(got, ",") != "crc32c,sha256,md5" {
		t.Fatalf("ParseProcCrypto = %q", got)
	}
	if alg := Negotiate(VerifyAlgPreference, got, []string{"sha1", "sha256"}); alg != "sha256" {
		t.Fatalf("Negotiate = %q, want the first preferred name every node offers (sha256)", alg)
	}
	if alg := Negotiate(HMACAlgPreference, got, []string{"sha1"}); alg != "" {
		t.Fatalf("Negotiate = %q with nothing in common", alg)
	}
	if alg := Negotiate(VerifyAlgPreference); alg != "" {
		t.Fatalf("Negotiate without nodes = %q", alg)
	}
	// This machine's kernel offers at least one preferred verify-alg.
	if algs, err := KernelHashAlgorithms(""); err != nil || Negotiate(VerifyAlgPreference, algs) == "" {
		t.Fatalf("this kernel: %q, %v", algs, err)
	}
}

// DeviceOpeners finds this process holding a file, with the right mode.
func TestDeviceOpeners(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dev")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if op, err := DeviceOpeners(path); err != nil || len(op) != 0 {
		t.Fatalf("closed file: %v %v", op, err)
	}
	if op, err := DeviceOpeners(path + ".missing"); err != nil || len(op) != 0 {
		t.Fatalf("missing file: %v %v", op, err)
	}
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	op, err := DeviceOpeners(path)
	if err != nil || len(op) != 1 || op[0].PID != os.Getpid() || op[0].Write {
		t.Fatalf("read-only: %v %v", op, err)
	}
	ro.Close()
	rw, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	op, err = DeviceOpeners(path)
	if err != nil || len(op) != 1 || !op[0].Write || !strings.Contains(op[0].String(), "read-write") {
		t.Fatalf("read-write: %v %v", op, err)
	}
}
