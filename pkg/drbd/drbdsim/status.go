package drbdsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// Status is `drbdsetup status --json --verbose --statistics`: the bytes are
// produced in drbdsetup's exact layout (StatusJSON) and parsed back with
// pkg/drbd's parser, so both drivers are read the same way.
func (n *Node) Status(ctx context.Context, name string) ([]drbd.StatusResource, error) {
	b, err := n.StatusJSON(ctx, name)
	if err != nil {
		return nil, err
	}
	return drbd.ParseStatusJSON(b)
}

// StatusJSON is the raw output of `drbdsetup status --json --verbose
// --statistics [name]`.
func (n *Node) StatusJSON(ctx context.Context, name string) ([]byte, error) {
	if err := n.begin(ctx, "status", name); err != nil {
		return nil, err
	}
	defer n.c.mu.Unlock()
	rs, err := n.selected("status", name)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("[\n")
	for i, r := range rs {
		if i > 0 {
			b.WriteString(",\n")
		}
		n.c.statusJSON(&b, r)
	}
	b.WriteString("]\n\n") // drbd-utils 9.22 ends with an empty line (every capture does)
	return b.Bytes(), nil
}

func (n *Node) selected(cmd, name string) ([]*resource, error) {
	if name == "" || name == "all" {
		var out []*resource
		for _, rn := range sortedKeys(n.res) {
			out = append(out, n.res[rn])
		}
		return out, nil
	}
	r := n.res[name]
	if r == nil {
		return nil, cmdErr(drbd.ErrUnknownResource, []string{"drbdsetup", cmd, name}, 0, 10, name+": No such resource\n")
	}
	return []*resource{r}, nil
}

func jb(v bool) string { return strconv.FormatBool(v) }
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// statusJSON writes one resource the way drbd-utils 9.22 does (two-space
// indentation, "} ]" closing arrays, the stray space after
// connection-state), see testdata/*status-json*.json.
func (c *Cluster) statusJSON(b *bytes.Buffer, r *resource) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("{\n")
	p("  \"name\": %s,\n", js(r.name))
	p("  \"node-id\": %d,\n", r.nodeID())
	p("  \"role\": %s,\n", js(r.role))
	p("  \"suspended\": %s,\n", jb(r.suspendedQuorum || r.suspendedUser))
	p("  \"suspended-user\": %s,\n", jb(r.suspendedUser))
	p("  \"suspended-no-data\": false,\n")
	p("  \"suspended-fencing\": false,\n")
	p("  \"suspended-quorum\": %s,\n", jb(r.suspendedQuorum))
	p("  \"force-io-failures\": %s,\n", jb(r.forceIOFailures))
	p("  \"write-ordering\": %s,\n", js(r.writeOrdering()))
	p("  \"devices\": [\n")
	p("    {\n")
	p("      \"volume\": 0,\n")
	p("      \"minor\": %d,\n", r.cfg.Minor)
	p("      \"disk-state\": %s,\n", js(string(r.disk)))
	p("      \"client\": %s,\n", jb(r.cfg.Disk == nil))
	p("      \"quorum\": %s,\n", jb(r.quorate))
	p("      \"size\": %d,\n", c.sizeKiB(r))
	p("      \"read\": %d,\n", r.read)
	p("      \"written\": %d,\n", r.written)
	p("      \"al-writes\": %d,\n", r.alWrites)
	p("      \"bm-writes\": %d,\n", r.bmWrites)
	p("      \"upper-pending\": 0,\n")
	p("      \"lower-pending\": 0\n")
	p("    } ],\n")
	conns := r.sortedConns()
	if len(conns) == 0 {
		p("  \"connections\": [ ]\n")
	} else {
		p("  \"connections\": [\n")
	}
	size := c.sizeKiB(r)
	for i, k := range conns {
		if i > 0 {
			p(",\n")
		}
		p("    {\n")
		p("      \"peer-node-id\": %d,\n", k.peer.NodeID)
		p("      \"name\": %s,\n", js(k.peer.Name))
		p("      \"connection-state\": %s, \n", js(k.cstate))
		p("      \"congested\": false,\n")
		p("      \"peer-role\": %s,\n", js(k.peerRole))
		p("      \"ap-in-flight\": 0,\n")
		p("      \"rs-in-flight\": 0,\n")
		p("      \"peer_devices\": [\n")
		p("        {\n")
		p("          \"volume\": 0,\n")
		p("          \"replication-state\": %s,\n", js(k.repl))
		p("          \"peer-disk-state\": %s,\n", js(string(k.peerDisk)))
		p("          \"peer-client\": %s,\n", jb(k.peer.Diskless))
		p("          \"resync-suspended\": \"no\",\n")
		p("          \"received\": %d,\n", k.received)
		p("          \"sent\": %d,\n", k.sent)
		oos := r.outOfSyncKiB(k)
		p("          \"out-of-sync\": %d,\n", oos)
		p("          \"pending\": 0,\n")
		p("          \"unacked\": 0,\n")
		syncing := k.repl == replSyncSource || k.repl == replSyncTarget
		p("          \"has-sync-details\": %s,\n", jb(syncing))
		p("          \"has-online-verify-details\": false,\n")
		inSync := 100.0
		if size > 0 {
			inSync = 100 * float64(size-oos) / float64(size)
		}
		if !syncing {
			p("          \"percent-in-sync\": %.2f\n", inSync)
		} else {
			p("          \"percent-in-sync\": %.2f,\n", inSync)
			c.syncDetails(b, k, oos, inSync)
		}
		p("        } ]\n")
		p("    }")
	}
	if len(conns) > 0 {
		p(" ]\n")
	}
	p("}\n")
}

// syncDetails are the rs-* figures of a running resync (capture 02).
func (c *Cluster) syncDetails(b *bytes.Buffer, k *conn, oosKiB int64, inSync float64) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	totalSectors := k.rsTotal * blockSize / 512
	doneSectors := totalSectors - oosKiB*2
	if doneSectors < 0 {
		doneSectors = 0
	}
	elapsed := c.now.Sub(k.rsStarted)
	ms := elapsed.Milliseconds()
	rate := 0.0
	if elapsed > 0 {
		rate = float64(doneSectors*512) / (1 << 20) / elapsed.Seconds()
	}
	left := int64(0)
	if c.opts.ResyncRate > 0 {
		left = oosKiB * 1024 / c.opts.ResyncRate
	}
	done := 100.0
	if totalSectors > 0 {
		done = 100 * float64(doneSectors) / float64(totalSectors)
	}
	p("          \"rs-total\": %d,\n", totalSectors)
	p("          \"rs-dt-start-ms\": %d,\n", ms)
	p("          \"rs-paused-ms\": 0,\n")
	p("          \"rs-dt0-ms\": %d,\n", ms)
	p("          \"rs-db0-sectors\": %d,\n", doneSectors)
	p("          \"rs-dt1-ms\": %d,\n", ms)
	p("          \"rs-db1-sectors\": %d,\n", doneSectors)
	p("          \"rs-failed\": 0,\n")
	p("          \"rs-same-csum\": 0,\n")
	p("          \"want\": %.2f,\n", float64(c.opts.ResyncRate)/(1<<20))
	p("          \"db0/dt0 [MiB/s]\": %.2f,\n", rate)
	p("          \"db1/dt1 [MiB/s]\": %.2f,\n", rate)
	p("          \"estimated-seconds-to-finish\": %d,\n", left)
	p("          \"db/dt [MiB/s]\": %.2f,\n", rate)
	p("          \"percent-resync-done\": %.2f\n", done)
	_ = inSync
	_ = time.Second
}

// Show is `drbdsetup show --json`, produced in its layout and parsed back.
func (n *Node) Show(ctx context.Context, name string) ([]drbd.ShowResource, error) {
	b, err := n.ShowJSON(ctx, name)
	if err != nil {
		return nil, err
	}
	return drbd.ParseShowJSON(b)
}

// ordered is a JSON object that keeps its keys in insertion order.
type ordered []kvAny

type kvAny struct {
	k string
	v any
}

func (o ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("{")
	for i, f := range o {
		if i > 0 {
			b.WriteString(",")
		}
		k, _ := json.Marshal(f.k)
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteString(":")
		b.Write(v)
	}
	b.WriteString("}")
	return b.Bytes(), nil
}

// ShowJSON is the raw output of `drbdsetup show --json [name]`: the running
// configuration, options only where they differ from DRBD's defaults.
func (n *Node) ShowJSON(ctx context.Context, name string) ([]byte, error) {
	if err := n.begin(ctx, "show", name); err != nil {
		return nil, err
	}
	defer n.c.mu.Unlock()
	rs, err := n.selected("show", name)
	if err != nil {
		return nil, err
	}
	var list []any
	for _, r := range rs {
		list = append(list, showResource(r))
	}
	if list == nil {
		list = []any{}
	}
	out, err := json.MarshalIndent(list, "", "    ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

func showResource(r *resource) ordered {
	o := r.cfg.Options
	var opts ordered
	if o.Resource.Quorum != drbd.QuorumOff {
		opts = append(opts, kvAny{"quorum", o.Resource.Quorum.String()})
	}
	if o.Resource.QuorumMinimumRedundancy != drbd.QuorumOff {
		opts = append(opts, kvAny{"quorum-minimum-redundancy", o.Resource.QuorumMinimumRedundancy.String()})
	}
	if o.Resource.OnNoQuorum != "" && o.Resource.OnNoQuorum != drbd.OnNoQuorumSuspendIO {
		opts = append(opts, kvAny{"on-no-quorum", string(o.Resource.OnNoQuorum)})
	}
	if o.Resource.OnNoDataAccessible != "" && o.Resource.OnNoDataAccessible != drbd.OnNoDataAccessibleIOError {
		opts = append(opts, kvAny{"on-no-data-accessible", string(o.Resource.OnNoDataAccessible)})
	}
	if !o.Resource.AutoPromote {
		opts = append(opts, kvAny{"auto-promote", false})
	}
	vol := ordered{{"volume_nr", 0}, {"device_minor", r.cfg.Minor}}
	if r.cfg.Disk != nil {
		vol = append(vol, kvAny{"backing-disk", r.cfg.Disk.BackingDevice}, kvAny{"meta-disk", r.cfg.Disk.MetaDisk})
		if o.Disk.NonVoting {
			vol = append(vol, kvAny{"disk", ordered{{"non-voting", true}}})
		}
	} else {
		vol = append(vol, kvAny{"disk", "none"})
	}
	res := ordered{{"resource", r.name}}
	if len(opts) > 0 {
		res = append(res, kvAny{"options", opts})
	}
	res = append(res, kvAny{"_this_host", ordered{{"node-id", r.nodeID()}, {"volumes", []any{vol}}}})
	var conns []any
	for _, k := range r.sortedConns() {
		net := ordered{{"_name", k.peer.Name}}
		if o.Net.Protocol != "" && o.Net.Protocol != drbd.ProtocolC {
			net = append(net, kvAny{"protocol", string(o.Net.Protocol)})
		}
		if o.Net.AllowTwoPrimaries {
			net = append(net, kvAny{"allow-two-primaries", true})
		}
		if o.Net.CramHMACAlg != "" {
			net = append(net, kvAny{"cram-hmac-alg", o.Net.CramHMACAlg})
		}
		if o.Net.SharedSecret != "" {
			net = append(net, kvAny{"shared-secret", o.Net.SharedSecret})
		}
		if o.Net.VerifyAlg != "" {
			net = append(net, kvAny{"verify-alg", o.Net.VerifyAlg})
		}
		if !k.peer.EffectiveAllowRemoteRead(o) {
			net = append(net, kvAny{"allow-remote-read", false})
		}
		// Numbers as drbdsetup prints them: strings, with the option's
		// unit suffix where it has one (c-max-rate is in KiB: "k").
		if t := o.Net.PingTimeout; t != drbd.DefaultPingTimeout {
			net = append(net, kvAny{"ping-timeout", strconv.Itoa(int(t))})
		}
		co := ordered{{"path", ordered{{"_this_host", r.cfg.Self.Address.ShowString()}, {"_remote_host", k.peer.Address.ShowString()}}},
			{"net", net}}
		// Peer-device options, in drbdsetup's order: c-max-rate from this
		// node's disk section (on every connection), no bitmap slot for a
		// diskless peer.
		var pd ordered
		if rate := o.Disk.CMaxRate; r.cfg.Disk != nil && rate != drbd.DefaultCMaxRate {
			pd = append(pd, kvAny{"c-max-rate", strconv.Itoa(int(rate)) + "k"})
		}
		if k.peer.Diskless {
			pd = append(pd, kvAny{"bitmap", false})
		}
		if len(pd) > 0 {
			co = append(co, kvAny{"volumes", []any{ordered{{"volume_nr", 0}, {"disk", pd}}}})
		}
		co = append(co, kvAny{"_peer_node_id", k.peer.NodeID})
		conns = append(conns, co)
	}
	if len(conns) > 0 {
		res = append(res, kvAny{"connections", conns})
	}
	return res
}
