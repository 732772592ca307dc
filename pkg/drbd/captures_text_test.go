package drbd

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd/internal/captures"
)

// The human-readable captures (drbdsetup status text, drbdadm status,
// drbdsetup show, drbdadm dump, modinfo, a refused drbdadm command) are
// replayed too: every state token they print must agree with the state the
// Observer builds from the events2 dump of the same node and stage.

// textObject is one object of `drbdsetup status` / `drbdadm status` text:
// its path (resource, resource/volume:N, resource/peer, resource/peer/volume:N)
// and its key:value tokens (continuation lines folded in).
type textObject struct {
	path   string
	tokens map[string]string
}

func parseStatusText(t *testing.T, text string) []textObject {
	t.Helper()
	var objs []textObject
	var res, peer string
	for _, l := range strings.Split(text, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " "))
		fields := strings.Fields(l)
		if indent == 0 && !strings.Contains(fields[0], ":") && len(fields) > 1 && strings.Contains(fields[1], ":") {
			res, peer = fields[0], ""
			objs = append(objs, textObject{path: res, tokens: map[string]string{}})
			fields = fields[1:]
		} else if indent == 0 {
			continue // not status output (dd's lines before it)
		} else if res == "" {
			t.Fatalf("status line before any resource: %q", l)
		} else {
			head := fields[0]
			switch {
			case indent == 2 && strings.HasPrefix(head, "volume:"):
				peer = ""
				objs = append(objs, textObject{path: res + "/" + head, tokens: map[string]string{}})
				fields = fields[1:]
			case indent == 2 && !strings.Contains(head, ":"):
				peer = head
				objs = append(objs, textObject{path: res + "/" + peer, tokens: map[string]string{}})
				fields = fields[1:]
			case indent == 2: // drbdadm status: "  disk:UpToDate" is volume 0
				peer = ""
				objs = append(objs, textObject{path: res + "/volume:0", tokens: map[string]string{}})
			case indent == 4 && strings.HasPrefix(head, "volume:") && peer != "":
				objs = append(objs, textObject{path: res + "/" + peer + "/" + head, tokens: map[string]string{}})
				fields = fields[1:]
			case indent == 4 && peer != "" && objs[len(objs)-1].path == res+"/"+peer:
				// drbdadm status: "    peer-disk:…" right under a peer is
				// the peer's volume 0 (verbose output says "volume:0" instead)
				objs = append(objs, textObject{path: res + "/" + peer + "/volume:0", tokens: map[string]string{}})
			}
			// anything else continues the previous object
		}
		cur := &objs[len(objs)-1]
		for _, f := range fields {
			k, v, ok := strings.Cut(f, ":")
			if !ok {
				t.Fatalf("token %q in %q is not key:value", f, l)
			}
			cur.tokens[k] = v
		}
	}
	return objs
}

// stateTokens is what drbdsetup would print for s, keyed like parseStatusText.
func stateTokens(s *ResourceState) map[string]map[string]string {
	yn := func(b bool) string { return yesNo(b) }
	out := map[string]map[string]string{}
	susp := "no"
	if len(s.Suspended) > 0 {
		susp = strings.Join(s.Suspended, ",")
	}
	out[s.Name] = map[string]string{"role": s.Role, "suspended": susp}
	for v, d := range s.Devices {
		out[fmt.Sprintf("%s/volume:%d", s.Name, v)] = map[string]string{
			"minor": strconv.Itoa(d.Minor), "disk": d.DiskState, "client": yn(d.Client),
			"quorum": yn(d.Quorum), "backing_dev": d.BackingDev, "size": strconv.FormatInt(d.SizeKiB, 10),
		}
	}
	for id, c := range s.Connections {
		out[s.Name+"/"+c.Name] = map[string]string{"node-id": strconv.Itoa(id), "connection": c.State,
			"role": c.PeerRole, "congested": yn(c.Congested)}
		for v, p := range c.PeerDevices {
			out[fmt.Sprintf("%s/%s/volume:%d", s.Name, c.Name, v)] = map[string]string{
				"replication": p.Replication, "peer-disk": p.PeerDisk, "peer-client": yn(p.PeerClient),
				"resync-suspended": p.ResyncSuspended, "out-of-sync": strconv.FormatInt(p.OutOfSyncKiB, 10),
			}
		}
	}
	return out
}

// State keys compared; IO counters (read, written, sent, …) are left out
// because the text and the events dump were taken moments apart.
var stateKeys = map[string]bool{"role": true, "suspended": true, "minor": true, "disk": true, "client": true,
	"quorum": true, "backing_dev": true, "size": true, "node-id": true, "connection": true, "congested": true,
	"replication": true, "peer-disk": true, "peer-client": true, "resync-suspended": true, "out-of-sync": true}

func compareText(t *testing.T, file string, s *ResourceState) int {
	t.Helper()
	want := stateTokens(s)
	objs := parseStatusText(t, string(captures.Read(t, file)))
	if len(objs) == 0 {
		t.Fatalf("%s: nothing parsed", file)
	}
	n := 0
	for _, o := range objs {
		w, ok := want[o.path]
		if !ok {
			t.Errorf("%s: object %s not in the events state", file, o.path)
			continue
		}
		for k, v := range o.tokens {
			if k == "node-id" && !strings.Contains(o.path, "/") {
				continue // the resource line's node-id is this node's own
			}
			if !stateKeys[k] {
				continue
			}
			n++
			if w[k] != v {
				t.Errorf("%s: %s %s:%s, events state says %s", file, o.path, k, v, w[k])
			}
		}
	}
	return n
}

func TestStatusTextCapturesAgreeWithEvents(t *testing.T) {
	compared := 0
	files := 0
	for _, stage := range []string{"01-up-inconsistent", "03-primary-with-data", "05-quorum-loss"} {
		for _, node := range []string{"node1", "node2", "node3"} {
			evFile := stage + "/" + node + ".events2-now-statistics.txt"
			if !captures.Has(evFile) {
				continue
			}
			s := replayDump(t, evFile)["r0"]
			for _, txt := range []string{node + ".status-verbose-statistics.txt", node + ".drbdadm-status.txt"} {
				p := stage + "/" + txt
				if !captures.Has(p) {
					continue
				}
				compared += compareText(t, p, s)
				files++
			}
		}
	}
	// The refused write: its status block is the quorum-less state of the
	// 05 node1 dump.
	s := replayDump(t, "05-quorum-loss/node1.events2-now-statistics.txt")["r0"]
	compared += compareText(t, "05-quorum-loss/node1-no-quorum-write-attempt.txt", s)
	files++
	if !strings.Contains(string(captures.Read(t, "05-quorum-loss/node1-no-quorum-write-attempt.txt")), "Input/output error") {
		t.Error("write attempt did not fail with EIO")
	}
	// After node3 went down: the node1 stream up to node3's Connecting.
	m := map[string]*ResourceState{}
	for _, l := range captures.Lines(t, "05-quorum-loss/node1.events2-timestamps-statistics-stream.txt") {
		ev, err := ParseEvent(l)
		if err != nil {
			t.Fatal(err)
		}
		if !ev.EndOfDump {
			if err := applyTo(m, &ev); err != nil {
				t.Fatal(err)
			}
		}
		if strings.Contains(l, "conn-name:node3 connection:Connecting") {
			break
		}
	}
	compared += compareText(t, "05-quorum-loss/node1-after-node3-down.status-verbose.txt", m["r0"])
	files++
	if files != 18 { // 01 and 03: 3 nodes × 2; 05: 2 nodes × 2; write attempt; after node3 down
		t.Errorf("compared %d text captures, want 18", files)
	}
	t.Logf("%d status text captures, %d state tokens agree with the events2 state", files, compared)
}

// drbdsetup show (text) names the same peers and addresses as show --json.
func TestShowTextMatchesJSON(t *testing.T) {
	for _, js := range captures.Files(t, "show-json") {
		sh, err := ParseShowJSON(captures.Read(t, js))
		if err != nil {
			t.Fatal(err)
		}
		text := string(captures.Read(t, strings.Replace(js, "show-json.json", "show.txt", 1)))
		for _, c := range sh[0].Connections {
			for _, want := range []string{
				fmt.Sprintf("_peer_node_id %d;", c.PeerNodeID),
				"_remote_host " + c.AllPaths()[0].RemoteHost + ";",
				fmt.Sprintf("%q;", c.Name()),
			} {
				if !strings.Contains(text, want) {
					t.Errorf("%s lacks %q", js, want)
				}
			}
		}
	}
}

// The recorded r0.res, parsed by the drbdadm here, dumps exactly as it did
// on node1: the check mechanism (__DRBD_NODE__) reproduces the real host.
func TestDrbdadmDumpMatchesRecordedHost(t *testing.T) {
	bin, err := drbdadmPath()
	if err != nil {
		t.Fatal(err)
	}
	res := captures.Path(t, "r0.res")
	cmd := exec.Command(bin, "-c", res, "dump", "r0")
	cmd.Env = append(os.Environ(), "__DRBD_NODE__=node1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	body := func(s string) string { // drop the "# ..." header naming the file
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(l, "#") {
				keep = append(keep, l)
			}
		}
		return strings.TrimSpace(strings.Join(keep, "\n"))
	}
	if got, want := body(string(out)), body(string(captures.Read(t, "drbdadm-dump-r0.txt"))); got != want {
		t.Fatalf("dump differs from node1's:\n%s\n---\n%s", got, want)
	}
}

func TestModinfoAndProcAgree(t *testing.T) {
	var v VersionInfo
	if err := ParseProcDRBD(captures.Read(t, "proc-drbd.txt"), &v); err != nil {
		t.Fatal(err)
	}
	var modVersion string
	for _, l := range strings.Split(string(captures.Read(t, "modinfo-drbd.txt")), "\n") {
		if k, val, ok := strings.Cut(l, ":"); ok && k == "version" {
			modVersion = strings.TrimSpace(val)
		}
	}
	if modVersion != v.ProcVersion || v.ProcGitHash != "a7afc67e5873f3fedce8d944c89edf87ffb7c116" {
		t.Fatalf("modinfo %q, /proc/drbd %+v", modVersion, v)
	}
}

// A drbdadm usage error (recorded: sh-status does not exist in 9.22) is a
// plain command failure, not mistaken for a DRBD state.
func TestClassifyRecordedUsageError(t *testing.T) {
	code, kind := classify(string(captures.Read(t, "node1.drbdadm-sh-status.txt")))
	if kind != ErrCommandFailed || code != 0 {
		t.Fatalf("got %v %d", kind, code)
	}
}
