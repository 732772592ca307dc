package agent

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// configDiff lists how the configuration the kernel runs (`drbdsetup show`)
// differs from want; empty means the kernel runs exactly want. This is the
// read-back behind status.datameshRevision: a revision is confirmed only when
// this is empty, never because a command exited 0.
//
// show prints an option only where it differs from DRBD's default, so a
// missing key is compared as the default. The messages never carry the shared
// secret (show prints it in clear; docs/contract.md "The shared secret").
func configDiff(want *drbd.Resource, got *drbd.ShowResource) []string {
	if got == nil {
		return []string{"resource is not running"}
	}
	var d diffs
	d.volume(want, got)
	d.resourceOptions(want.Options, got.Options)
	d.connections(want, got)
	return d
}

// diffs are configDiff's findings, one message each.
type diffs []string

func (d *diffs) add(format string, args ...any) { *d = append(*d, fmt.Sprintf(format, args...)) }

// volume compares this node's identity and its volume: node-id, minor, the backing
// disk and the disk options.
func (d *diffs) volume(want *drbd.Resource, got *drbd.ShowResource) {
	if got.ThisHost.NodeID != want.Self.NodeID {
		d.add("node-id %d, want %d", got.ThisHost.NodeID, want.Self.NodeID)
	}
	var vol *drbd.ShowVolume
	for i := range got.ThisHost.Volumes {
		if got.ThisHost.Volumes[i].VolumeNr == drbd.VolumeNumber {
			vol = &got.ThisHost.Volumes[i]
		}
	}
	if vol == nil {
		d.add("volume %d is not configured", drbd.VolumeNumber)
		return
	}
	if vol.DeviceMinor != want.Minor {
		d.add("minor %d, want %d", vol.DeviceMinor, want.Minor)
	}
	o := want.Options
	switch {
	case want.Disk == nil && !vol.Disk.None:
		d.add("disk %q attached, want none", vol.BackingDisk)
	case want.Disk != nil && (vol.Disk.None || vol.BackingDisk != want.Disk.BackingDevice):
		d.add("disk %q, want %q", vol.BackingDisk, want.Disk.BackingDevice)
	case want.Disk != nil:
		disk := vol.Disk.Options
		optEq(d.add, "disk option discard-zeroes-if-aligned", disk, "discard-zeroes-if-aligned", yesNo(o.Disk.DiscardZeroesIfAligned), "yes")
		optEq(d.add, "disk option rs-discard-granularity", disk, "rs-discard-granularity", strconv.Itoa(int(o.Disk.RsDiscardGranularity)), "0")
		optEq(d.add, "disk option non-voting", disk, "non-voting", yesNo(o.Disk.NonVoting), "no")
	}
}

// resourceOptions compares the resource's options: quorum and what happens without it.
func (d *diffs) resourceOptions(o drbd.Options, opts drbd.ShowOptions) {
	quorumEq(d.add, "quorum", opts["quorum"], o.Resource.Quorum)
	quorumEq(d.add, "quorum-minimum-redundancy", opts["quorum-minimum-redundancy"], o.Resource.QuorumMinimumRedundancy)
	optEq(d.add, "on-no-quorum", opts, "on-no-quorum", string(o.Resource.OnNoQuorum), string(drbd.OnNoQuorumSuspendIO))
	optEq(d.add, "on-no-data-accessible", opts, "on-no-data-accessible", string(o.Resource.OnNoDataAccessible), string(drbd.OnNoDataAccessibleIOError))
	optEq(d.add, "auto-promote", opts, "auto-promote", yesNo(o.Resource.AutoPromote), "yes")
}

// connections compares the connections with the peers want names: none to a node-id
// outside the datamesh, each peer's as rendered, none missing.
func (d *diffs) connections(want *drbd.Resource, got *drbd.ShowResource) {
	wantPeers := map[int]drbd.Peer{}
	for _, p := range want.Peers {
		wantPeers[p.NodeID] = p
	}
	seen := map[int]bool{}
	for i := range got.Connections {
		c := &got.Connections[i]
		p, ok := wantPeers[c.PeerNodeID]
		if !ok {
			d.add("connection to node-id %d (%s) is not in the datamesh", c.PeerNodeID, c.Name())
			continue
		}
		seen[c.PeerNodeID] = true
		d.connection(want, c, p)
	}
	var missing []int
	for id := range wantPeers {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	for _, id := range missing {
		d.add("no connection to %s (node-id %d)", wantPeers[id].Name, id)
	}
}

// connection compares one connection with its peer p: name, path and net options (the
// shared secret compared, never printed).
func (d *diffs) connection(want *drbd.Resource, c *drbd.ShowConnection, p drbd.Peer) {
	o := want.Options
	what := fmt.Sprintf("connection to %s (node-id %d)", p.Name, p.NodeID)
	if c.Name() != p.Name {
		d.add("%s: name %q", what, c.Name())
	}
	wantPath := drbd.ShowPath{ThisHost: want.Self.Address.ShowString(), RemoteHost: p.Address.ShowString()}
	if paths := c.AllPaths(); len(paths) != 1 || paths[0] != wantPath {
		d.add("%s: paths %v, want [%v]", what, paths, wantPath)
	}
	optEq(d.add, what+" protocol", c.Net, "protocol", string(o.Net.Protocol), string(drbd.ProtocolC))
	optEq(d.add, what+" allow-two-primaries", c.Net, "allow-two-primaries", yesNo(o.Net.AllowTwoPrimaries), "no")
	optEq(d.add, what+" cram-hmac-alg", c.Net, "cram-hmac-alg", o.Net.CramHMACAlg, "")
	if c.Net["shared-secret"] != o.Net.SharedSecret {
		d.add("%s: shared-secret differs", what) // never print it
	}
	optEq(d.add, what+" allow-remote-read", c.Net, "allow-remote-read", yesNo(p.EffectiveAllowRemoteRead(o)), "yes")
	optEq(d.add, what+" ping-timeout", c.Net, "ping-timeout", strconv.Itoa(int(o.Net.PingTimeout)), strconv.Itoa(int(drbd.DefaultPingTimeout)))
	if want.Disk == nil {
		return
	}
	// c-max-rate, rendered in this node's disk section, is a peer-device option that
	// drbdadm sets on every connection; show prints it there with its unit suffix
	// ("4096k": KiB/s).
	var pd drbd.ShowOptions
	for _, v := range c.Volumes {
		if v.VolumeNr == drbd.VolumeNumber {
			pd = v.Disk
		}
	}
	rate, ok := pd["c-max-rate"]
	if !ok {
		rate = strconv.Itoa(int(drbd.DefaultCMaxRate))
	}
	if want := strconv.Itoa(int(o.Disk.CMaxRate)); strings.TrimSuffix(rate, "k") != want {
		d.add("%s c-max-rate %q, want %sk", what, rate, want)
	}
}

func optEq(add func(string, ...any), what string, m drbd.ShowOptions, key, want, def string) {
	got, ok := m[key]
	if !ok {
		got = def
	}
	if got != want {
		add("%s %q, want %q", what, got, want)
	}
}

func quorumEq(add func(string, ...any), what, got string, want drbd.Quorum) {
	q := drbd.QuorumOff
	if got != "" {
		var err error
		if q, err = drbd.ParseQuorum(got); err != nil {
			add("%s: %v", what, err)
			return
		}
	}
	if q != want {
		add("%s %s, want %s", what, q, want)
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
