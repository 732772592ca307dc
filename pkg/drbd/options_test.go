package drbd

import (
	"encoding/json"
	"strings"
	"testing"
)

// A narrower scope's explicit false / 0 survives a broader scope's true /
// non-zero, and nil inherits (OptionSet's rule).
func TestResolveExplicitZeroSurvives(t *testing.T) {
	broad := OptionSet{
		Resource: ResourceOptionSet{AutoPromote: Ptr(true), QuorumMinimumRedundancy: Ptr(QuorumCount(2))},
		Net:      NetOptionSet{AllowTwoPrimaries: Ptr(true), AllowRemoteRead: Ptr(true)},
		Disk:     DiskOptionSet{DiscardZeroesIfAligned: Ptr(true), RsDiscardGranularity: Ptr(int32(65536))},
	}
	narrow := OptionSet{
		Resource: ResourceOptionSet{AutoPromote: Ptr(false), QuorumMinimumRedundancy: Ptr(QuorumOff)},
		Net:      NetOptionSet{AllowTwoPrimaries: Ptr(false), AllowRemoteRead: Ptr(false)},
		Disk:     DiskOptionSet{DiscardZeroesIfAligned: Ptr(false), RsDiscardGranularity: Ptr(int32(0))},
	}
	got := Resolve(DefaultOptions(), broad, narrow)
	if got.Resource.AutoPromote || got.Net.AllowTwoPrimaries || got.Net.AllowRemoteRead ||
		got.Disk.DiscardZeroesIfAligned || got.Disk.RsDiscardGranularity != 0 ||
		got.Resource.QuorumMinimumRedundancy != QuorumOff {
		t.Fatalf("explicit false/0 at the narrow scope lost to the broad scope: %s", got)
	}

	// nil at the narrow scope inherits the broad value.
	got = Resolve(DefaultOptions(), broad, OptionSet{})
	if !got.Resource.AutoPromote || !got.Net.AllowTwoPrimaries || !got.Disk.DiscardZeroesIfAligned ||
		got.Disk.RsDiscardGranularity != 65536 || got.Resource.QuorumMinimumRedundancy != QuorumCount(2) {
		t.Fatalf("nil did not inherit: %s", got)
	}

	// And the defaults fill what nobody sets.
	got = Resolve(DefaultOptions())
	if got.Net.Protocol != ProtocolC || got.Resource.Quorum != QuorumMajority || got.Resource.AutoPromote {
		t.Fatalf("defaults: %s", got)
	}

	// Both renders (broad-wins would be the bug) are real drbd.conf.
	for _, o := range []Options{Resolve(DefaultOptions(), broad), Resolve(DefaultOptions(), broad, narrow)} {
		r := goldenModels()["2d-tb-from-d"].r
		rr := *r
		rr.Options = o
		out := string(renderChecked(t, &rr, Features{}))
		if want := "allow-two-primaries " + yesNo(o.Net.AllowTwoPrimaries) + ";"; !strings.Contains(out, want) {
			t.Errorf("rendered file lacks %q", want)
		}
	}
}

// Resolve must not alias the caller's scopes: mutating a scope after
// resolving (or resolving twice) changes nothing already resolved.
func TestResolveDoesNotAlias(t *testing.T) {
	v := true
	s := OptionSet{Net: NetOptionSet{AllowTwoPrimaries: &v}}
	got := Resolve(DefaultOptions(), s)
	v = false
	if !got.Net.AllowTwoPrimaries {
		t.Fatal("resolved options changed when the scope was mutated")
	}
}

// A per-peer nil inherits the resource-level value; explicit false wins.
func TestPeerAllowRemoteReadOverride(t *testing.T) {
	o := Resolve(DefaultOptions())
	f := false
	if !(Peer{}).EffectiveAllowRemoteRead(o) {
		t.Error("nil peer override should inherit allow-remote-read yes")
	}
	if (Peer{AllowRemoteRead: &f}).EffectiveAllowRemoteRead(o) {
		t.Error("explicit false at the peer must win over the resource's true")
	}
}

func TestQuorumText(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Quorum
		err  bool
	}{
		{"off", QuorumOff, false}, {"majority", QuorumMajority, false}, {"all", QuorumAll, false},
		{"1", 1, false}, {"32", 32, false}, {"0", 0, true}, {"33", 0, true}, {"-1", 0, true}, {"most", 0, true},
	} {
		got, err := ParseQuorum(c.in)
		if (err != nil) != c.err || (!c.err && got != c.want) {
			t.Errorf("ParseQuorum(%q) = %v, %v", c.in, got, err)
		}
		if !c.err && got.String() != c.in {
			t.Errorf("%q round-trips to %q", c.in, got.String())
		}
	}
	b, err := json.Marshal(struct{ Q Quorum }{QuorumCount(3)})
	if err != nil || string(b) != `{"Q":"3"}` {
		t.Fatalf("marshal: %s %v", b, err)
	}
	var back struct{ Q Quorum }
	if err := json.Unmarshal([]byte(`{"Q":"majority"}`), &back); err != nil || back.Q != QuorumMajority {
		t.Fatalf("unmarshal: %v %v", back.Q, err)
	}
	if err := json.Unmarshal([]byte(`{"Q":"99"}`), &back); err == nil {
		t.Fatal("unmarshal of 99 succeeded")
	}
}
