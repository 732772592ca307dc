package drbd

import (
	"net/netip"
	"strconv"
	"strings"
)

// EventsString is the address as drbdsetup prints it in an events2 path
// line. drbd-utils' address_str() writes "<family>:<ip>:<port>" and
// brackets an IPv6 address: "ipv4:10.99.0.1:7000", "ipv6:[fd00::1]:7000".
func (a Address) EventsString() string {
	port := strconv.Itoa(a.Port)
	if a.IP.Is4() {
		return "ipv4:" + a.IP.String() + ":" + port
	}
	return "ipv6:[" + inet6String(a.IP) + "]:" + port
}

// ShowString is the address as drbdsetup show prints a path end, in the
// text and the JSON form alike, and as drbd.conf writes it: EventsString
// with its first colon turned into a space ("ipv4 10.99.0.1:7000",
// "ipv6 [fd00::1]:7000"). The agent's read-back compares show's paths with
// it, drbdsim's show prints it, the renderer writes it.
func (a Address) ShowString() string {
	return strings.Replace(a.EventsString(), ":", " ", 1)
}

// inet6String formats an IPv6 address as glibc's inet_ntop, which
// address_str uses, does. That is netip's RFC 5952 form (lower case, the
// longest run of two or more zero groups as "::") except for the deprecated
// IPv4-compatible addresses: when the first six groups are zero and the
// seventh is not, inet_ntop prints the last 32 bits dotted ("::1.2.3.4",
// where netip says "::102:304"; "::1" and "::102" agree). IPv4-mapped and
// zoned addresses never get here: Resource.Validate refuses them.
func inet6String(ip netip.Addr) string {
	b := ip.As16()
	if [12]byte(b[:12]) == [12]byte{} && (b[12] != 0 || b[13] != 0) {
		return "::" + netip.AddrFrom4([4]byte(b[12:])).String()
	}
	return ip.String()
}
