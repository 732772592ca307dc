package drbd

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
)

// Quorum is a value of DRBD's quorum and quorum-minimum-redundancy options:
// off, majority, all, or an explicit count 1..32.
//
// The encoding mirrors the kernel's (QOU_OFF = 0, QOU_MAJORITY = 1024,
// QOU_ALL = 1025) so that the zero value is "off", as it is for DRBD, and a
// number read back from `drbdsetup show` maps one to one.
type Quorum int32

const (
	QuorumOff      Quorum = 0
	QuorumMajority Quorum = 1024
	QuorumAll      Quorum = 1025

	// MaxQuorumCount is the largest explicit count DRBD accepts. meshvol uses
	// it for diskless members ("quorum 32"): such a node can never reach it by
	// counting and is quorate only through a quorate UpToDate peer.
	MaxQuorumCount = 32
)

// QuorumCount is an explicit quorum of k voters. Validate rejects k outside
// 1..MaxQuorumCount.
func QuorumCount(k int) Quorum { return Quorum(k) }

// IsCount reports whether q is an explicit count (and returns it).
func (q Quorum) IsCount() (int, bool) {
	if q >= 1 && q <= MaxQuorumCount {
		return int(q), true
	}
	return 0, false
}

// Neighbour is the explicit count next to q (q-1, or 2 for q=1), for
// RecomputeQuorum. A q that is not a count has none.
func (q Quorum) Neighbour() (Quorum, error) {
	k, ok := q.IsCount()
	if !ok {
		return 0, fmt.Errorf("quorum %s: recomputing quorum needs an explicit count 1..%d", q, MaxQuorumCount)
	}
	if k == 1 {
		return QuorumCount(2), nil
	}
	return QuorumCount(k - 1), nil
}

// Valid reports whether q is one of the values DRBD accepts.
func (q Quorum) Valid() bool {
	_, isCount := q.IsCount()
	return q == QuorumOff || q == QuorumMajority || q == QuorumAll || isCount
}

// String renders q the way drbd.conf spells it.
func (q Quorum) String() string {
	switch q {
	case QuorumOff:
		return "off"
	case QuorumMajority:
		return "majority"
	case QuorumAll:
		return "all"
	}
	return strconv.Itoa(int(q))
}

// ParseQuorum parses off | majority | all | 1..32.
func ParseQuorum(s string) (Quorum, error) {
	switch s {
	case "off":
		return QuorumOff, nil
	case "majority":
		return QuorumMajority, nil
	case "all":
		return QuorumAll, nil
	}
	k, err := strconv.Atoi(s)
	if err != nil || k < 1 || k > MaxQuorumCount {
		return 0, fmt.Errorf("quorum value %q: must be off, majority, all or a count 1..%d", s, MaxQuorumCount)
	}
	return Quorum(k), nil
}

// MarshalText / UnmarshalText let a Quorum appear in JSON and CRDs as text.
func (q Quorum) MarshalText() ([]byte, error) {
	if !q.Valid() {
		return nil, fmt.Errorf("quorum value %d is not off, majority, all or 1..%d", int32(q), MaxQuorumCount)
	}
	return []byte(q.String()), nil
}

func (q *Quorum) UnmarshalText(b []byte) error {
	v, err := ParseQuorum(string(b))
	if err != nil {
		return err
	}
	*q = v
	return nil
}

// OnNoQuorum is DRBD's on-no-quorum policy.
type OnNoQuorum string

const (
	// OnNoQuorumIOError fails IO with EIO while quorum is lost.
	OnNoQuorumIOError OnNoQuorum = "io-error"
	// OnNoQuorumSuspendIO freezes IO; it resumes by itself when quorum returns.
	OnNoQuorumSuspendIO OnNoQuorum = "suspend-io"
)

// OnNoDataAccessible is DRBD's on-no-data-accessible policy (a diskless
// Primary without any reachable UpToDate data).
type OnNoDataAccessible string

const (
	OnNoDataAccessibleIOError   OnNoDataAccessible = "io-error"
	OnNoDataAccessibleSuspendIO OnNoDataAccessible = "suspend-io"
)

// Protocol is the DRBD replication protocol. meshvol only uses C (a write
// is acknowledged once it is on every connected peer's disk); A and B are
// representable so that a bad value can be named in an error.
type Protocol string

const (
	ProtocolA Protocol = "A"
	ProtocolB Protocol = "B"
	ProtocolC Protocol = "C"
)

// Options are the resolved DRBD options of a resource: every field has a
// value. They are produced by Resolve from an OptionSet chain.
type Options struct {
	Resource ResourceOptions
	Net      NetOptions
	Disk     DiskOptions
}

// ResourceOptions render into the resource's `options { }` section.
type ResourceOptions struct {
	Quorum                  Quorum
	QuorumMinimumRedundancy Quorum
	OnNoQuorum              OnNoQuorum
	OnNoDataAccessible      OnNoDataAccessible
	// AutoPromote is false in meshvol: promotion is an explicit agent action
	// guarded by the datamesh, never a side effect of opening the device.
	AutoPromote bool
}

// NetOptions render into the resource's `net { }` section (AllowRemoteRead
// into each connection's `net { }`, see Peer.AllowRemoteRead).
type NetOptions struct {
	Protocol          Protocol
	AllowTwoPrimaries bool
	// CramHMACAlg and SharedSecret authenticate peers; both empty means no
	// authentication. Validate requires both or neither.
	CramHMACAlg  string
	SharedSecret string
	// VerifyAlg is the digest online verify compares blocks with; empty
	// means no verify-alg, and then DRBD refuses `verify` (-14 "Need a
	// verify algorithm to start online verify"). Both ends of a connection
	// must agree (DRBD drops a connection whose peer has another one), so
	// it is negotiated per resource like CramHMACAlg (see Negotiate).
	VerifyAlg string
	// AllowRemoteRead is the default for every connection.
	AllowRemoteRead bool
	// PingTimeout is how long a peer may take to answer a keep-alive before
	// DRBD drops the connection, in tenths of a second (drbd.conf(5)
	// ping-timeout: 1..300, DRBD's default 5).
	PingTimeout int32
}

// DiskOptions render into the `disk { }` section of this node's volume.
type DiskOptions struct {
	DiscardZeroesIfAligned bool
	// RsDiscardGranularity in bytes; 0 disables discards during resync.
	RsDiscardGranularity int32
	// NonVoting marks a diskful replica that does not count towards quorum.
	// Upstream DRBD 9.2 has no such option (docs/drbd-quorum.md); it is rendered
	// only when Features.NonVoting says the module supports it.
	NonVoting bool
	// CMaxRate caps the dynamically controlled resync rate, in KiB/s
	// (drbd.conf(5) c-max-rate: a peer-device option, which a disk section
	// passes on to every connection's peer device; 0..4194304, 0 meaning no
	// limit, DRBD's default 102400).
	CMaxRate int32
}

// OptionSet is one scope of the option override chain (defaults → storage
// class → volume → replica, broadest to narrowest). A nil field inherits
// from the broader scope; any non-nil value, including false and 0, is an
// explicit setting and wins. (A resolver that only copied "true" values
// would let a broader true silently override a narrower false.)
type OptionSet struct {
	Resource ResourceOptionSet
	Net      NetOptionSet
	Disk     DiskOptionSet
}

type ResourceOptionSet struct {
	Quorum                  *Quorum
	QuorumMinimumRedundancy *Quorum
	OnNoQuorum              *OnNoQuorum
	OnNoDataAccessible      *OnNoDataAccessible
	AutoPromote             *bool
}

type NetOptionSet struct {
	Protocol          *Protocol
	AllowTwoPrimaries *bool
	CramHMACAlg       *string
	SharedSecret      *string
	VerifyAlg         *string
	AllowRemoteRead   *bool
	PingTimeout       *int32
}

type DiskOptionSet struct {
	DiscardZeroesIfAligned *bool
	RsDiscardGranularity   *int32
	NonVoting              *bool
	CMaxRate               *int32
}

// DefaultOptions are meshvol's base scope: what a resource gets when no
// narrower scope says otherwise. Every field is set, so Resolve(DefaultOptions())
// yields a complete Options.
func DefaultOptions() OptionSet {
	return OptionSet{
		Resource: ResourceOptionSet{
			Quorum:                  Ptr(QuorumMajority),
			QuorumMinimumRedundancy: Ptr(QuorumOff),
			OnNoQuorum:              Ptr(OnNoQuorumSuspendIO),
			OnNoDataAccessible:      Ptr(OnNoDataAccessibleIOError),
			AutoPromote:             Ptr(false),
		},
		Net: NetOptionSet{
			Protocol:          Ptr(ProtocolC),
			AllowTwoPrimaries: Ptr(false),
			CramHMACAlg:       Ptr(""),
			SharedSecret:      Ptr(""),
			VerifyAlg:         Ptr(""),
			AllowRemoteRead:   Ptr(true),
			PingTimeout:       Ptr(DefaultPingTimeout),
		},
		Disk: DiskOptionSet{
			DiscardZeroesIfAligned: Ptr(true),
			RsDiscardGranularity:   Ptr(int32(0)),
			NonVoting:              Ptr(false),
			CMaxRate:               Ptr(DefaultCMaxRate),
		},
	}
}

// DRBD's own defaults for the numeric options meshvol renders, which
// `drbdsetup show` leaves out (drbd.conf(5), drbd_limits.h).
const (
	DefaultPingTimeout int32 = 5      // tenths of a second
	DefaultCMaxRate    int32 = 102400 // KiB/s
)

// Resolve applies chain (broadest first) over defaults and returns the
// resolved options. A field that is nil in defaults and every scope gets
// Go's zero value; pass DefaultOptions() as defaults to avoid that.
func Resolve(defaults OptionSet, chain ...OptionSet) Options {
	acc := defaults
	for _, s := range chain {
		acc = overlay(acc, s)
	}
	return Options{
		Resource: ResourceOptions{
			Quorum:                  deref(acc.Resource.Quorum),
			QuorumMinimumRedundancy: deref(acc.Resource.QuorumMinimumRedundancy),
			OnNoQuorum:              deref(acc.Resource.OnNoQuorum),
			OnNoDataAccessible:      deref(acc.Resource.OnNoDataAccessible),
			AutoPromote:             deref(acc.Resource.AutoPromote),
		},
		Net: NetOptions{
			Protocol:          deref(acc.Net.Protocol),
			AllowTwoPrimaries: deref(acc.Net.AllowTwoPrimaries),
			CramHMACAlg:       deref(acc.Net.CramHMACAlg),
			SharedSecret:      deref(acc.Net.SharedSecret),
			VerifyAlg:         deref(acc.Net.VerifyAlg),
			AllowRemoteRead:   deref(acc.Net.AllowRemoteRead),
			PingTimeout:       deref(acc.Net.PingTimeout),
		},
		Disk: DiskOptions{
			DiscardZeroesIfAligned: deref(acc.Disk.DiscardZeroesIfAligned),
			RsDiscardGranularity:   deref(acc.Disk.RsDiscardGranularity),
			NonVoting:              deref(acc.Disk.NonVoting),
			CMaxRate:               deref(acc.Disk.CMaxRate),
		},
	}
}

// overlay returns base with every non-nil field of over applied. The test is
// "non-nil", never "true" or "non-zero": see OptionSet.
func overlay(base, over OptionSet) OptionSet {
	pick(&base.Resource.Quorum, over.Resource.Quorum)
	pick(&base.Resource.QuorumMinimumRedundancy, over.Resource.QuorumMinimumRedundancy)
	pick(&base.Resource.OnNoQuorum, over.Resource.OnNoQuorum)
	pick(&base.Resource.OnNoDataAccessible, over.Resource.OnNoDataAccessible)
	pick(&base.Resource.AutoPromote, over.Resource.AutoPromote)
	pick(&base.Net.Protocol, over.Net.Protocol)
	pick(&base.Net.AllowTwoPrimaries, over.Net.AllowTwoPrimaries)
	pick(&base.Net.CramHMACAlg, over.Net.CramHMACAlg)
	pick(&base.Net.SharedSecret, over.Net.SharedSecret)
	pick(&base.Net.VerifyAlg, over.Net.VerifyAlg)
	pick(&base.Net.AllowRemoteRead, over.Net.AllowRemoteRead)
	pick(&base.Net.PingTimeout, over.Net.PingTimeout)
	pick(&base.Disk.DiscardZeroesIfAligned, over.Disk.DiscardZeroesIfAligned)
	pick(&base.Disk.RsDiscardGranularity, over.Disk.RsDiscardGranularity)
	pick(&base.Disk.NonVoting, over.Disk.NonVoting)
	pick(&base.Disk.CMaxRate, over.Disk.CMaxRate)
	return base
}

func pick[T any](dst **T, src *T) {
	if src != nil {
		v := *src // copy: the resolved chain must not alias a caller's scope
		*dst = &v
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// Ptr returns a pointer to v; handy for building OptionSets.
func Ptr[T any](v T) *T { return &v }

// String lists the resolved options in a stable order (secret redacted), for
// logs and test failures.
func (o Options) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "quorum=%s qmr=%s on-no-quorum=%s on-no-data-accessible=%s auto-promote=%t ",
		o.Resource.Quorum, o.Resource.QuorumMinimumRedundancy, o.Resource.OnNoQuorum,
		o.Resource.OnNoDataAccessible, o.Resource.AutoPromote)
	secret := ""
	if o.Net.SharedSecret != "" {
		secret = Redacted
	}
	fmt.Fprintf(&b, "protocol=%s allow-two-primaries=%t cram-hmac-alg=%q shared-secret=%q verify-alg=%q allow-remote-read=%t ping-timeout=%d ",
		o.Net.Protocol, o.Net.AllowTwoPrimaries, o.Net.CramHMACAlg, secret, o.Net.VerifyAlg, o.Net.AllowRemoteRead, o.Net.PingTimeout)
	fmt.Fprintf(&b, "discard-zeroes-if-aligned=%t rs-discard-granularity=%d non-voting=%t c-max-rate=%d",
		o.Disk.DiscardZeroesIfAligned, o.Disk.RsDiscardGranularity, o.Disk.NonVoting, o.Disk.CMaxRate)
	return b.String()
}

// String prints the net options with the shared secret redacted; GoString,
// MarshalJSON and LogValue do the same, so that printing a Resource, its
// Options or its NetOptions in any way (%v, %+v, %#v, JSON, slog) never
// shows the secret.
func (n NetOptions) String() string {
	secret := ""
	if n.SharedSecret != "" {
		secret = Redacted
	}
	return fmt.Sprintf("{Protocol:%s AllowTwoPrimaries:%t CramHMACAlg:%s SharedSecret:%s VerifyAlg:%s AllowRemoteRead:%t}",
		n.Protocol, n.AllowTwoPrimaries, n.CramHMACAlg, secret, n.VerifyAlg, n.AllowRemoteRead)
}

func (n NetOptions) GoString() string { return "drbd.NetOptions" + n.String() }

func (n NetOptions) LogValue() slog.Value { return slog.StringValue(n.String()) }

// MarshalJSON redacts the secret (see String).
func (n NetOptions) MarshalJSON() ([]byte, error) {
	type plain NetOptions // no methods: no recursion
	p := plain(n)
	if p.SharedSecret != "" {
		p.SharedSecret = Redacted
	}
	return json.Marshal(p)
}

// GoString and LogValue of Options redact like String.
func (o Options) GoString() string     { return "drbd.Options{" + o.String() + "}" }
func (o Options) LogValue() slog.Value { return slog.StringValue(o.String()) }
