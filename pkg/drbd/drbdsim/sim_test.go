package drbdsim

import (
	"context"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// r0 is the captures' resource as node name sees it (node1 and node2
// diskful, node3 diskless, quorum majority, on-no-quorum io-error), with
// the backing files of dir and the options changed by mutate.
func r0(dir, name string, mutate func(node string, o *drbd.OptionSet)) *drbd.Resource {
	var tune func(*drbd.OptionSet)
	if mutate != nil {
		tune = func(o *drbd.OptionSet) { mutate(name, o) }
	}
	return contract.CapturedResource(name, filepath.Join(dir, name+".img"), tune)
}

type rig struct {
	t   testing.TB
	c   *Cluster
	dir string
	ctx context.Context
}

func newRig(t testing.TB, mutate func(node string, o *drbd.OptionSet)) *rig {
	t.Helper()
	dir := t.TempDir()
	rg := &rig{t: t, c: NewCluster(Options{Dir: dir, Seed: 1}), dir: dir, ctx: context.Background()}
	contract.SparseBackingFiles(t, dir)
	for _, n := range []string{"node1", "node2", "node3"} {
		node := rg.c.Node(n)
		rg.must(node.WriteConfig(rg.ctx, r0(dir, n, mutate)))
		if n != "node3" {
			rg.must(node.CreateMetadata(rg.ctx, "r0", 2))
		}
	}
	return rg
}

func (rg *rig) must(err error) {
	rg.t.Helper()
	if err != nil {
		rg.t.Fatal(err)
	}
}

func (rg *rig) upAll() {
	for _, n := range []string{"node1", "node2", "node3"} {
		rg.must(rg.c.Node(n).Up(rg.ctx, "r0"))
	}
}

// The exists dump of every node after up equals capture 01 byte for byte,
// except the backing device path.
func TestCapture01ExistsDump(t *testing.T) {
	rg := newRig(t, nil)
	rg.upAll()
	for _, n := range []string{"node1", "node2", "node3"} {
		got, err := rg.c.Node(n).EventsNow(rg.ctx)
		rg.must(err)
		got = strings.ReplaceAll(got, filepath.Join(rg.dir, n+".img"), "/dev/vda")
		want := string(captures.Read(t, "01-up-inconsistent/"+n+".events2-now-statistics.txt"))
		if got != want {
			t.Errorf("%s events2 --now differs\n got:\n%s\nwant:\n%s", n, got, want)
		}
	}
}

// status --json and show --json after up equal capture 01 byte for byte
// (show: up to the backing device path).
func TestCapture01JSONBytes(t *testing.T) {
	rg := newRig(t, func(_ string, o *drbd.OptionSet) { o.Resource.AutoPromote = drbd.Ptr(true) })
	rg.upAll()
	for _, n := range []string{"node1", "node2", "node3"} {
		got, err := rg.c.Node(n).StatusJSON(rg.ctx, "r0")
		rg.must(err)
		if want := string(captures.Read(t, "01-up-inconsistent/"+n+".status-json-verbose-statistics.json")); string(got) != want {
			t.Errorf("%s status --json differs\n got:\n%s\nwant:\n%s", n, got, want)
		}
		show, err := rg.c.Node(n).ShowJSON(rg.ctx, "r0")
		rg.must(err)
		gotShow := strings.ReplaceAll(string(show), filepath.Join(rg.dir, n+".img"), "/dev/vda")
		if want := string(captures.Read(t, "01-up-inconsistent/"+n+".show-json.json")); gotShow != want {
			t.Errorf("%s show --json differs\n got:\n%s\nwant:\n%s", n, gotShow, want)
		}
		// And pkg/drbd's parsers read them.
		if _, err := rg.c.Node(n).Status(rg.ctx, "r0"); err != nil {
			t.Errorf("%s: parse status: %v", n, err)
		}
		if _, err := rg.c.Node(n).Show(rg.ctx, "r0"); err != nil {
			t.Errorf("%s: parse show: %v", n, err)
		}
	}
}

// Every line of the --timestamps --full stream parses with pkg/drbd's
// parser, and the stream ends when the node crashes.
func TestEventsStreamParses(t *testing.T) {
	rg := newRig(t, nil)
	rc, err := rg.c.Node("node1").Events(rg.ctx)
	rg.must(err)
	rg.upAll()
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", "test"))
	rg.c.Advance(2 * time.Second)
	rg.c.Cut("node1", "node2")
	rg.c.Node("node1").Crash()
	b, err := io.ReadAll(rc)
	rg.must(err)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 20 {
		t.Fatalf("only %d lines", len(lines))
	}
	for _, l := range lines {
		ev, err := drbd.ParseEvent(l)
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if ev.Time.IsZero() {
			t.Fatalf("%q: no timestamp", l)
		}
	}
	if lines[0] != "2026-11-22T00:00:00.000000+00:00 exists -" {
		t.Errorf("first line %q: the stream starts with an empty exists dump", lines[0])
	}
}

// During the initial sync node2's status --json has the same keys, in the
// same order, as capture 02 (sync details included).
func TestCapture02SyncTargetStatusKeys(t *testing.T) {
	rg := newRig(t, nil)
	rg.upAll()
	rg.must(rg.c.Node("node1").Primary(rg.ctx, "r0", "initial sync"))
	rg.c.Advance(500 * time.Millisecond)
	got, err := rg.c.Node("node2").StatusJSON(rg.ctx, "r0")
	rg.must(err)
	want := string(captures.Read(t, "02-initial-sync-node2.status-json-verbose-statistics.json"))
	keys := func(s string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`"([^"]+)":`).FindAllStringSubmatch(s, -1) {
			out = append(out, m[1])
		}
		return out
	}
	if g, w := keys(string(got)), keys(want); strings.Join(g, ",") != strings.Join(w, ",") {
		t.Fatalf("keys differ\n got: %v\nwant: %v", g, w)
	}
	st, err := drbd.ParseStatusJSON(got)
	rg.must(err)
	pd := st[0].Connections[0].PeerDevices[0]
	if pd.ReplicationState != "SyncTarget" || st[0].Connections[0].PeerRole != "Primary" || st[0].Devices[0].DiskState != "Inconsistent" {
		t.Fatalf("node2 mid-sync: %+v", st[0])
	}
}
