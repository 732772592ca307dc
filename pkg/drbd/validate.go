package drbd

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Limits DRBD (9.2 kernel, drbd-utils 9.22) imposes, and meshvol's own
// stricter choices where DRBD's are vague. Each is named in the error that
// enforces it.
const (
	MaxNodeID = 31 // DRBD supports 32 nodes per resource: node-ids 0..31
	// MaxMinor: the block-layer minor is 20 bits.
	MaxMinor = 1<<20 - 1
	// MaxNameLen: DRBD keeps resource and connection names in 128-byte
	// netlink attributes including the NUL.
	MaxNameLen = 127
	// MaxSharedSecretLen: SHARED_SECRET_MAX is 64 bytes including the NUL.
	MaxSharedSecretLen = 63
	MaxPort            = 65535
)

// ValidationError lists every problem found in a Resource, each naming the
// field and the rule, so a user fixes them in one round rather than one
// per reconcile.
type ValidationError struct {
	Resource string
	Problems []string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("drbd resource %q is invalid: %s", e.Resource, strings.Join(e.Problems, "; "))
}

// Is lets callers test errors.Is(err, ErrInvalidConfig).
func (e *ValidationError) Is(target error) bool { return target == ErrInvalidConfig }

type problems []string

func (p *problems) addf(format string, args ...any) { *p = append(*p, fmt.Sprintf(format, args...)) }

// ValidateName checks a DRBD resource or host name. DRBD itself only forbids
// '/', spaces and control characters (names appear unquoted in events2
// output and as debugfs directories); meshvol is stricter: ASCII letters,
// digits and "_.+-", not starting with '-' (it would read as an option to
// drbdadm), and not "all" (drbdadm's keyword for every resource). Kubernetes
// object and node names (DNS subdomains) always pass.
func ValidateName(name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("is %d bytes, longer than %d", len(name), MaxNameLen)
	case name == "all":
		return errors.New(`must not be "all" (drbdadm keyword)`)
	case name[0] == '-':
		return errors.New("must not start with '-'")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '_' || c == '.' || c == '+' || c == '-'
		if !ok {
			return fmt.Errorf("character %q at offset %d is not allowed (letters, digits, '_', '.', '+', '-')", c, i)
		}
	}
	return nil
}

// Validate checks r against DRBD's rules and meshvol's, given what the
// installed DRBD supports. It returns a *ValidationError listing every
// problem, or nil.
func (r *Resource) Validate(f Features) error {
	if r == nil {
		return &ValidationError{Resource: "", Problems: []string{"resource is nil"}}
	}
	var p problems
	if err := ValidateName(r.Name); err != nil {
		p.addf("name %q: %v", r.Name, err)
	}
	validateHost(&p, "self", r.Self.Name, r.Self.NodeID, r.Self.Address)
	validateMinor(&p, "minor", r.Minor)

	if r.Disk != nil {
		switch {
		case r.Disk.BackingDevice == "":
			p.addf("disk.backingDevice: must not be empty (use a nil Disk for a diskless replica)")
		case !strings.HasPrefix(r.Disk.BackingDevice, "/"):
			p.addf("disk.backingDevice %q: must be an absolute path", r.Disk.BackingDevice)
		case strings.IndexFunc(r.Disk.BackingDevice, func(c rune) bool { return c <= ' ' || c > '~' || c == '"' || c == '\\' }) >= 0:
			p.addf("disk.backingDevice %q: must be printable ASCII without spaces, '\"' or '\\'", r.Disk.BackingDevice)
		}
		if r.Disk.MetaDisk != MetaDiskInternal {
			p.addf("disk.metaDisk %q: only %q is supported", r.Disk.MetaDisk, MetaDiskInternal)
		}
	}

	names := map[string]string{r.Self.Name: "self"}
	ids := map[int]string{r.Self.NodeID: "self"}
	selfFamily := family(r.Self.Address.IP)
	for i, peer := range r.Peers {
		field := fmt.Sprintf("peers[%d]", i)
		validateHost(&p, field, peer.Name, peer.NodeID, peer.Address)
		validateMinor(&p, field+".minor", peer.Minor)
		if prev, dup := names[peer.Name]; dup && peer.Name != "" {
			p.addf("%s.name %q: already used by %s (peer names must be unique and differ from self)", field, peer.Name, prev)
		} else {
			names[peer.Name] = field
		}
		if prev, dup := ids[peer.NodeID]; dup {
			p.addf("%s.nodeID %d: already used by %s (node-ids must be unique)", field, peer.NodeID, prev)
		} else {
			ids[peer.NodeID] = field
		}
		if pf := family(peer.Address.IP); pf != "" && selfFamily != "" && pf != selfFamily {
			p.addf("%s.address %s: is %s but self is %s (a connection's two ends must use one address family)",
				field, peer.Address.IP, pf, selfFamily)
		}
		if peer.Address == r.Self.Address && peer.Address.IP.IsValid() {
			p.addf("%s.address %s: same address and port as self", field, peer.Address.ShowString())
		}
		// A diskless node may have diskless peers: a liminal member (D∅, sD∅)
		// runs `disk none` (docs/layouts.md §8.4) yet is a full-mesh member, connected
		// to the Access and TieBreaker members too. Whether two members
		// connect is the datamesh's call, not a property of their disks.
	}

	validateOptions(&p, r.Options, f)

	if len(p) == 0 {
		return nil
	}
	return &ValidationError{Resource: r.Name, Problems: p}
}

func validateHost(p *problems, field, name string, nodeID int, a Address) {
	if err := ValidateName(name); err != nil {
		p.addf("%s.name %q: %v", field, name, err)
	}
	if nodeID < 0 || nodeID > MaxNodeID {
		p.addf("%s.nodeID %d: must be in 0..%d", field, nodeID, MaxNodeID)
	}
	switch {
	case !a.IP.IsValid():
		p.addf("%s.address.ip: must be set", field)
	case a.IP.Is4In6():
		p.addf("%s.address.ip %s: IPv4-mapped IPv6 address; use the plain IPv4 form", field, a.IP)
	case a.IP.Zone() != "":
		p.addf("%s.address.ip %s: zoned (link-local) IPv6 addresses are not supported", field, a.IP)
	case a.IP.IsUnspecified():
		p.addf("%s.address.ip %s: must be a concrete address, not the unspecified one", field, a.IP)
	case a.IP.IsMulticast():
		p.addf("%s.address.ip %s: must not be multicast", field, a.IP)
	}
	if a.Port < 1 || a.Port > MaxPort {
		p.addf("%s.address.port %d: must be in 1..%d", field, a.Port, MaxPort)
	}
}

func validateMinor(p *problems, field string, minor int) {
	if minor < 0 || minor > MaxMinor {
		p.addf("%s %d: must be in 0..%d", field, minor, MaxMinor)
	}
}

func validateOptions(p *problems, o Options, f Features) {
	if !o.Resource.Quorum.Valid() {
		p.addf("options.quorum %d: must be off, majority, all or 1..%d", int32(o.Resource.Quorum), MaxQuorumCount)
	}
	if !o.Resource.QuorumMinimumRedundancy.Valid() {
		p.addf("options.quorumMinimumRedundancy %d: must be off, majority, all or 1..%d",
			int32(o.Resource.QuorumMinimumRedundancy), MaxQuorumCount)
	}
	switch o.Resource.OnNoQuorum {
	case OnNoQuorumIOError, OnNoQuorumSuspendIO:
	default:
		p.addf("options.onNoQuorum %q: must be %q or %q", o.Resource.OnNoQuorum, OnNoQuorumIOError, OnNoQuorumSuspendIO)
	}
	switch o.Resource.OnNoDataAccessible {
	case OnNoDataAccessibleIOError, OnNoDataAccessibleSuspendIO:
	default:
		p.addf("options.onNoDataAccessible %q: must be %q or %q",
			o.Resource.OnNoDataAccessible, OnNoDataAccessibleIOError, OnNoDataAccessibleSuspendIO)
	}
	switch o.Net.Protocol {
	case ProtocolC:
	case ProtocolA, ProtocolB:
		p.addf("net.protocol %q: meshvol acknowledges a write only once it is on every connected replica's disk, which needs protocol C", o.Net.Protocol)
	default:
		p.addf("net.protocol %q: must be C", o.Net.Protocol)
	}
	if (o.Net.SharedSecret == "") != (o.Net.CramHMACAlg == "") {
		p.addf("net.sharedSecret/net.cramHMACAlg: set both or neither (peer authentication needs an algorithm and a secret)")
	}
	if n := len(o.Net.SharedSecret); n > MaxSharedSecretLen {
		p.addf("net.sharedSecret: is %d bytes, longer than %d", n, MaxSharedSecretLen)
	}
	for i := 0; i < len(o.Net.SharedSecret); i++ {
		if c := o.Net.SharedSecret[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			p.addf("net.sharedSecret: byte at offset %d is not printable ASCII without space, '\"' or '\\'", i)
			break
		}
	}
	for _, a := range []struct{ field, alg, example string }{
		{"net.cramHMACAlg", o.Net.CramHMACAlg, "sha256"},
		{"net.verifyAlg", o.Net.VerifyAlg, "crc32c"},
	} {
		if a.alg != "" && !kernelHashName(a.alg) {
			p.addf("%s %q: must be a kernel hash name such as %s (lowercase letters, digits, '-', '(', ')'; at most 63 bytes)", a.field, a.alg, a.example)
		}
	}
	if g := o.Disk.RsDiscardGranularity; g < 0 || g > 1<<20 || (g != 0 && g%512 != 0) {
		p.addf("disk.rsDiscardGranularity %d: must be 0 or a multiple of 512 up to 1048576 bytes", g)
	}
	if t := o.Net.PingTimeout; t < 1 || t > 300 {
		p.addf("net.pingTimeout %d: must be 1..300 tenths of a second (drbdsetup 9.22's range)", t)
	}
	if r := o.Disk.CMaxRate; r < 0 || r > 4<<20 {
		p.addf("disk.cMaxRate %d: must be 0..4194304 KiB/s (drbdsetup 9.22's range; 0 is no limit)", r)
	}
	if o.Disk.NonVoting && !f.NonVoting {
		p.addf("disk.nonVoting: the installed DRBD does not support non-voting (upstream 9.2 has no such option)")
	}
}

// kernelHashName: what the kernel's crypto API accepts as an algorithm
// name (CRYPTO_MAX_ALG_NAME is 64 with the NUL).
func kernelHashName(alg string) bool {
	return len(alg) <= 63 && strings.IndexFunc(alg, func(c rune) bool {
		return (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' && c != '(' && c != ')'
	}) < 0
}

func family(ip netip.Addr) string {
	switch {
	case !ip.IsValid():
		return ""
	case ip.Is4():
		return "ipv4"
	default:
		return "ipv6"
	}
}
