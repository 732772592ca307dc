package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/drbdsim"
)

// A 2D+1TB volume with a D∅ joining and an Access member attached.
func testVolume() *v1.ReplicatedVolume {
	rv := &v1.ReplicatedVolume{}
	rv.Name = "pvc-1"
	rv.Status.DatameshRevision = 7
	rv.Status.Datamesh = v1.Datamesh{
		Quorum: 2, QuorumMinimumRedundancy: 2, Port: 7001, Minor: 3, Multiattach: true,
		SharedSecret: &v1.SharedSecretReference{SecretName: "drbd-pvc-1", Algorithm: "sha256"},
		Members: []v1.DatameshMember{
			{Name: "pvc-1-a", Type: v1.MemberTypeDiskful, NodeName: "a", Addresses: []string{"10.0.0.1"}, NodeID: 0},
			{Name: "pvc-1-b", Type: v1.MemberTypeDiskful, NodeName: "b", Addresses: []string{"10.0.0.2"}, NodeID: 1},
			{Name: "pvc-1-c", Type: v1.MemberTypeTieBreaker, NodeName: "c", Addresses: []string{"10.0.0.3"}, NodeID: 2},
			{Name: "pvc-1-d", Type: v1.MemberTypeLiminalDiskful, NodeName: "d", Addresses: []string{"10.0.0.4"}, NodeID: 3},
			{Name: "pvc-1-e", Type: v1.MemberTypeAccess, NodeName: "e", Addresses: []string{"fd00::5", "10.0.0.5"}, NodeID: 4, Attached: true},
		},
	}
	return rv
}

func renderMember(t *testing.T, rv *v1.ReplicatedVolume, i int, backing string) *drbd.Resource {
	t.Helper()
	m := &rv.Status.Datamesh.Members[i]
	r, err := render(renderInput{rv: rv, self: m, secret: "s3cret", backing: backing})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func peerIDs(r *drbd.Resource) []int {
	var ids []int
	for _, p := range r.Peers {
		ids = append(ids, p.NodeID)
	}
	return ids
}

func TestRenderMeshAndQuorumByType(t *testing.T) {
	rv := testVolume()
	for _, tc := range []struct {
		i       int
		peers   []int
		q       drbd.Quorum
		disk    bool
		backing string
	}{
		{0, []int{1, 2, 3, 4}, 2, true, "/dev/loop1"}, // D: everyone
		{1, []int{0, 2, 3, 4}, 2, true, "/dev/loop2"},
		{2, []int{0, 1, 3}, 32, false, ""},    // TB: full-mesh members only
		{3, []int{0, 1, 2, 4}, 2, false, "x"}, // D∅: a voter's q, but disk none (D1)
		{4, []int{0, 1, 3}, 32, false, ""},    // A: full-mesh members only
	} {
		r := renderMember(t, rv, tc.i, tc.backing)
		if got := peerIDs(r); !equalInts(got, tc.peers) {
			t.Errorf("member %d peers %v, want %v", tc.i, got, tc.peers)
		}
		if r.Options.Resource.Quorum != tc.q || r.Options.Resource.QuorumMinimumRedundancy != 2 {
			t.Errorf("member %d q=%s qmr=%s, want q=%s qmr=2", tc.i, r.Options.Resource.Quorum, r.Options.Resource.QuorumMinimumRedundancy, tc.q)
		}
		if (r.Disk != nil) != tc.disk {
			t.Errorf("member %d disk %v, want disk=%v", tc.i, r.Disk, tc.disk)
		}
		if !r.Options.Net.AllowTwoPrimaries || r.Options.Resource.AutoPromote || r.Options.Net.CramHMACAlg != "sha256" {
			t.Errorf("member %d options %s", tc.i, r.Options)
		}
		for _, p := range r.Peers {
			star := p.NodeID == 2 || p.NodeID == 4
			if p.Diskless != star {
				t.Errorf("member %d: peer %d diskless=%v, want %v (only star members are written diskless)", tc.i, p.NodeID, p.Diskless, star)
			}
		}
	}
	// The dual-stack Access member listens on the family its peers have.
	r := renderMember(t, rv, 4, "")
	if r.Self.Address.IP.String() != "10.0.0.5" {
		t.Fatalf("self address %s", r.Self.Address.IP)
	}
}

// Each member listens on its own port (unique on its node only) and each peer is
// reached on the peer's; a member published before members had ports (port 0) listens
// on the volume's port; with neither, the resource is refused, never rendered on 0.
func TestRenderMemberPorts(t *testing.T) {
	rv := testVolume()
	dm := &rv.Status.Datamesh
	dm.Port = 7001
	dm.Members[0].Port = 7100 // a
	dm.Members[1].Port = 7200 // b; c (TieBreaker) keeps 0: the volume's 7001
	r := renderMember(t, rv, 0, "/dev/loop1")
	if r.Self.Address.Port != 7100 {
		t.Errorf("a listens on %d, want its own 7100", r.Self.Address.Port)
	}
	want := map[int]int{1: 7200, 2: 7001, 3: 7001, 4: 7001}
	for _, p := range r.Peers {
		if p.Address.Port != want[p.NodeID] {
			t.Errorf("a reaches peer %d on port %d, want %d", p.NodeID, p.Address.Port, want[p.NodeID])
		}
	}
	if r := renderMember(t, rv, 2, ""); r.Self.Address.Port != 7001 {
		t.Errorf("c (port 0) listens on %d, want the volume's 7001", r.Self.Address.Port)
	}
	dm.Port = 0
	rv2 := rv.DeepCopy()
	rv2.Status.Datamesh.Members = rv2.Status.Datamesh.Members[:2]
	for i := range rv2.Status.Datamesh.Members {
		res := renderMember(t, rv2, i, "/dev/loop1")
		if err := res.Validate(drbd.Features{}); err != nil {
			t.Errorf("member %d with ports of their own only: %v", i, err)
		}
	}
	res := renderMember(t, rv, 0, "/dev/loop1")
	if err := res.Validate(drbd.Features{}); err == nil || !strings.Contains(err.Error(), "port 0") {
		t.Errorf("a peer without a port and no volume port: validation gave %v, want the port refused", err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The read-back: what drbdsim runs after up equals what was rendered, and a
// change of any rendered setting is seen as a difference — without the
// shared secret in the message.
func TestConfigDiffReadsBackTheKernel(t *testing.T) {
	ctx := context.Background()
	rv := testVolume()
	rv.Status.Datamesh.Members[4].Addresses = []string{"10.0.0.5"}
	dir := t.TempDir()
	backing := filepath.Join(dir, "a.img")
	if err := os.WriteFile(backing, make([]byte, 8<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	sim := drbdsim.NewCluster(drbdsim.Options{Dir: dir})
	n := sim.Node("a")
	want := renderMember(t, rv, 0, backing)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	show := func() *drbd.ShowResource {
		s, err := n.Show(ctx, want.Name)
		if errors.Is(err, drbd.ErrUnknownResource) {
			return nil
		}
		must(err)
		if len(s) != 1 {
			return nil
		}
		return &s[0]
	}
	if d := configDiff(want, show()); len(d) != 1 || d[0] != "resource is not running" {
		t.Fatalf("before up: %v", d)
	}
	must(n.WriteConfig(ctx, want))
	must(n.CreateMetadata(ctx, want.Name, v1.DRBDMaxPeers))
	must(n.Up(ctx, want.Name))
	if d := configDiff(want, show()); len(d) > 0 {
		t.Fatalf("after up the kernel should run exactly the rendered configuration: %v", d)
	}

	changed := testVolume()
	changed.Status.Datamesh.Members[4].Addresses = []string{"10.0.0.5"}
	changed.Status.Datamesh.Quorum = 3
	changed.Status.Datamesh.Multiattach = false
	changed.Status.Datamesh.Members = changed.Status.Datamesh.Members[:4]
	// The API's ping timeout (tenths of a second) and resync cap (KiB/s)
	// reach the configuration in DRBD's own units, and the read-back sees
	// them (as show prints them: "10", "4096k").
	changed.Spec.DRBDOptions = &v1.DRBDOptions{PingTimeoutTenthsOfSecond: drbd.Ptr(int32(10)), ResyncMaxRateKiB: drbd.Ptr(int32(4096))}
	w2, err := render(renderInput{rv: changed, self: &changed.Status.Datamesh.Members[0], secret: "other-secret", backing: backing})
	must(err)
	if w2.Options.Net.PingTimeout != 10 || w2.Options.Disk.CMaxRate != 4096 {
		t.Fatalf("ping-timeout %d, c-max-rate %d from the API's 10 and 4096", w2.Options.Net.PingTimeout, w2.Options.Disk.CMaxRate)
	}
	res, err := drbd.Render(w2, drbd.Features{})
	must(err)
	for _, s := range []string{"ping-timeout 10;", "c-max-rate 4096;"} {
		if !strings.Contains(string(res), s) {
			t.Errorf("rendered .res lacks %q:\n%s", s, res)
		}
	}
	d := strings.Join(configDiff(w2, show()), "\n")
	for _, s := range []string{"quorum 2, want 3", "allow-two-primaries", "node-id 4", "shared-secret differs",
		`ping-timeout "5", want "10"`, `c-max-rate "102400", want 4096k`} {
		if !strings.Contains(d, s) {
			t.Errorf("diff does not mention %q:\n%s", s, d)
		}
	}
	if strings.Contains(d, "s3cret") || strings.Contains(d, "other-secret") {
		t.Fatalf("diff leaks the shared secret:\n%s", d)
	}
	must(n.WriteConfig(ctx, w2))
	must(n.Adjust(ctx, w2.Name))
	if d := configDiff(w2, show()); len(d) > 0 {
		t.Fatalf("after adjust: %v", d)
	}
}

func TestCapacityThreshold(t *testing.T) {
	last := v1.PoolCapacity{Total: 100 << 30, Free: 50 << 30}
	if moved(last, 100<<30, 50<<30+(512<<20)) {
		t.Error("0.5 GiB of 100 GiB is below both thresholds")
	}
	if !moved(last, 100<<30, 49<<30) {
		t.Error("1 GiB moved: must be written")
	}
	small := v1.PoolCapacity{Total: 10 << 30, Free: 5 << 30}
	if !moved(small, 10<<30, 5<<30-(110<<20)) {
		t.Error("110 MiB of 10 GiB is over 1 %")
	}
}

func TestDRBDSecret(t *testing.T) {
	b64 := "q1Vq0r9_fV8yq7mJx0y8t3QwZk5f2pQmWv1aXbYcZdE"
	if got := drbdSecret([]byte(b64)); got != b64 {
		t.Errorf("printable secret changed: %q", got)
	}
	raw := []byte{0, 1, '"', 0xff}
	if got := drbdSecret(raw); got != "000122ff" {
		t.Errorf("raw bytes: %q, want hex", got)
	}
	long := drbdSecret(make([]byte, 40))
	if len(long) != 63 {
		t.Errorf("hex of 40 bytes is cut to %d, want 63", len(long))
	}
}
