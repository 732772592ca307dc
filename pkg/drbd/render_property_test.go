package drbd

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// Random models that pass Validate must be accepted by drbdadm: the
// validator is at least as strict as the real parser on everything the
// renderer writes (names with '.', '+', '_', IPv6, every option value).
func TestRenderRandomValidModelsAcceptedByDrbdadm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2)) // fixed seed: the same 150 files every run
	const n = 150
	nameChars := "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+-"
	name := func(prefix string) string {
		b := []byte(prefix)
		for range 1 + rng.IntN(20) {
			b = append(b, nameChars[rng.IntN(len(nameChars))])
		}
		return string(b)
	}
	quorum := func() Quorum {
		switch rng.IntN(4) {
		case 0:
			return QuorumOff
		case 1:
			return QuorumMajority
		case 2:
			return QuorumAll
		}
		return QuorumCount(1 + rng.IntN(MaxQuorumCount))
	}
	accepted := 0
	for i := range n {
		v6 := rng.IntN(3) == 0
		ip := func(k int) netip.Addr {
			if v6 {
				return netip.MustParseAddr(fmt.Sprintf("fd00:%x::%x", i, k+1))
			}
			return netip.AddrFrom4([4]byte{10, byte(i), byte(k), 1})
		}
		ids := rng.Perm(MaxNodeID + 1)
		r := &Resource{
			Name:  name("r"),
			Self:  Host{Name: name("self"), NodeID: ids[0], Address: Address{IP: ip(0), Port: 1 + rng.IntN(MaxPort)}},
			Minor: rng.IntN(MaxMinor + 1),
		}
		if rng.IntN(4) != 0 {
			r.Disk = &Disk{BackingDevice: "/dev/vg" + fmt.Sprint(i) + "/" + name("lv"), MetaDisk: MetaDiskInternal}
		}
		for k := range rng.IntN(6) {
			p := Peer{Name: name(fmt.Sprintf("p%d", k)), NodeID: ids[k+1], Address: Address{IP: ip(k + 1), Port: 1 + rng.IntN(MaxPort)},
				Minor: rng.IntN(MaxMinor + 1), Diskless: r.Disk != nil && rng.IntN(3) == 0}
			if rng.IntN(3) == 0 {
				p.AllowRemoteRead = Ptr(rng.IntN(2) == 0)
			}
			r.Peers = append(r.Peers, p)
		}
		set := OptionSet{
			Resource: ResourceOptionSet{Quorum: Ptr(quorum()), QuorumMinimumRedundancy: Ptr(quorum()),
				OnNoQuorum:         Ptr([]OnNoQuorum{OnNoQuorumIOError, OnNoQuorumSuspendIO}[rng.IntN(2)]),
				OnNoDataAccessible: Ptr([]OnNoDataAccessible{OnNoDataAccessibleIOError, OnNoDataAccessibleSuspendIO}[rng.IntN(2)]),
				AutoPromote:        Ptr(rng.IntN(2) == 0)},
			Net:  NetOptionSet{AllowTwoPrimaries: Ptr(rng.IntN(2) == 0), AllowRemoteRead: Ptr(rng.IntN(2) == 0)},
			Disk: DiskOptionSet{DiscardZeroesIfAligned: Ptr(rng.IntN(2) == 0), RsDiscardGranularity: Ptr(int32(512 * rng.IntN(2049)))},
		}
		if rng.IntN(2) == 0 {
			set.Net.VerifyAlg = Ptr(VerifyAlgPreference[rng.IntN(len(VerifyAlgPreference))])
		}
		if rng.IntN(2) == 0 {
			set.Net.CramHMACAlg = Ptr([]string{"sha1", "sha256", "sha512", "md5"}[rng.IntN(4)])
			secret := make([]byte, 1+rng.IntN(MaxSharedSecretLen))
			for j := range secret {
				c := byte(0x21 + rng.IntN(0x7e-0x21+1))
				if c == '"' || c == '\\' {
					c = 'x'
				}
				secret[j] = c
			}
			set.Net.SharedSecret = Ptr(string(secret))
		}
		r.Options = Resolve(DefaultOptions(), set)
		if err := r.Validate(Features{}); err != nil {
			t.Fatalf("model %d should be valid: %v", i, err)
		}
		renderChecked(t, r, Features{})
		accepted++
	}
	t.Logf("drbdadm accepted all %d random valid models", accepted)
}
