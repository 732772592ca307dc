package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/meshvol/meshvol/pkg/agent"
	"github.com/meshvol/meshvol/pkg/nodecheck"
)

func TestNodeNeedsNodeName(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	var out, errb bytes.Buffer
	if code := run([]string{"node"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--node-name") {
		t.Fatalf("exit %d, stderr %q; want 2 naming --node-name", code, errb.String())
	}
	if code := run([]string{"node", "--address", "not-an-ip", "--node-name", "n1"}, &out, &errb); code != 2 {
		t.Fatalf("bad --address: exit %d, want 2", code)
	}
}

func TestNodeRegistrationNeedsCSIEndpoint(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"node", "--node-name", "n1", "--kubelet-registration-dir", t.TempDir()}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--csi-endpoint") {
		t.Fatalf("exit %d, stderr %q: want 2 and a word about --csi-endpoint", code, errb.String())
	}
}

func TestKernelAlgorithms(t *testing.T) {
	p := filepath.Join(t.TempDir(), "crypto")
	data := "name         : hmac(sha256)\ndriver       : hmac(sha256-generic)\n\nname         : crc32c\n\nname         : sha1\n"
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	hmac, verify := kernelAlgorithms(p)
	if !slices.Equal(hmac, []string{"sha256", "sha1"}) || !slices.Equal(verify, []string{"crc32c", "sha1"}) {
		t.Fatalf("hmac %v verify %v", hmac, verify)
	}
}

func TestNodeLeaseFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--lease-duration", "1500ms"}, {"--lease-duration", "0s"}, {"--lease-renew-interval", "0s"},
		{"--lease-duration", "4s", "--lease-renew-interval", "3s"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"node", "--node-name", "n1"}, args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "--lease-duration") {
			t.Errorf("%v: exit %d, stderr %q; want 2 naming --lease-duration", args, code, errb.String())
		}
	}
}

func TestNodeSlowCommandTimeoutFlag(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"node", "--node-name", "n1", "--command-timeout", "1m", "--slow-command-timeout", "30s"}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "--slow-command-timeout 30s: must be at least --command-timeout (1m0s)") {
		t.Errorf("exit %d, stderr %q; want 2 naming both flags and the rule", code, errb.String())
	}
}

// A prerequisite check that runs out of its time reports nothing new: its
// unfinished findings (a killed `drbdadm --version`) are not missing
// prerequisites; the previous findings stay and the next call checks again.
// A check that finishes is kept for a minute.
func TestPrerequisitesIgnoreAnUnfinishedCheck(t *testing.T) {
	missing := nodecheck.Finding{Name: "drbd kernel module", Detail: "not loaded"}
	killed := nodecheck.Finding{Name: "drbd-utils", Detail: "`drbdadm --version` failed: signal: killed"}
	var calls int
	slow := true
	check := prerequisitesOf(logr.Discard(), func(ctx context.Context, _ agent.PoolTypes) []nodecheck.Finding {
		calls++
		if slow {
			<-ctx.Done()
			return []nodecheck.Finding{missing, killed}
		}
		return []nodecheck.Finding{missing, {Name: "drbd-utils", OK: true, Detail: "drbdadm 9.22.0"}}
	}, 10*time.Millisecond, time.Minute)
	var none agent.PoolTypes
	if got := check(none); len(got) != 0 {
		t.Fatalf("an unfinished first check reported %q, want nothing", got)
	}
	slow = false
	want := []string{missing.String()}
	if got := check(none); !slices.Equal(got, want) || calls != 2 {
		t.Fatalf("after an unfinished check: %q in %d calls, want %q checked again", got, calls, want)
	}
	slow = true
	if got := check(none); !slices.Equal(got, want) || calls != 2 {
		t.Fatalf("within the minute: %q in %d calls, want the finished check's %q without a new one", got, calls, want)
	}
}

// The check covers the kinds of pool the node serves: device-mapper for LVM, its thin
// target for LVMThin. A node that starts serving another kind is checked again at once,
// not a minute later.
func TestPrerequisitesFollowThePoolsServed(t *testing.T) {
	var asked []agent.PoolTypes
	check := prerequisitesOf(logr.Discard(), func(ctx context.Context, served agent.PoolTypes) []nodecheck.Finding {
		asked = append(asked, served)
		if served.Thin {
			return []nodecheck.Finding{{Name: "device-mapper thin provisioning", Detail: "not loaded"}}
		}
		return nil
	}, time.Second, time.Minute)
	if got := check(agent.PoolTypes{}); len(got) != 0 {
		t.Fatalf("a node serving file pools only: %q missing", got)
	}
	thin := agent.PoolTypes{Thin: true}
	if got := check(thin); len(got) != 1 || len(asked) != 2 || asked[1] != thin {
		t.Fatalf("a node now serving an LVMThin pool: %q missing after checks for %+v, want the thin target checked at once", got, asked)
	}
}

// The interval between checks is the flag's: once it has passed, the next
// renewal checks again (a module loaded meanwhile is found); before, the
// previous findings stand. A non-positive interval is refused.
func TestPrerequisiteCheckInterval(t *testing.T) {
	var calls int
	check := prerequisitesOf(logr.Discard(), func(context.Context, agent.PoolTypes) []nodecheck.Finding {
		calls++
		return nil
	}, time.Second, 50*time.Millisecond)
	var none agent.PoolTypes
	check(none)
	check(none)
	if calls != 1 {
		t.Fatalf("two calls within the interval ran %d checks, want 1", calls)
	}
	time.Sleep(60 * time.Millisecond)
	check(none)
	if calls != 2 {
		t.Fatalf("a call after the interval ran %d checks in all, want 2", calls)
	}
	for _, v := range []string{"0s", "-1s"} {
		var out, errb bytes.Buffer
		if code := run([]string{"node", "--node-name", "n1", "--prerequisite-check-interval", v}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--prerequisite-check-interval") {
			t.Errorf("--prerequisite-check-interval %s: exit %d, stderr %q; want 2 naming the flag", v, code, errb.String())
		}
	}
}

// TestDriverLogReachesTheNodeLog: what the DRBD driver logs — a command killed
// at its timeout — appears in the node's log at the default verbosity, and
// the per-command debug lines only at -v 4.
func TestDriverLogReachesTheNodeLog(t *testing.T) {
	for _, v := range []int{0, 4} {
		var lines []string
		log := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{Verbosity: v})
		d := driverLog(log)
		d.Warn("drbd command timed out and was killed", "argv", []string{"drbdadm", "adjust", "r0"}, "timeout", 30*time.Second)
		d.Debug("drbd command", "argv", []string{"drbdsetup", "status"}, "took", time.Millisecond)
		want := 1
		if v >= 4 {
			want = 2
		}
		if len(lines) != want {
			t.Fatalf("-v %d: %d lines logged, want %d: %q", v, len(lines), want, lines)
		}
		if !strings.Contains(lines[0], "drbd") || !strings.Contains(lines[0], "timed out and was killed") || !strings.Contains(lines[0], "adjust") {
			t.Errorf("-v %d: the killed command logged as %q, want its name, message and argv", v, lines[0])
		}
	}
}
