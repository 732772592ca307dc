package agent

import (
	"fmt"
	"net/netip"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// renderInput is everything that decides one replica's DRBD configuration for
// one datamesh revision. It is a pure value so that the same revision always
// renders the same Resource (the read-back compares against it).
type renderInput struct {
	rv     *v1.ReplicatedVolume
	self   *v1.DatameshMember
	rvr    *v1.ReplicatedVolumeReplica
	rsc    *v1.ReplicatedStorageClass // nil: none (Manual volume, or not found)
	secret string                     // "" when the datamesh has no secret reference
	// backing is the backing device; "" for a member DRBD runs without a disk.
	backing  string
	features drbd.Features
}

// render turns the datamesh into this node's DRBD resource.
//
// Who connects to whom (docs/datamesh-spec.md, "States"): full-mesh members
// (D, D∅, sD, sD∅) connect to every other member; star members (A, TB) connect
// only to full-mesh members. D∅ and sD∅ are rendered `disk none` even though they
// hold a backing volume (docs/layouts.md §8.4, docs/datamesh.md): a liminal member
// gives itself no vote. A peer is written diskless only when it is a star member: a
// liminal peer will get its disk, and the bitmap slot ("bitmap no" otherwise) must
// be there when it does — so DRBD on its diskful peers counts a liminal peer as a
// voter (docs/drbd-quorum.md, "The rule"), which the engine's q accounts for.
//
// Quorum: voters (D, D∅) run the published q; every other member runs
// layout.NonVoterQuorum, so it is quorate only through a quorate UpToDate peer;
// all run the published qmr. 0 means off.
func render(in renderInput) (*drbd.Resource, error) {
	r, err := renderHosts(in, connectedPeers(in))
	if err != nil {
		return nil, err
	}
	fixed, err := datameshOptions(in)
	if err != nil {
		return nil, err
	}
	chain := overrides(in)
	// The datamesh's own settings come last: no override may change quorum,
	// promotion or the secret.
	chain = append(chain, fixed)
	r.Options = drbd.Resolve(drbd.DefaultOptions(), chain...)
	return r, nil
}

// connectedPeers are the members this one connects to: every other member for a
// full-mesh member, the full-mesh members for a star member.
func connectedPeers(in renderInput) []*v1.DatameshMember {
	dm, self := &in.rv.Status.Datamesh, in.self
	var peers []*v1.DatameshMember
	for i := range dm.Members {
		m := &dm.Members[i]
		if m.Name == self.Name {
			continue
		}
		if !self.Type.ConnectsToAllPeers() && !m.Type.ConnectsToAllPeers() {
			continue // star to star: no connection
		}
		peers = append(peers, m)
	}
	return peers
}

// renderHosts renders this node (address, minor, disk) and its peers.
func renderHosts(in renderInput, peers []*v1.DatameshMember) (*drbd.Resource, error) {
	dm, self := &in.rv.Status.Datamesh, in.self
	selfIP, err := listenAddr(self, peers)
	if err != nil {
		return nil, err
	}
	r := &drbd.Resource{
		Name:  in.rv.Name,
		Self:  drbd.Host{Name: self.NodeName, NodeID: int(self.NodeID), Address: drbd.Address{IP: selfIP, Port: memberPort(dm, self)}},
		Minor: int(dm.Minor),
	}
	if self.Type.HasDisk() {
		if in.backing == "" {
			return nil, fmt.Errorf("member %s is %s but has no backing volume", self.Name, self.Type)
		}
		r.Disk = &drbd.Disk{BackingDevice: in.backing, MetaDisk: drbd.MetaDiskInternal}
	}
	for _, m := range peers {
		ip, err := sameFamily(m, selfIP)
		if err != nil {
			return nil, err
		}
		r.Peers = append(r.Peers, drbd.Peer{
			Name:     m.NodeName,
			NodeID:   int(m.NodeID),
			Address:  drbd.Address{IP: ip, Port: memberPort(dm, m)},
			Minor:    int(dm.Minor),
			Diskless: !m.Type.ConnectsToAllPeers(),
		})
	}
	return r, nil
}

// memberPort is the port member m listens on, on its node: its own, or, for a member
// published before members had ports, the volume's (docs/controller.md, "Allocation and
// the shared secret"). 0 (neither) is refused by the resource's validation.
func memberPort(dm *v1.Datamesh, m *v1.DatameshMember) int {
	if m.Port != 0 {
		return int(m.Port)
	}
	return int(dm.Port)
}

// datameshOptions are the settings the datamesh decides and no override may change:
// quorum, promotion, multiattach, the shared secret, non-voting.
func datameshOptions(in renderInput) (drbd.OptionSet, error) {
	dm, self := &in.rv.Status.Datamesh, in.self
	q := drbd.QuorumCount(layout.NonVoterQuorum)
	if self.Type.IsVoter() {
		q = quorumSetting(dm.Quorum)
	}
	fixed := drbd.OptionSet{
		Resource: drbd.ResourceOptionSet{
			Quorum:                  &q,
			QuorumMinimumRedundancy: drbd.Ptr(quorumSetting(dm.QuorumMinimumRedundancy)),
			// Promotion is the agent's explicit act on the datamesh's word, never a
			// side effect of someone opening the device.
			AutoPromote: drbd.Ptr(false),
		},
		Net: drbd.NetOptionSet{AllowTwoPrimaries: drbd.Ptr(dm.Multiattach)},
	}
	if ref := dm.SharedSecret; ref != nil {
		if in.secret == "" {
			return drbd.OptionSet{}, fmt.Errorf("datamesh names shared secret %s but it was not read", ref.SecretName)
		}
		fixed.Net.CramHMACAlg = drbd.Ptr(ref.Algorithm)
		fixed.Net.SharedSecret = drbd.Ptr(in.secret)
	}
	if in.features.NonVoting {
		nv := self.Type == v1.MemberTypeShadowDiskful || self.Type == v1.MemberTypeLiminalShadowDiskful
		fixed.Disk.NonVoting = &nv
	}
	return fixed, nil
}

// overrides are the DRBD option overrides of the class, the volume and the replica,
// in that order (a later one wins).
func overrides(in renderInput) []drbd.OptionSet {
	var chain []drbd.OptionSet
	if in.rsc != nil {
		chain = append(chain, optionSet(in.rsc.Spec.DRBDOptions))
	}
	chain = append(chain, optionSet(in.rv.Spec.DRBDOptions))
	if in.rvr != nil {
		chain = append(chain, optionSet(in.rvr.Spec.DRBDOptions))
	}
	return chain
}

func quorumSetting(n int32) drbd.Quorum {
	if n <= 0 {
		return drbd.QuorumOff
	}
	return drbd.QuorumCount(int(n))
}

// optionSet maps the API's override scope to pkg/drbd's. The API's units
// are DRBD's: pingTimeoutTenthsOfSecond is ping-timeout, resyncMaxRateKiB
// is c-max-rate in KiB/s.
func optionSet(o *v1.DRBDOptions) drbd.OptionSet {
	var s drbd.OptionSet
	if o == nil {
		return s
	}
	if o.OnNoQuorum != nil {
		s.Resource.OnNoQuorum = drbd.Ptr(drbd.OnNoQuorum(*o.OnNoQuorum))
	}
	if o.OnNoDataAccessible != nil {
		s.Resource.OnNoDataAccessible = drbd.Ptr(drbd.OnNoDataAccessible(*o.OnNoDataAccessible))
	}
	s.Disk.DiscardZeroesIfAligned = o.DiscardZeroesIfAligned
	s.Disk.RsDiscardGranularity = o.RsDiscardGranularity
	s.Net.AllowRemoteRead = o.AllowRemoteRead
	s.Net.PingTimeout = o.PingTimeoutTenthsOfSecond
	s.Disk.CMaxRate = o.ResyncMaxRateKiB
	return s
}

// listenAddr picks this member's first address whose family every peer also
// has (one resource listens on one address; a dual-stack node talks to an
// IPv4-only peer over IPv4).
func listenAddr(self *v1.DatameshMember, peers []*v1.DatameshMember) (netip.Addr, error) {
	var first netip.Addr
	for _, a := range self.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			continue
		}
		if !first.IsValid() {
			first = ip
		}
		ok := true
		for _, p := range peers {
			if _, err := sameFamily(p, ip); err != nil {
				ok = false
				break
			}
		}
		if ok {
			return ip, nil
		}
	}
	if !first.IsValid() {
		return netip.Addr{}, fmt.Errorf("datamesh member %s (node %s) has no valid address in %v", self.Name, self.NodeName, self.Addresses)
	}
	return netip.Addr{}, fmt.Errorf("datamesh member %s (node %s): no address family %v shares with every peer", self.Name, self.NodeName, self.Addresses)
}

// sameFamily picks the peer's address of the family this node listens on: a
// DRBD path joins two addresses of one family.
func sameFamily(m *v1.DatameshMember, self netip.Addr) (netip.Addr, error) {
	for _, a := range m.Addresses {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() == self.Is4() {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("datamesh member %s (node %s) has no %s address (addresses %v)", m.Name, m.NodeName, family(self), m.Addresses)
}

func family(ip netip.Addr) string {
	if ip.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
