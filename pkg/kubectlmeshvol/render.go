package kubectlmeshvol

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Output is the -o flag: "" (the default tree or table), "wide", "yaml" or "json",
// after kubectl's conventions.
type Output string

const (
	OutputDefault Output = ""
	OutputWide    Output = "wide"
	OutputYAML    Output = "yaml"
	OutputJSON    Output = "json"
)

// ParseOutput checks an -o value.
func ParseOutput(s string) (Output, error) {
	switch o := Output(s); o {
	case OutputDefault, OutputWide, OutputYAML, OutputJSON:
		return o, nil
	}
	return "", fmt.Errorf("-o %q: must be one of wide, yaml, json (or empty)", s)
}

// encode writes v as YAML or JSON; ok is false for the text outputs.
func encode(w io.Writer, out Output, v any) (ok bool, err error) {
	switch out {
	case OutputJSON:
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return true, err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return true, err
	case OutputYAML:
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, err
		}
		_, err = w.Write(b)
		return true, err
	}
	return false, nil
}

// RenderVolume writes one volume: a header, its protection, the members as a tree
// (with their peers under -o wide), the transitions in flight with their steps, the
// replicas' requests, and the conditions that are not True.
func RenderVolume(w io.Writer, v VolumeView, out Output) error {
	if ok, err := encode(w, out, v); ok {
		return err
	}
	wide := out == OutputWide
	pvc := ""
	if v.PVC != "" {
		pvc = " (PVC " + v.PVC + ")"
	}
	fmt.Fprintf(w, "ReplicatedVolume %s%s\n", v.Name, pvc)
	fmt.Fprintf(w, "  Phase:      %s\n", v.Phase)
	fmt.Fprintf(w, "  Size:       %s\n", v.Size)
	deg := ""
	if v.Degraded {
		deg = "  DEGRADED"
	}
	fmt.Fprintf(w, "  Protection: configured %s, effective %s, %d/%d Diskful UpToDate%s\n", v.Configured, v.Effective, v.UpToDateDiskful, v.WantDiskful, deg)
	fmt.Fprintf(w, "  Datamesh:   revision %d, q=%d qmr=%d, %s\n", v.Revision, v.Quorum, v.QMR, v.summary())
	fmt.Fprintln(w, "Members:")
	renderMembers(w, v, wide)
	if len(v.Transitions) > 0 {
		fmt.Fprintln(w, "Transitions:")
		renderTransitions(w, v.Transitions)
	}
	if len(v.Requests) > 0 {
		fmt.Fprintln(w, "Requests:")
		for i, r := range v.Requests {
			typ := ""
			if r.Type != "" {
				typ = " " + r.Type
			}
			fmt.Fprintf(w, "%s%s %s%s: %s\n", branch(i, len(v.Requests)), r.Replica, r.Operation, typ, orDash(r.Message))
		}
	}
	if len(v.Conditions) > 0 {
		fmt.Fprintln(w, "Not True:")
		for i, c := range v.Conditions {
			fmt.Fprintf(w, "%s%s=%s %s: %s\n", branch(i, len(v.Conditions)), c.Type, c.Status, c.Reason, orDash(c.Message))
		}
	}
	return nil
}

func renderMembers(w io.Writer, v VolumeView, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "  NAME\tNODE\tTYPE\tAGENT\tDISK\tROLE\tSYNC\tQUORUM\tREVISION"
	if wide {
		head += "\tZONE\tIO\tPEERS"
	}
	fmt.Fprintln(tw, head)
	for i, m := range v.Members {
		typ := m.Type
		if m.Wants != "" {
			typ = "-(wants " + m.Wants + ")"
		}
		if m.Attached {
			typ += ",attached"
		}
		rev := strconv.FormatInt(m.Revision, 10)
		if !m.Current {
			rev += " (behind)"
		}
		agent := m.Agent
		if m.Stale {
			agent += " (stale report)"
		}
		row := fmt.Sprintf("%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", branch(i, len(v.Members)), m.Name, m.Node, typ, agent, m.Disk, m.Role, m.Sync, m.Quorum, rev)
		if wide {
			io := "running"
			if m.IOSuspended {
				io = "suspended"
			}
			row += "\t" + orDash(m.Zone) + "\t" + io + "\t" + peers(v.Name, m.Peers)
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
}

// peers is a member's connections, each as "<peer node>:<connection>/<replication>/<peer disk>";
// a peer replica's name is <volume>-<node> (v1alpha1.ReplicaName).
func peers(volume string, ps []PeerView) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		s := strings.TrimPrefix(p.Name, volume+"-") + ":" + p.Connection
		if p.Replication != "" {
			s += "/" + p.Replication
		}
		if p.PeerDisk != "" {
			s += "/" + p.PeerDisk
		}
		parts = append(parts, s)
	}
	return orDash(strings.Join(parts, " "))
}

func renderTransitions(w io.Writer, ts []TransitionView) {
	for i, t := range ts {
		subject := ""
		if t.Replica != "" {
			subject = " " + t.Replica
		}
		change := ""
		if t.From != "" || t.To != "" {
			change = " " + orDash(t.From) + " → " + orDash(t.To)
		}
		fmt.Fprintf(w, "%s%s%s%s (plan %s)\n", branch(i, len(ts)), t.Type, subject, change, t.Plan)
		stem := "│ "
		if i == len(ts)-1 {
			stem = "  "
		}
		for j, s := range t.Steps {
			line := fmt.Sprintf("%s%s[%s] %s", stem, branch(j, len(t.Steps)), s.Status, s.Name)
			if s.Revision > 0 {
				line += " (revision " + strconv.FormatInt(s.Revision, 10) + ")"
			}
			if s.Age != "" {
				line += " for " + s.Age
			}
			if s.Message != "" {
				line += ": " + s.Message
			}
			fmt.Fprintln(w, line)
		}
	}
}

// RenderNodes writes the nodes as a table: agent liveness, pool capacity (free of
// total, each pool), replicas by type and attached volumes; -o wide adds the zone,
// the agent's version and capabilities, and failed prerequisites.
func RenderNodes(w io.Writer, nodes []NodeView, out Output) error {
	if ok, err := encode(w, out, nodes); ok {
		return err
	}
	wide := out == OutputWide
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "NODE\tAGENT\tPOOLS (FREE/TOTAL)\tREPLICAS\tATTACHED"
	if wide {
		head += "\tZONE\tCORDONED\tVERSION\tCAPABILITIES\tPREREQUISITES"
	}
	fmt.Fprintln(tw, head)
	for _, n := range nodes {
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", n.Name, n.Agent, pools(n.Pools), replicas(n.Replicas), orDash(strings.Join(n.Attached, ",")))
		if wide {
			row += fmt.Sprintf("\t%s\t%t\t%s\t%s\t%s", orDash(n.Zone), n.Cordoned, orDash(n.AgentVersion),
				orDash(strings.Join(n.Capabilities, ",")), orDash(n.Prerequisites))
		}
		fmt.Fprintln(tw, row)
	}
	return tw.Flush()
}

func pools(ps []PoolView) string {
	parts := make([]string, 0, len(ps))
	for _, p := range ps {
		if p.TotalBytes < 0 {
			parts = append(parts, p.Name)
			continue
		}
		parts = append(parts, p.Name+" "+binaryBytes(p.FreeBytes)+"/"+binaryBytes(p.TotalBytes))
	}
	return orDash(strings.Join(parts, ", "))
}

// replicas is e.g. "2 Diskful, 1 TieBreaker", types in name order.
func replicas(n map[string]int) string {
	types := make([]string, 0, len(n))
	for t := range n {
		types = append(types, t)
	}
	sort.Strings(types)
	parts := make([]string, 0, len(types))
	for _, t := range types {
		parts = append(parts, strconv.Itoa(n[t])+" "+t)
	}
	return orDash(strings.Join(parts, ", "))
}

// binaryBytes is a byte count in binary units with one decimal, e.g. "9.8Gi".
func binaryBytes(b int64) string {
	const units = "KMGTPE"
	if b < 1024 {
		return strconv.FormatInt(b, 10)
	}
	f, u := float64(b)/1024, 0
	for f >= 1024 && u < len(units)-1 {
		f, u = f/1024, u+1
	}
	return strconv.FormatFloat(f, 'f', 1, 64) + units[u:u+1] + "i"
}

// branch is the tree prefix of item i of n.
func branch(i, n int) string {
	if i == n-1 {
		return "└─ "
	}
	return "├─ "
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
