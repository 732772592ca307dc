package drbdsim

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
	"github.com/meshvol/meshvol/pkg/drbd/contract"
)

// parseEndpoint reads back an address as drbdsetup prints it: events2 path
// lines separate the family with a colon ("ipv6:[fd00::1]:7000"), show
// with a space ("ipv6 [fd00::1]:7000"). pkg/drbd's parsers hand these
// strings through verbatim (PathState.Local/Peer, ShowPath.ThisHost/
// RemoteHost); this is the last step to a netip.AddrPort, and it insists
// that the family prefix matches the address.
func parseEndpoint(s, sep string) (netip.AddrPort, error) {
	fam, rest, ok := strings.Cut(s, sep)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q: no family prefix before %q", s, sep)
	}
	ap, err := netip.ParseAddrPort(rest)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: %w", s, err)
	}
	if want := map[bool]string{true: "ipv4", false: "ipv6"}[ap.Addr().Is4()]; fam != want {
		return netip.AddrPort{}, fmt.Errorf("%q: family %q for an %s address", s, fam, want)
	}
	return ap, nil
}

func addrPort(a drbd.Address) netip.AddrPort { return netip.AddrPortFrom(a.IP, uint16(a.Port)) }

// The expected strings are what glibc's inet_ntop (Debian bookworm, glibc
// 2.36, the captures' distribution), which drbd-utils' address_str()
// calls, printed for these addresses: RFC 5952 compression, except that an
// IPv4-compatible address keeps its last 32 bits dotted.
func TestEndpointMatchesDrbdsetup(t *testing.T) {
	for _, tc := range []struct {
		ip, events2, show string
	}{
		{"10.99.0.1", "ipv4:10.99.0.1:7000", "ipv4 10.99.0.1:7000"},
		{"fd00::1", "ipv6:[fd00::1]:7000", "ipv6 [fd00::1]:7000"},
		{"FD00:0:0:0:0:0:0:ABCD", "ipv6:[fd00::abcd]:7000", "ipv6 [fd00::abcd]:7000"},
		{"2001:db8:0:1:0:0:0:1", "ipv6:[2001:db8:0:1::1]:7000", "ipv6 [2001:db8:0:1::1]:7000"},
		{"2001:db8:0:0:1:0:0:1", "ipv6:[2001:db8::1:0:0:1]:7000", "ipv6 [2001:db8::1:0:0:1]:7000"},
		{"1:0:2:0:3:0:4:5", "ipv6:[1:0:2:0:3:0:4:5]:7000", "ipv6 [1:0:2:0:3:0:4:5]:7000"},
		{"::1", "ipv6:[::1]:7000", "ipv6 [::1]:7000"},
		{"::1.2.3.4", "ipv6:[::1.2.3.4]:7000", "ipv6 [::1.2.3.4]:7000"},
		{"::0.1.2.3", "ipv6:[::0.1.2.3]:7000", "ipv6 [::0.1.2.3]:7000"},
		{"::0.0.1.2", "ipv6:[::102]:7000", "ipv6 [::102]:7000"},
		{"64:ff9b::1.2.3.4", "ipv6:[64:ff9b::102:304]:7000", "ipv6 [64:ff9b::102:304]:7000"},
	} {
		a := drbd.Address{IP: netip.MustParseAddr(tc.ip), Port: 7000}
		if got := a.EventsString(); got != tc.events2 {
			t.Errorf("EventsString(%s) = %q, want %q", tc.ip, got, tc.events2)
		}
		if got := a.ShowString(); got != tc.show {
			t.Errorf("ShowString(%s) = %q, want %q", tc.ip, got, tc.show)
		}
		for _, f := range []struct{ s, sep string }{{tc.events2, ":"}, {tc.show, " "}} {
			if ap, err := parseEndpoint(f.s, f.sep); err != nil || ap != addrPort(a) {
				t.Errorf("%q parses to %v, %v; want %v", f.s, ap, err, addrPort(a))
			}
		}
	}
}

// v6Pair is a two-node resource r0 on IPv6 addresses (different ports, so
// that a swapped port shows), as node sees it.
func v6Pair(node, backing string) *drbd.Resource {
	hosts := []drbd.Host{
		{Name: "node1", NodeID: 0, Address: drbd.Address{IP: netip.MustParseAddr("fd00::1"), Port: 7000}},
		{Name: "node2", NodeID: 1, Address: drbd.Address{IP: netip.MustParseAddr("fd00::2"), Port: 7001}},
	}
	r := &drbd.Resource{Name: "r0", Minor: 0, Options: drbd.Resolve(drbd.DefaultOptions(), drbd.OptionSet{}),
		Disk: &drbd.Disk{BackingDevice: backing, MetaDisk: drbd.MetaDiskInternal}}
	for _, h := range hosts {
		if h.Name == node {
			r.Self = h
		} else {
			r.Peers = append(r.Peers, drbd.Peer{Name: h.Name, NodeID: h.NodeID, Address: h.Address})
		}
	}
	return r
}

// A two-node IPv6 cluster connects; its events2 path lines and its show
// JSON carry the ipv6 family and the bracketed addresses in drbdsetup's
// form; pkg/drbd's event parser, Observer and show parser hand them on
// intact, so each reads back to the configured address and port; and show
// prints the address exactly as the rendered drbd.conf spells it.
func TestIPv6PairPathsRoundTrip(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	backing := contract.SparseBackingFiles(t, dir)
	c := NewCluster(Options{Dir: dir, Seed: 1})
	nodes := []string{"node1", "node2"}
	// How drbdsetup prints each node's address in events2 and in show.
	printed := map[string]struct{ events2, show string }{
		"node1": {"ipv6:[fd00::1]:7000", "ipv6 [fd00::1]:7000"},
		"node2": {"ipv6:[fd00::2]:7001", "ipv6 [fd00::2]:7001"},
	}
	res := map[string]*drbd.Resource{}
	obs := map[string]*drbd.Observer{}
	octx, cancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	// Stop the Observers before the test ends: OnError must not log into
	// a finished test.
	defer running.Wait()
	defer cancel()
	for _, n := range nodes {
		res[n] = v6Pair(n, backing(n))
		must(t, c.Node(n).WriteConfig(ctx, res[n]))
		must(t, c.Node(n).CreateMetadata(ctx, "r0", 1))
		// The Observer runs from before up, so the paths reach it through
		// create and change lines, not only an exists dump.
		o := drbd.NewObserver(c.Node(n).Events, drbd.ObserverOptions{
			Backoff: func(int) time.Duration { return time.Millisecond },
			OnError: func(err error) { t.Errorf("%s observer: %v", n, err) },
		})
		obs[n] = o
		go func() {
			for range o.Changes() {
			}
		}()
		running.Go(func() { _ = o.Run(octx) })
	}
	for _, n := range nodes {
		must(t, c.Node(n).Up(ctx, "r0"))
	}

	for _, n := range nodes {
		self, peer := res[n].Self, res[n].Peers[0]
		st, err := c.Node(n).Status(ctx, "r0")
		must(t, err)
		if cs := st[0].Connections[0].ConnectionState; cs != "Connected" {
			t.Fatalf("%s: connection to %s is %s, want Connected", n, peer.Name, cs)
		}

		// events2: the exact path line, and pkg/drbd's parser on it.
		dump, err := c.Node(n).EventsNow(ctx)
		must(t, err)
		wantLine := fmt.Sprintf("exists path name:r0 peer-node-id:%d conn-name:%s local:%s peer:%s established:yes",
			peer.NodeID, peer.Name, printed[n].events2, printed[peer.Name].events2)
		var pathLines []string
		for _, line := range strings.Split(dump, "\n") {
			if strings.HasPrefix(line, "exists path ") {
				pathLines = append(pathLines, line)
			}
		}
		if len(pathLines) != 1 || pathLines[0] != wantLine {
			t.Fatalf("%s path lines\n got %q\nwant %q", n, pathLines, wantLine)
		}
		ev, err := drbd.ParseEvent(pathLines[0])
		must(t, err)
		local, _ := ev.Get("local")
		remote, _ := ev.Get("peer")
		checkEndpoint(t, n+" events2 local", local, ":", self.Address)
		checkEndpoint(t, n+" events2 peer", remote, ":", peer.Address)

		// The Observer, fed by the stream, holds the same strings.
		var path drbd.PathState
		for range 2000 {
			if s, ok := obs[n].Snapshot("r0"); ok {
				if cn := s.Connections[peer.NodeID]; cn != nil {
					for _, p := range cn.Paths {
						path = p
					}
				}
			}
			if path.Established {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if !path.Established || path.Local != printed[n].events2 || path.Peer != printed[peer.Name].events2 {
			t.Fatalf("%s: observer's path %+v, want %s → %s established", n, path, printed[n].events2, printed[peer.Name].events2)
		}
		checkEndpoint(t, n+" observer local", path.Local, ":", self.Address)
		checkEndpoint(t, n+" observer peer", path.Peer, ":", peer.Address)

		// show --json: the raw text, then pkg/drbd's parser.
		raw, err := c.Node(n).ShowJSON(ctx, "r0")
		must(t, err)
		for _, want := range []string{
			`"_this_host": "` + printed[n].show + `"`,
			`"_remote_host": "` + printed[peer.Name].show + `"`,
		} {
			if !strings.Contains(string(raw), want) {
				t.Errorf("%s show --json lacks %s:\n%s", n, want, raw)
			}
		}
		sh, err := c.Node(n).Show(ctx, "r0")
		must(t, err)
		paths := sh[0].Connections[0].AllPaths()
		if len(paths) != 1 {
			t.Fatalf("%s show: %d paths, want 1", n, len(paths))
		}
		checkEndpoint(t, n+" show _this_host", paths[0].ThisHost, " ", self.Address)
		checkEndpoint(t, n+" show _remote_host", paths[0].RemoteHost, " ", peer.Address)

		// show reports what adjust converged to from the .res file, so its
		// address reads as the rendered "address" statement does.
		conf, err := drbd.Render(res[n], drbd.Features{})
		must(t, err)
		for _, h := range []string{paths[0].ThisHost, paths[0].RemoteHost} {
			if !strings.Contains(string(conf), "address "+h+";") {
				t.Errorf("%s: show's %q is not an address statement of the rendered config:\n%s", n, h, conf)
			}
		}
	}
}

// checkEndpoint reads printed back (parseEndpoint) and compares it with
// the configured address.
func checkEndpoint(t *testing.T, what, printed, sep string, want drbd.Address) {
	t.Helper()
	ap, err := parseEndpoint(printed, sep)
	if err != nil {
		t.Errorf("%s: %v", what, err)
	} else if ap != addrPort(want) {
		t.Errorf("%s: %q reads as %v, want %v", what, printed, ap, addrPort(want))
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
