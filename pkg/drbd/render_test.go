package drbd

import (
	"bytes"
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/*.res from the renderer")

func addr(s string, port int) Address { return Address{IP: netip.MustParseAddr(s), Port: port} }

func diskful(dev string) *Disk { return &Disk{BackingDevice: dev, MetaDisk: MetaDiskInternal} }

// model is one golden case: a resource and the DRBD features it is
// rendered for.
type model struct {
	r *Resource
	f Features
}

// goldenModels are the layouts meshvol renders, from the point of view of
// one node each.
func goldenModels() map[string]model {
	def := Resolve(DefaultOptions())
	m := map[string]model{}

	m["1d"] = model{r: &Resource{
		Name: "pvc-0a1b2c3d", Self: Host{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7000)},
		Minor: 1000, Disk: diskful("/dev/meshvol/pvc-0a1b2c3d_00000"), Options: def,
	}}

	m["3d"] = model{r: &Resource{
		Name: "pvc-3d", Self: Host{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7001)},
		Minor: 1001, Disk: diskful("/dev/vg0/pvc-3d_00000"), Options: def,
		Peers: []Peer{ // deliberately out of node-id order
			{Name: "node-c", NodeID: 2, Address: addr("10.0.0.3", 7001), Minor: 1007},
			{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7001), Minor: 1003},
		},
	}}

	// 2D + TieBreaker, seen from a diskful node: the TB is a diskless peer.
	m["2d-tb-from-d"] = model{r: &Resource{
		Name: "pvc-2dtb", Self: Host{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7002)},
		Minor: 1002, Disk: diskful("/dev/vg0/pvc-2dtb_00000"), Options: def,
		Peers: []Peer{
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7002), Minor: 1002},
			{Name: "node-t", NodeID: 2, Address: addr("10.0.0.9", 7002), Minor: 1010, Diskless: true},
		},
	}}

	// The same resource seen from the TieBreaker: diskless, quorum 32 (it is
	// quorate only through a quorate UpToDate peer, docs/drbd-quorum.md).
	tbOpts := Resolve(DefaultOptions(), OptionSet{Resource: ResourceOptionSet{Quorum: Ptr(QuorumCount(32))}})
	m["2d-tb-from-tb"] = model{r: &Resource{
		Name: "pvc-2dtb", Self: Host{Name: "node-t", NodeID: 2, Address: addr("10.0.0.9", 7002)},
		Minor: 1010, Disk: nil, Options: tbOpts,
		Peers: []Peer{
			{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7002), Minor: 1002},
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7002), Minor: 1002},
		},
	}}

	// A diskless client (Access member) of a 3D volume: it connects to the
	// diskful members only.
	m["diskless-client"] = model{r: &Resource{
		Name: "pvc-client", Self: Host{Name: "worker-7", NodeID: 5, Address: addr("10.0.1.7", 7003)},
		Minor: 1020, Disk: nil, Options: tbOpts,
		Peers: []Peer{
			{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7003), Minor: 1004},
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7003), Minor: 1004},
			{Name: "node-c", NodeID: 2, Address: addr("10.0.0.3", 7003), Minor: 1005},
		},
	}}

	m["ipv6"] = model{r: &Resource{
		Name: "pvc-v6", Self: Host{Name: "node-a", NodeID: 0, Address: addr("fd00:10::1", 7004)},
		Minor: 1030, Disk: diskful("/dev/vg0/pvc-v6_00000"), Options: def,
		Peers: []Peer{
			{Name: "node-b", NodeID: 1, Address: addr("fd00:10::2", 7004), Minor: 1030},
			{Name: "node-t", NodeID: 2, Address: addr("fd00:10::9", 7004), Minor: 1030, Diskless: true},
		},
	}}

	// Multiattach (live migration): two Primaries allowed for the window.
	multi := Resolve(DefaultOptions(), OptionSet{Net: NetOptionSet{AllowTwoPrimaries: Ptr(true)}})
	m["multiattach"] = model{r: &Resource{
		Name: "pvc-vm-disk", Self: Host{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7005)},
		Minor: 1040, Disk: diskful("/dev/vg0/pvc-vm-disk_00000"), Options: multi,
		Peers: []Peer{
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7005), Minor: 1040},
			{Name: "node-x", NodeID: 3, Address: addr("10.0.0.24", 7005), Minor: 1041, Diskless: true},
		},
	}}

	// Every option moved off its default, at several scopes.
	over := Resolve(DefaultOptions(),
		OptionSet{ // storage class
			Resource: ResourceOptionSet{OnNoQuorum: Ptr(OnNoQuorumIOError), OnNoDataAccessible: Ptr(OnNoDataAccessibleSuspendIO)},
			Net:      NetOptionSet{CramHMACAlg: Ptr("sha256"), SharedSecret: Ptr("Zq3-not-a-real-secret_9x")},
			Disk:     DiskOptionSet{RsDiscardGranularity: Ptr(int32(65536))},
		},
		OptionSet{ // volume
			Resource: ResourceOptionSet{Quorum: Ptr(QuorumAll)},
			Net:      NetOptionSet{PingTimeout: Ptr(int32(10))},
			Disk:     DiskOptionSet{DiscardZeroesIfAligned: Ptr(false), CMaxRate: Ptr(int32(4096))},
		},
	)
	no := false
	m["options-overridden"] = model{r: &Resource{
		Name: "pvc-tuned", Self: Host{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7006)},
		Minor: 1050, Disk: diskful("/dev/vg0/pvc-tuned_00000"), Options: over,
		Peers: []Peer{
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7006), Minor: 1050},
			{Name: "node-t", NodeID: 2, Address: addr("10.0.0.9", 7006), Minor: 1050, Diskless: true, AllowRemoteRead: &no},
		},
	}}

	qmr := Resolve(DefaultOptions(), OptionSet{Resource: ResourceOptionSet{QuorumMinimumRedundancy: Ptr(QuorumCount(2))}})
	m["qmr"] = model{r: &Resource{
		Name: "pvc-qmr", Self: Host{Name: "node-c", NodeID: 2, Address: addr("10.0.0.3", 7007)},
		Minor: 1060, Disk: diskful("/dev/vg0/pvc-qmr_00000"), Options: qmr,
		Peers: []Peer{
			{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7007), Minor: 1060},
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7007), Minor: 1061},
		},
	}}

	// A shadow-diskful member on a DRBD that has non-voting.
	nv := Resolve(DefaultOptions(), OptionSet{Disk: DiskOptionSet{NonVoting: Ptr(true)}})
	m["non-voting"] = model{f: Features{NonVoting: true}, r: &Resource{
		Name: "pvc-shadow", Self: Host{Name: "node-s", NodeID: 3, Address: addr("10.0.0.4", 7008)},
		Minor: 1070, Disk: diskful("/dev/vg0/pvc-shadow_00000"), Options: nv,
		Peers: []Peer{
			{Name: "node-a", NodeID: 0, Address: addr("10.0.0.1", 7008), Minor: 1070},
			{Name: "node-b", NodeID: 1, Address: addr("10.0.0.2", 7008), Minor: 1070},
		},
	}}
	return m
}

func TestRenderGolden(t *testing.T) {
	models := goldenModels()
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			got := renderChecked(t, m.r, m.f)
			path := filepath.Join("testdata", "golden", name+".res")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestRenderGolden -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from the renderer output:\n--- got ---\n%s\n--- want ---\n%s", path, got, want)
			}
			// The golden file on disk is checked too (it is what reviewers read).
			if err := checker.checkText(m.r.Self.Name, m.r.Name, m.f.NonVoting, want); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Every golden file belongs to a model: no stale files.
	files, _ := filepath.Glob(filepath.Join("testdata", "golden", "*.res"))
	if len(files) != len(models) {
		t.Fatalf("%d golden files for %d models: %v", len(files), len(models), files)
	}
}

func TestRenderDeterministic(t *testing.T) {
	for name, m := range goldenModels() {
		a := renderChecked(t, m.r, m.f)
		// Same model with peers in another order and a fresh Options copy.
		r2 := *m.r
		r2.Peers = append([]Peer(nil), m.r.Peers...)
		for i, j := 0, len(r2.Peers)-1; i < j; i, j = i+1, j-1 {
			r2.Peers[i], r2.Peers[j] = r2.Peers[j], r2.Peers[i]
		}
		b := renderChecked(t, &r2, m.f)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: rendering depends on peer order", name)
		}
	}
}

func TestRenderSections(t *testing.T) {
	m := goldenModels()["options-overridden"]
	out := string(renderChecked(t, m.r, m.f))
	// Each option must sit in the section drbd.conf(5) puts it in; the
	// drbdadm check proves the parser accepts the placement, this pins it.
	sectionOf := func(option string) string {
		stack := []string{}
		for _, l := range strings.Split(out, "\n") {
			l = strings.TrimSpace(l)
			switch {
			case strings.HasSuffix(l, "{"):
				stack = append(stack, strings.Fields(l)[0])
			case l == "}":
				stack = stack[:len(stack)-1]
			case strings.HasPrefix(l, option+" "):
				return strings.Join(stack, "/")
			}
		}
		return "(absent)"
	}
	for option, want := range map[string]string{
		"quorum":                    "resource/options",
		"quorum-minimum-redundancy": "resource/options",
		"on-no-quorum":              "resource/options",
		"on-no-data-accessible":     "resource/options",
		"auto-promote":              "resource/options",
		"protocol":                  "resource/net",
		"allow-two-primaries":       "resource/net",
		"cram-hmac-alg":             "resource/net",
		"shared-secret":             "resource/net",
		"allow-remote-read":         "resource/connection/net",
		"discard-zeroes-if-aligned": "resource/on/volume/disk",
		"rs-discard-granularity":    "resource/on/volume/disk",
		"ping-timeout":              "resource/net",
		"c-max-rate":                "resource/on/volume/disk",
	} {
		if got := sectionOf(option); got != want {
			t.Errorf("%s rendered in %s, want %s", option, got, want)
		}
	}
	if strings.Contains(out, "non-voting") {
		t.Errorf("non-voting rendered although Features.NonVoting is false")
	}
	if strings.Contains(out, "connection-mesh") {
		t.Errorf("connection-mesh rendered; star members need per-connection blocks")
	}
}

func TestRenderRefusesInvalid(t *testing.T) {
	r := *goldenModels()["3d"].r
	r.Self.NodeID = 40
	_, err := Render(&r, Features{})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "self.nodeID 40: must be in 0..31") {
		t.Fatalf("Render of an invalid model: %v", err)
	}
}
