package drbd

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestValidateRules(t *testing.T) {
	base := func() *Resource {
		r := *goldenModels()["2d-tb-from-d"].r
		r.Peers = append([]Peer(nil), r.Peers...)
		return &r
	}
	cases := []struct {
		name   string
		mutate func(r *Resource)
		f      Features
		want   string
	}{
		{"empty name", func(r *Resource) { r.Name = "" }, Features{}, `name "": must not be empty`},
		{"name with space", func(r *Resource) { r.Name = "pvc 1" }, Features{}, `character ' ' at offset 3 is not allowed`},
		{"name with slash", func(r *Resource) { r.Name = "a/b" }, Features{}, `character '/'`},
		{"name all", func(r *Resource) { r.Name = "all" }, Features{}, `must not be "all"`},
		{"name dash", func(r *Resource) { r.Name = "-r" }, Features{}, `must not start with '-'`},
		{"name too long", func(r *Resource) { r.Name = strings.Repeat("a", 128) }, Features{}, `128 bytes, longer than 127`},
		{"node id range", func(r *Resource) { r.Peers[0].NodeID = 32 }, Features{}, `peers[0].nodeID 32: must be in 0..31`},
		{"node id negative", func(r *Resource) { r.Self.NodeID = -1 }, Features{}, `self.nodeID -1: must be in 0..31`},
		{"node id dup", func(r *Resource) { r.Peers[1].NodeID = 0 }, Features{}, `peers[1].nodeID 0: already used by self`},
		{"peer name dup", func(r *Resource) { r.Peers[1].Name = r.Peers[0].Name }, Features{}, `peers[1].name "node-b": already used by peers[0]`},
		{"peer is self", func(r *Resource) { r.Peers[0].Name = r.Self.Name }, Features{}, `already used by self`},
		{"minor range", func(r *Resource) { r.Minor = 1 << 20 }, Features{}, `minor 1048576: must be in 0..1048575`},
		{"peer minor", func(r *Resource) { r.Peers[0].Minor = -3 }, Features{}, `peers[0].minor -3`},
		{"port zero", func(r *Resource) { r.Self.Address.Port = 0 }, Features{}, `self.address.port 0: must be in 1..65535`},
		{"port high", func(r *Resource) { r.Peers[0].Address.Port = 70000 }, Features{}, `peers[0].address.port 70000`},
		{"no ip", func(r *Resource) { r.Self.Address.IP = netip.Addr{} }, Features{}, `self.address.ip: must be set`},
		{"mixed family", func(r *Resource) { r.Peers[0].Address.IP = netip.MustParseAddr("fd00::2") }, Features{}, `is ipv6 but self is ipv4`},
		{"mapped v6", func(r *Resource) { r.Self.Address.IP = netip.MustParseAddr("::ffff:10.0.0.1") }, Features{}, `IPv4-mapped`},
		{"unspecified", func(r *Resource) { r.Self.Address.IP = netip.MustParseAddr("0.0.0.0") }, Features{}, `not the unspecified one`},
		{"zone", func(r *Resource) { r.Self.Address.IP = netip.MustParseAddr("fe80::1%eth0") }, Features{}, `zoned`},
		{"same addr", func(r *Resource) { r.Peers[0].Address = r.Self.Address }, Features{}, `same address and port as self`},
		{"disk path", func(r *Resource) { r.Disk = &Disk{BackingDevice: "vg/lv", MetaDisk: "internal"} }, Features{}, `must be an absolute path`},
		{"disk empty", func(r *Resource) { r.Disk = &Disk{MetaDisk: "internal"} }, Features{}, `disk.backingDevice: must not be empty`},
		{"disk quote", func(r *Resource) { r.Disk = &Disk{BackingDevice: `/dev/a"b`, MetaDisk: "internal"} }, Features{}, `must be printable ASCII without spaces`},
		{"meta disk", func(r *Resource) { r.Disk.MetaDisk = "/dev/md" }, Features{}, `disk.metaDisk "/dev/md": only "internal"`},
		{"quorum 33", func(r *Resource) { r.Options.Resource.Quorum = 33 }, Features{}, `options.quorum 33: must be off, majority, all or 1..32`},
		{"qmr -1", func(r *Resource) { r.Options.Resource.QuorumMinimumRedundancy = -1 }, Features{}, `options.quorumMinimumRedundancy -1`},
		{"on-no-quorum", func(r *Resource) { r.Options.Resource.OnNoQuorum = "panic" }, Features{}, `options.onNoQuorum "panic"`},
		{"on-no-data", func(r *Resource) { r.Options.Resource.OnNoDataAccessible = "" }, Features{}, `options.onNoDataAccessible ""`},
		{"protocol A", func(r *Resource) { r.Options.Net.Protocol = ProtocolA }, Features{}, `net.protocol "A": meshvol acknowledges`},
		{"secret without alg", func(r *Resource) { r.Options.Net.SharedSecret = "x" }, Features{}, `set both or neither`},
		{"secret too long", func(r *Resource) {
			r.Options.Net.SharedSecret = strings.Repeat("s", 64)
			r.Options.Net.CramHMACAlg = "sha256"
		}, Features{}, `net.sharedSecret: is 64 bytes, longer than 63`},
		{"secret quote", func(r *Resource) {
			r.Options.Net.SharedSecret = `a"b`
			r.Options.Net.CramHMACAlg = "sha256"
		}, Features{}, `not printable ASCII`},
		{"alg charset", func(r *Resource) {
			r.Options.Net.SharedSecret = "abc"
			r.Options.Net.CramHMACAlg = "SHA 256"
		}, Features{}, `net.cramHMACAlg "SHA 256"`},
		{"discard gran", func(r *Resource) { r.Options.Disk.RsDiscardGranularity = 1000 }, Features{}, `disk.rsDiscardGranularity 1000`},
		{"non-voting unsupported", func(r *Resource) { r.Options.Disk.NonVoting = true }, Features{}, `disk.nonVoting: the installed DRBD does not support non-voting`},
		{"ping-timeout zero", func(r *Resource) { r.Options.Net.PingTimeout = 0 }, Features{}, `net.pingTimeout 0: must be 1..300 tenths of a second`},
		{"ping-timeout above 30 s", func(r *Resource) { r.Options.Net.PingTimeout = 301 }, Features{}, `net.pingTimeout 301`},
		{"c-max-rate above 4 GiB/s", func(r *Resource) { r.Options.Disk.CMaxRate = 4<<20 + 1 }, Features{}, `disk.cMaxRate 4194305: must be 0..4194304 KiB/s`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := base()
			c.mutate(r)
			err := r.Validate(c.f)
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("want a *ValidationError, got %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
	// All problems are reported at once.
	r := base()
	r.Name = ""
	r.Minor = -1
	r.Options.Resource.Quorum = 99
	var ve *ValidationError
	if err := r.Validate(Features{}); !errors.As(err, &ve) || len(ve.Problems) != 3 {
		t.Fatalf("want 3 problems, got %v", err)
	}
	if err := base().Validate(Features{}); err != nil {
		t.Fatalf("valid model rejected: %v", err)
	}
	if err := (*Resource)(nil).Validate(Features{}); err == nil {
		t.Fatal("nil resource accepted")
	}
}

// A liminal member (D∅, sD∅) runs `disk none` (docs/layouts.md §8.4) but is a
// full-mesh member: it connects to the TieBreaker and Access members too, so a
// diskless node with a diskless peer is valid, and drbdadm accepts it (the
// package's TestMain hands every rendered file to drbdadm).
func TestLiminalMemberConnectsToStarMembers(t *testing.T) {
	r := *goldenModels()["2d-tb-from-d"].r
	r.Peers = append([]Peer(nil), r.Peers...)
	r.Disk = nil
	if err := r.Validate(Features{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Render(&r, Features{}); err != nil {
		t.Fatal(err)
	}
}
