package drbd

import (
	"strings"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// Every events2 line recorded from real DRBD parses, with no unknown kinds
// or objects; together the captures cover the kinds and objects listed.
func TestParseEventsCaptures(t *testing.T) {
	kinds := map[string]int{}
	files := captures.Files(t, "events2")
	for _, f := range files {
		ls := captures.Lines(t, f)
		timestamps := strings.Contains(f, "timestamps")
		sawEnd := false
		for i, l := range ls {
			ev, err := ParseEvent(l)
			if err != nil {
				t.Fatalf("%s:%d: %v", f, i+1, err)
			}
			if timestamps == ev.Time.IsZero() {
				t.Fatalf("%s:%d: timestamp presence %v, file says %v", f, i+1, !ev.Time.IsZero(), timestamps)
			}
			if ev.EndOfDump {
				sawEnd = true
				kinds["exists -"]++
				continue
			}
			kinds[string(ev.Kind)+" "+string(ev.Object)]++
		}
		if !sawEnd {
			t.Errorf("%s: no end-of-dump marker", f)
		}
	}
	for _, want := range []string{
		"exists resource", "exists connection", "exists device", "exists peer-device", "exists path", "exists -",
		"change resource", "change connection", "change device", "change peer-device", "change path",
		"call helper", "response helper",
	} {
		if kinds[want] == 0 {
			t.Errorf("captures contain no %q line", want)
		}
	}
	t.Logf("parsed %d events2 capture files: %v", len(files), kinds)
}

// create and destroy do not occur in the captures (nothing was created or
// torn down while a stream was recorded); these lines follow the format of
// the recorded ones.
func TestParseEventKinds(t *testing.T) {
	good := []string{
		"create resource name:r1 role:Secondary suspended:no force-io-failures:no may_promote:no promotion_score:0",
		"create device name:r1 volume:0 minor:7 backing_dev:none disk:Diskless client:yes quorum:yes",
		"create connection name:r1 peer-node-id:2 conn-name:node3 connection:StandAlone role:Unknown",
		"create peer-device name:r1 peer-node-id:2 conn-name:node3 volume:0 replication:Off peer-disk:DUnknown peer-client:no resync-suspended:no",
		"create path name:r1 peer-node-id:2 conn-name:node3 local:ipv6:[fd00::1]:7000 peer:ipv6:[fd00::3]:7000 established:no",
		"destroy path name:r1 peer-node-id:2 conn-name:node3 local:ipv4:10.99.0.1:7000 peer:ipv4:10.99.0.3:7000",
		"destroy peer-device name:r1 peer-node-id:2 conn-name:node3 volume:0",
		"destroy connection name:r1 peer-node-id:2 conn-name:node3",
		"destroy device name:r1 volume:0 minor:7",
		"destroy resource name:r1",
		"2026-11-22T00:57:59.701566+00:00 call helper name:r0 volume:0 minor:0 helper:quorum-lost",
		"2026-11-22T00:57:59.802864+00:00 response helper name:r0 volume:0 minor:0 helper:quorum-lost status:0",
		"exists -",
		"2026-11-22T00:56:08.194963+00:00 exists -",
	}
	for _, l := range good {
		if _, err := ParseEvent(l); err != nil {
			t.Errorf("%q: %v", l, err)
		}
	}
	ev, _ := ParseEvent("2026-11-22T00:57:45.377061+00:00 change path name:r0 peer-node-id:2 conn-name:node3 local:ipv4:10.99.0.1:7000 peer:ipv4:10.99.0.3:7000 established:no")
	if v, _ := ev.Get("local"); v != "ipv4:10.99.0.1:7000" {
		t.Errorf("value with colons: %q", v)
	}
	if want := time.Date(2026, 11, 22, 0, 57, 45, 377061000, time.UTC); !ev.Time.Equal(want) {
		t.Errorf("time %v, want %v", ev.Time, want)
	}
	bad := map[string]string{
		"":                                    "empty line",
		"exists":                              "unknown object type",
		"frobnicate resource name:r0":         "unknown event kind",
		"exists volume name:r0":               "unknown object type",
		"change resource role:Primary":        "without name",
		"change connection name:r0":           "without peer-node-id",
		"change device name:r0 volume:x":      "not an integer",
		"change resource name:r0 role":        "not key:value",
		"change resource name:r0 :x":          "not key:value",
		"change helper name:r0 helper:x":      "only called",
		"call resource name:r0":               "only called",
		"response helper name:r0 helper:x":    "without status",
		"change -":                            `only valid as "exists -"`,
		"exists - extra":                      `only valid as "exists -"`,
		"2026-13-22T00:00:00+00:00 exists -":  "bad timestamp",
		"change peer-device name:r0 volume:0": "without peer-node-id",
	}
	for l, want := range bad {
		_, err := ParseEvent(l)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want error containing %q", l, err, want)
		}
	}
}

// For each node and stage where both were recorded, the state built from
// the events2 "now" dump equals the state from status --json.
func TestEventsDumpMatchesStatus(t *testing.T) {
	pairs := 0
	for _, ev := range captures.Files(t, "events2-now-statistics") {
		js := strings.Replace(ev, "events2-now-statistics.txt", "status-json-verbose-statistics.json", 1)
		if !captures.Has(js) {
			continue // 02 has node1's events and node2's status: not a pair
		}
		pairs++
		fromEvents := replayDump(t, ev)
		st, err := ParseStatusJSON(captures.Read(t, js))
		if err != nil || len(st) != 1 {
			t.Fatalf("%s: %v", js, err)
		}
		fromStatus := StateFromStatus(st[0])
		if fromEvents["r0"] == nil || len(fromEvents["r0"].Connections) != 2 || len(fromEvents["r0"].Devices) != 1 {
			t.Fatalf("%s: replay built %+v", ev, fromEvents)
		}
		a, b := commonView(fromEvents["r0"]), commonView(fromStatus)
		if d := a.Diff(b); d != "" {
			t.Errorf("%s vs %s: %s", ev, js, d)
		}
	}
	// The comparison is not vacuous: a single changed field shows.
	a := commonView(replayDump(t, "05-quorum-loss/node1.events2-now-statistics.txt")["r0"])
	b := a.Clone()
	b.Connections[1].PeerDevices[0].PeerDisk = "Outdated"
	if a.Diff(b) == "" || a.Equal(b) {
		t.Fatal("Diff missed a changed peer disk state")
	}
	if pairs != 8 { // 01: 3 nodes, 03: 3 nodes, 05: 2 nodes
		t.Fatalf("compared %d events/status pairs, want 8", pairs)
	}
}

// commonView drops what only events2 reports (promotion hints, backing
// device, paths) so the two sources compare on what both carry.
func commonView(s *ResourceState) *ResourceState {
	c := s.Clone()
	c.MayPromote, c.PromotionScore = nil, nil
	for _, d := range c.Devices {
		d.BackingDev = ""
	}
	for _, cn := range c.Connections {
		cn.Paths = nil
	}
	return c
}

func replayDump(t *testing.T, name string) map[string]*ResourceState {
	t.Helper()
	m := map[string]*ResourceState{}
	for _, l := range captures.Lines(t, name) {
		ev, err := ParseEvent(l)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ev.EndOfDump {
			break
		}
		if err := applyTo(m, &ev); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// Every status and show JSON capture parses, and the fields the agent uses
// hold the recorded values.
func TestParseJSONCaptures(t *testing.T) {
	n := 0
	for _, f := range captures.Files(t, "status-json") {
		b := captures.Read(t, f)
		st, err := ParseStatusJSON(b)
		if err != nil || len(st) != 1 || st[0].Name != "r0" || len(st[0].Devices) != 1 || len(st[0].Connections) == 0 {
			t.Fatalf("%s: %+v %v", f, st, err)
		}
		n++
	}
	for _, f := range captures.Files(t, "show-json") {
		b := captures.Read(t, f)
		sh, err := ParseShowJSON(b)
		if err != nil || len(sh) != 1 || sh[0].Resource != "r0" || len(sh[0].Connections) != 2 {
			t.Fatalf("%s: %+v %v", f, sh, err)
		}
		n++
	}
	// Spot checks against the recorded values.
	st, _ := ParseStatusJSON(captures.Read(t, "02-initial-sync-node2.status-json-verbose-statistics.json"))
	pd := st[0].Connections[0].PeerDevices[0]
	if pd.ReplicationState != "SyncTarget" || pd.OutOfSync != 15316 || pd.RSTotal != 262056 ||
		pd.PercentResyncDone == nil || *pd.PercentResyncDone != 88.31 || pd.DbDtMiBs == nil || *pd.DbDtMiBs != 79.80 ||
		st[0].Connections[1].PeerDevices[0].ResyncSuspended != "dependency" {
		t.Fatalf("02 node2 sync details: %+v", pd)
	}
	if s := StateFromStatus(st[0]); s.Connections[0].PeerDevices[0].PercentInSync != 88.31 ||
		percentInSync(131028, 15316) != 88.31 {
		t.Fatalf("percent in sync: computed %v", percentInSync(131028, 15316))
	}
	sh, _ := ParseShowJSON(captures.Read(t, "01-up-inconsistent/node3.show-json.json"))
	if v := sh[0].ThisHost.Volumes[0]; !v.Disk.None || v.DeviceMinor != 0 || sh[0].Options["quorum"] != "majority" {
		t.Fatalf("node3 show: %+v", sh[0])
	}
	sh, _ = ParseShowJSON(captures.Read(t, "05-quorum-loss/node1.show-json.json"))
	c := sh[0].Connections[1]
	if c.Name() != "node3" || c.PeerNodeID != 2 || c.Volumes[0].Disk["bitmap"] != "no" ||
		c.AllPaths()[0].RemoteHost != "ipv4 10.99.0.3:7000" || sh[0].ThisHost.Volumes[0].BackingDisk != "/dev/vda" {
		t.Fatalf("node1 show: %+v", c)
	}
	for _, bad := range []string{"{", `[{"name":""}]`, `{"name":"r0"}`, `[{"name":"r0","devices":"x"}]`} {
		if _, err := ParseStatusJSON([]byte(bad)); err == nil {
			t.Errorf("status %q accepted", bad)
		}
		if _, err := ParseShowJSON([]byte(bad)); err == nil {
			t.Errorf("show %q accepted", bad)
		}
	}
	if st, err := ParseStatusJSON([]byte("\n")); err != nil || st != nil {
		t.Errorf("empty status: %v %v", st, err)
	}
	t.Logf("parsed %d JSON captures", n)
}
