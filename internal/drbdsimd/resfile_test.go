package drbdsimd

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// TestParseResReadsBackWhatRenderWrites: a rendered file parses back into a
// model that renders to the same bytes, for each shape the renderer has
// (diskful and diskless self, IPv6, authentication, verify, per-connection
// allow-remote-read, a quorum count).
func TestParseResReadsBackWhatRenderWrites(t *testing.T) {
	no := false
	cases := map[string]*drbd.Resource{
		"diskful":  contract.CapturedResource("node1", "/dev/loop7", nil),
		"diskless": contract.CapturedResource("node3", "", nil),
		"tuned": contract.CapturedResource("node2", "/var/lib/meshvol/pool/pvc+1.img", func(s *drbd.OptionSet) {
			s.Resource.Quorum = drbd.Ptr(drbd.QuorumCount(32))
			s.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorumSuspendIO)
			s.Net.CramHMACAlg = drbd.Ptr("sha256")
			s.Net.SharedSecret = drbd.Ptr("s3cr+et")
			s.Net.VerifyAlg = drbd.Ptr("crc32c")
			s.Net.AllowTwoPrimaries = drbd.Ptr(true)
		}),
	}
	v6 := contract.CapturedResource("node1", "/dev/loop8", nil)
	v6.Self.Address.IP = netip.MustParseAddr("fd00::1")
	for i := range v6.Peers {
		v6.Peers[i].Address.IP = netip.MustParseAddr("fd00::" + string(rune('2'+i)))
		v6.Peers[i].Minor = 1000 + i
	}
	v6.Peers[0].AllowRemoteRead = &no
	v6.Minor = 1003
	cases["ipv6"] = v6
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := drbd.Render(r, drbd.Features{})
			if err != nil {
				t.Fatal(err)
			}
			back, err := parseRes(string(want))
			if err != nil {
				t.Fatalf("parseRes: %v\n%s", err, want)
			}
			got, err := drbd.Render(back, drbd.Features{})
			if err != nil {
				t.Fatalf("the parsed model does not render: %v", err)
			}
			if string(got) != string(want) {
				t.Errorf("rendered again:\n%s\nwant:\n%s", got, want)
			}
			if back.Self != r.Self || back.Minor != r.Minor || (back.Disk == nil) != (r.Disk == nil) {
				t.Errorf("self %+v minor %d disk %v, want %+v %d %v", back.Self, back.Minor, back.Disk, r.Self, r.Minor, r.Disk)
			}
		})
	}
}

// TestParseResNamesWhatItDoesNotKnow: a statement the renderer does not
// write is refused with its line, not ignored.
func TestParseResNamesWhatItDoesNotKnow(t *testing.T) {
	text, err := drbd.Render(contract.CapturedResource("node1", "/dev/loop7", nil), drbd.Features{})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ text, want string }{
		"unknown option":  {strings.Replace(string(text), "protocol C;", "protocol C;\n        max-buffers 8000;", 1), `"max-buffers 8000" is not a statement`},
		"missing brace":   {strings.TrimSuffix(strings.TrimSpace(string(text)), "}"), "missing }"},
		"missing ;":       {strings.Replace(string(text), "protocol C;", "protocol C", 1), "protocol takes one value"},
		"bad yes":         {strings.Replace(string(text), "auto-promote no;", "auto-promote maybe;", 1), `auto-promote is yes or no, not "maybe"`},
		"no resource":     {"global {\n    usage-count no;\n}\n", "no resource section"},
		"unterminated \"": {string(text) + `resource "r1`, "unterminated string"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseRes(tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseRes: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
