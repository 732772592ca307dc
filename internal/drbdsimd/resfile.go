package drbdsimd

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// parseRes reads a .res file as pkg/drbd's Render writes it back into the
// drbd.Resource it was rendered from, as drbdadm parses a configuration
// before it drives the kernel. It knows the renderer's sections only (the
// stand-in serves meshvol's agent, not hand-written files) and names the
// statement it does not know, so a renderer change that the simulation
// would silently ignore fails instead. The first "on" section is this
// node's (Render writes it first), the others are its peers.
func parseRes(text string) (*drbd.Resource, error) {
	toks, err := tokenize(text)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	stmts, err := p.block(false)
	if err != nil {
		return nil, err
	}
	var res *drbd.Resource
	for _, s := range stmts {
		switch s.key() {
		case "global":
			continue
		case "resource":
			if res != nil {
				return nil, fmt.Errorf("more than one resource section")
			}
			if len(s.words) != 2 || s.body == nil {
				return nil, fmt.Errorf("line %d: resource needs a name and a body", s.line)
			}
			if res, err = resource(s.words[1], s.body); err != nil {
				return nil, err
			}
		default:
			return nil, s.unknown()
		}
	}
	if res == nil {
		return nil, fmt.Errorf("no resource section")
	}
	return res, nil
}

// stmt is one statement: its words, and a body if it opens a block.
type stmt struct {
	words []string
	body  []stmt
	line  int
}

func (s stmt) key() string { return s.words[0] }

func (s stmt) unknown() error {
	return fmt.Errorf("line %d: %q is not a statement meshvol's renderer writes", s.line, strings.Join(s.words, " "))
}

// arg is the statement's only argument.
func (s stmt) arg() (string, error) {
	if len(s.words) != 2 || s.body != nil {
		return "", fmt.Errorf("line %d: %s takes one value", s.line, s.key())
	}
	return s.words[1], nil
}

type token struct {
	text   string
	quoted bool
	line   int
}

// tokenize splits drbd.conf text into words, quoted strings (Go-quoted, as
// Render writes them with %q), braces and semicolons; # starts a comment.
func tokenize(text string) ([]token, error) {
	var toks []token
	line := 1
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == '\n':
			line++
			i++
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '#':
			for i < len(text) && text[i] != '\n' {
				i++
			}
		case c == '{' || c == '}' || c == ';':
			toks = append(toks, token{text: string(c), line: line})
			i++
		case c == '"':
			j := i + 1
			for j < len(text) && text[j] != '"' {
				if text[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(text) {
				return nil, fmt.Errorf("line %d: unterminated string", line)
			}
			s, err := strconv.Unquote(text[i : j+1])
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			toks = append(toks, token{text: s, quoted: true, line: line})
			i = j + 1
		default:
			j := i
			for j < len(text) && !strings.ContainsRune(" \t\r\n{};#\"", rune(text[j])) {
				j++
			}
			toks = append(toks, token{text: text[i:j], line: line})
			i = j
		}
	}
	return toks, nil
}

type parser struct {
	toks []token
	pos  int
}

// block reads statements up to the closing brace (nested) or the end.
func (p *parser) block(nested bool) ([]stmt, error) {
	var out []stmt
	var cur stmt
	for p.pos < len(p.toks) {
		t := p.toks[p.pos]
		p.pos++
		switch {
		case !t.quoted && t.text == "}":
			if !nested {
				return nil, fmt.Errorf("line %d: unexpected }", t.line)
			}
			if len(cur.words) > 0 {
				return nil, fmt.Errorf("line %d: statement %q lacks its ;", t.line, strings.Join(cur.words, " "))
			}
			return out, nil
		case !t.quoted && t.text == ";":
			if len(cur.words) == 0 {
				return nil, fmt.Errorf("line %d: empty statement", t.line)
			}
			out, cur = append(out, cur), stmt{}
		case !t.quoted && t.text == "{":
			if len(cur.words) == 0 {
				return nil, fmt.Errorf("line %d: block without a name", t.line)
			}
			body, err := p.block(true)
			if err != nil {
				return nil, err
			}
			cur.body = body
			if cur.body == nil {
				cur.body = []stmt{}
			}
			out, cur = append(out, cur), stmt{}
		default:
			if len(cur.words) == 0 {
				cur.line = t.line
			}
			cur.words = append(cur.words, t.text)
		}
	}
	if nested {
		return nil, fmt.Errorf("missing }")
	}
	if len(cur.words) > 0 {
		return nil, fmt.Errorf("line %d: statement %q lacks its ;", cur.line, strings.Join(cur.words, " "))
	}
	return out, nil
}

func resource(name string, body []stmt) (*drbd.Resource, error) {
	r := &drbd.Resource{Name: name}
	var hosts []stmt
	var conns []stmt
	for _, s := range body {
		var err error
		switch s.key() {
		case "options":
			err = resourceOptions(&r.Options.Resource, s.body)
		case "net":
			err = netOptions(&r.Options.Net, s.body)
		case "on":
			hosts = append(hosts, s)
		case "connection":
			conns = append(conns, s)
		default:
			err = s.unknown()
		}
		if err != nil {
			return nil, fmt.Errorf("resource %s: %w", name, err)
		}
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("resource %s: no host section", name)
	}
	for i, h := range hosts {
		if len(h.words) != 2 {
			return nil, fmt.Errorf("resource %s: line %d: on needs a host name", name, h.line)
		}
		if err := host(r, h.words[1], h.body, i == 0); err != nil {
			return nil, fmt.Errorf("resource %s: on %s: %w", name, h.words[1], err)
		}
	}
	for _, c := range conns {
		if err := connection(r, c.body); err != nil {
			return nil, fmt.Errorf("resource %s: connection at line %d: %w", name, c.line, err)
		}
	}
	return r, nil
}

func yes(s stmt) (bool, error) {
	v, err := s.arg()
	if err != nil {
		return false, err
	}
	switch v {
	case "yes":
		return true, nil
	case "no":
		return false, nil
	}
	return false, fmt.Errorf("line %d: %s is yes or no, not %q", s.line, s.key(), v)
}

func integer(s stmt) (int32, error) {
	v, err := s.arg()
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("line %d: %s: %w", s.line, s.key(), err)
	}
	return int32(n), nil
}

func quorum(s stmt) (drbd.Quorum, error) {
	v, err := s.arg()
	if err != nil {
		return 0, err
	}
	return drbd.ParseQuorum(v)
}

func resourceOptions(o *drbd.ResourceOptions, body []stmt) error {
	for _, s := range body {
		var err error
		var v string
		switch s.key() {
		case "auto-promote":
			o.AutoPromote, err = yes(s)
		case "quorum":
			o.Quorum, err = quorum(s)
		case "quorum-minimum-redundancy":
			o.QuorumMinimumRedundancy, err = quorum(s)
		case "on-no-quorum":
			v, err = s.arg()
			o.OnNoQuorum = drbd.OnNoQuorum(v)
		case "on-no-data-accessible":
			v, err = s.arg()
			o.OnNoDataAccessible = drbd.OnNoDataAccessible(v)
		default:
			err = s.unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func netOptions(o *drbd.NetOptions, body []stmt) error {
	for _, s := range body {
		var err error
		var v string
		switch s.key() {
		case "protocol":
			v, err = s.arg()
			o.Protocol = drbd.Protocol(v)
		case "allow-two-primaries":
			o.AllowTwoPrimaries, err = yes(s)
		case "cram-hmac-alg":
			o.CramHMACAlg, err = s.arg()
		case "shared-secret":
			o.SharedSecret, err = s.arg()
		case "verify-alg":
			o.VerifyAlg, err = s.arg()
		case "ping-timeout":
			o.PingTimeout, err = integer(s)
		default:
			err = s.unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func diskOptions(o *drbd.DiskOptions, body []stmt) error {
	for _, s := range body {
		var err error
		switch s.key() {
		case "discard-zeroes-if-aligned":
			o.DiscardZeroesIfAligned, err = yes(s)
		case "rs-discard-granularity":
			o.RsDiscardGranularity, err = integer(s)
		case "non-voting":
			o.NonVoting, err = yes(s)
		case "c-max-rate":
			o.CMaxRate, err = integer(s)
		default:
			err = s.unknown()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// host reads an "on" section into r.Self (self) or a new peer.
func host(r *drbd.Resource, name string, body []stmt, self bool) error {
	var nodeID int32
	var minor int32
	var disk, metaDisk string
	haveID, haveMinor := false, false
	var err error
	for _, s := range body {
		switch s.key() {
		case "node-id":
			nodeID, err = integer(s)
			haveID = true
		case "volume":
			if len(s.words) != 2 || s.words[1] != strconv.Itoa(drbd.VolumeNumber) || s.body == nil {
				return fmt.Errorf("line %d: only volume %d is rendered", s.line, drbd.VolumeNumber)
			}
			for _, v := range s.body {
				switch v.key() {
				case "device":
					if len(v.words) != 3 || v.words[1] != "minor" {
						return fmt.Errorf("line %d: device minor N expected", v.line)
					}
					var n int64
					n, err = strconv.ParseInt(v.words[2], 10, 32)
					minor, haveMinor = int32(n), true
				case "disk":
					if v.body != nil {
						if !self {
							return fmt.Errorf("line %d: disk options in a peer's section", v.line)
						}
						err = diskOptions(&r.Options.Disk, v.body)
						break
					}
					disk, err = v.arg()
				case "meta-disk":
					metaDisk, err = v.arg()
				default:
					err = v.unknown()
				}
				if err != nil {
					return err
				}
			}
		default:
			err = s.unknown()
		}
		if err != nil {
			return err
		}
	}
	if !haveID || !haveMinor || disk == "" {
		return fmt.Errorf("node-id, device minor and disk are required")
	}
	if self {
		r.Self = drbd.Host{Name: name, NodeID: int(nodeID)}
		r.Minor = int(minor)
		if disk != "none" {
			r.Disk = &drbd.Disk{BackingDevice: disk, MetaDisk: metaDisk}
		}
		return nil
	}
	r.Peers = append(r.Peers, drbd.Peer{Name: name, NodeID: int(nodeID), Minor: int(minor), Diskless: disk == "none"})
	return nil
}

// connection reads a connection section: the path's two addresses (this
// node's and the peer's) and the connection's allow-remote-read.
func connection(r *drbd.Resource, body []stmt) error {
	var peer *drbd.Peer
	var remoteRead *bool
	for _, s := range body {
		switch s.key() {
		case "path":
			for _, h := range s.body {
				// host "name" address ipv4 10.0.0.1:7000
				if h.key() != "host" || len(h.words) != 5 || h.words[2] != "address" {
					return fmt.Errorf("line %d: host NAME address FAMILY IP:PORT expected", h.line)
				}
				ap, err := netip.ParseAddrPort(h.words[4])
				if err != nil {
					return fmt.Errorf("line %d: %w", h.line, err)
				}
				if fam := map[bool]string{true: "ipv4", false: "ipv6"}[ap.Addr().Is4()]; fam != h.words[3] {
					return fmt.Errorf("line %d: address family %s for %s", h.line, h.words[3], ap.Addr())
				}
				addr := drbd.Address{IP: ap.Addr(), Port: int(ap.Port())}
				if h.words[1] == r.Self.Name {
					r.Self.Address = addr
					continue
				}
				for i := range r.Peers {
					if r.Peers[i].Name == h.words[1] {
						peer = &r.Peers[i]
					}
				}
				if peer == nil {
					return fmt.Errorf("line %d: host %q has no on section", h.line, h.words[1])
				}
				peer.Address = addr
			}
		case "net":
			for _, n := range s.body {
				if n.key() != "allow-remote-read" {
					return n.unknown()
				}
				v, err := yes(n)
				if err != nil {
					return err
				}
				remoteRead = &v
			}
		default:
			return s.unknown()
		}
	}
	if peer == nil {
		return fmt.Errorf("no peer in its path")
	}
	peer.AllowRemoteRead = remoteRead
	return nil
}
