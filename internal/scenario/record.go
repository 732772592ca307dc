package scenario

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/drbd"
)

// Record is one run of the scenario list on one backend.
type Record struct {
	Backend string
	Steps   []Step
	// Times are each scenario's wall time, in the order they ran.
	Times []Timing
	// Figures are what a scenario measured (time to published elsewhere,
	// bytes checked), one line each.
	Figures []string
}

// Timing is one scenario's wall time.
type Timing struct {
	Scenario string
	Took     time.Duration
}

// Step is what every replica looked like after one step of a scenario.
type Step struct {
	Name string
	Rows []Row
}

// Row is one replica after a step: what its RVR status says and what DRBD
// on its node runs (`drbdsetup status`), in the same words on both backends.
// A replica is known by its member type and rank in the volume (Member,
// "Diskful-1", "TieBreaker"), not by its node or its DRBD node-id: the two
// backends' controllers may place a layout on different nodes and hand out
// node-ids in a different order (the TieBreaker of 2D+1TB got #0 on one and
// #1 on the other), which paired unlike replicas. Members of one type rank
// attached first, then by node-id; a peer in the kernel's view is named the
// same way (memberLabels).
type Row struct {
	Volume, Member, Node string
	// RVR is the replica's status: type, role, disk state, quorum, revision.
	RVR string
	// Kernel is DRBD's status of the resource on the node: role, disk
	// state, quorum and each connection with the peer's disk.
	Kernel string
}

func (r Row) key() string { return r.Volume + " " + r.Member }

// snapshot records the step: every RVR of the volumes and DRBD's status of
// them on every node.
func snapshot(ctx context.Context, b Backend, name string, volumes []string, down map[string]bool) (Step, error) {
	st := Step{Name: name}
	rows := map[string]*Row{}
	row := func(vol, node string) *Row {
		k := vol + " " + node
		if rows[k] == nil {
			rows[k] = &Row{Volume: vol, Node: node, RVR: "-", Kernel: "-"}
		}
		return rows[k]
	}
	for _, vol := range volumes {
		rv := &v1.ReplicatedVolume{}
		var members []v1.DatameshMember
		if err := b.Client().Get(ctx, client.ObjectKey{Name: vol}, rv); err == nil {
			members = rv.Status.Datamesh.Members
		}
		ids, byID := memberLabels(members)
		row := func(vol, node string) *Row {
			r := row(vol, node)
			if r.Member == "" {
				r.Member = ids[node]
				if r.Member == "" {
					r.Member = node // not (or no longer) a member
				}
			}
			return r
		}
		var list v1.ReplicatedVolumeReplicaList
		if err := b.Client().List(ctx, &list, client.MatchingLabels{v1.LabelVolume: vol}); err != nil {
			return st, err
		}
		for _, x := range list.Items {
			row(vol, x.Spec.NodeName).RVR = rvrSummary(&x)
		}
		for _, node := range b.Nodes() {
			if down[node] {
				if rows[vol+" "+node] != nil {
					row(vol, node).Kernel = "node down"
				}
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			res, err := b.DRBD(node).Status(cctx, vol)
			cancel()
			if err != nil || len(res) == 0 {
				if rows[vol+" "+node] != nil {
					row(vol, node).Kernel = "not running"
				}
				continue
			}
			row(vol, node).Kernel = kernelSummary(res[0], byID)
		}
	}
	for _, r := range rows {
		if r.Member == "" {
			r.Member = r.Node
		}
		st.Rows = append(st.Rows, *r)
	}
	sort.Slice(st.Rows, func(i, j int) bool { return st.Rows[i].key() < st.Rows[j].key() })
	return st, nil
}

func rvrSummary(x *v1.ReplicatedVolumeReplica) string {
	q := "-"
	if x.Status.Quorum != nil {
		q = fmt.Sprint(*x.Status.Quorum)
	}
	return fmt.Sprintf("%s %s %s quorum:%s rev:%d", x.Spec.Type, orDash(string(x.Status.Role)), orDash(string(x.Status.DiskState)), q, x.Status.DatameshRevision)
}

// memberLabels names each member by type and rank (Row): by node, and by DRBD
// node-id for the peers in the kernel's view.
func memberLabels(members []v1.DatameshMember) (byNode map[string]string, byID map[int]string) {
	ms := slices.Clone(members)
	sort.SliceStable(ms, func(i, j int) bool {
		if ms[i].Type != ms[j].Type {
			return ms[i].Type < ms[j].Type
		}
		if ms[i].Attached != ms[j].Attached {
			return ms[i].Attached
		}
		return ms[i].NodeID < ms[j].NodeID
	})
	count := map[v1.MemberType]int{}
	for _, m := range ms {
		count[m.Type]++
	}
	byNode, byID = map[string]string{}, map[int]string{}
	rank := map[v1.MemberType]int{}
	for _, m := range ms {
		rank[m.Type]++
		label := string(m.Type)
		if count[m.Type] > 1 {
			label = fmt.Sprintf("%s-%d", m.Type, rank[m.Type])
		}
		byNode[m.NodeName], byID[int(m.NodeID)] = label, label
	}
	return byNode, byID
}

// kernelSummary is DRBD's status of the resource, each peer named by its
// member label (byID; "#<node-id>" for one that is not a member).
func kernelSummary(r drbd.StatusResource, byID map[int]string) string {
	var b strings.Builder
	b.WriteString(r.Role)
	if len(r.Devices) > 0 {
		d := r.Devices[0]
		fmt.Fprintf(&b, " %s quorum:%v", d.DiskState, d.Quorum)
	}
	if r.Suspended {
		b.WriteString(" suspended")
	}
	var peers []string
	for _, c := range r.Connections {
		name := byID[c.PeerNodeID]
		if name == "" {
			name = fmt.Sprintf("#%d", c.PeerNodeID)
		}
		p := name + ":" + c.ConnectionState
		if len(c.PeerDevices) > 0 {
			p += "/" + c.PeerDevices[0].PeerDiskState
		}
		peers = append(peers, p)
	}
	sort.Strings(peers)
	for _, p := range peers {
		b.WriteString(" " + p)
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Print writes the record step by step.
func (r *Record) Print(w io.Writer) {
	fmt.Fprintf(w, "=== scenario run on %s\n", r.Backend)
	for _, s := range r.Steps {
		fmt.Fprintf(w, "--- %s\n", s.Name)
		for _, row := range s.Rows {
			fmt.Fprintf(w, "    %-19s %-12s %-7s rvr: %-50s drbd: %s\n", row.Volume, row.Member, row.Node, row.RVR, row.Kernel)
		}
	}
	for _, t := range r.Times {
		fmt.Fprintf(w, "time %-40s %s\n", t.Scenario, t.Took.Round(100*time.Millisecond))
	}
	for _, f := range r.Figures {
		fmt.Fprintf(w, "figure %s\n", f)
	}
}

// Compare lists every difference between two runs, step by step: a step one
// run has and the other lacks, and each replica whose RVR status or DRBD
// status differs.
func Compare(a, b *Record) []string {
	var out []string
	bs := map[string]Step{}
	for _, s := range b.Steps {
		bs[s.Name] = s
	}
	seen := map[string]bool{}
	for _, sa := range a.Steps {
		seen[sa.Name] = true
		sb, ok := bs[sa.Name]
		if !ok {
			out = append(out, fmt.Sprintf("%s: only on %s", sa.Name, a.Backend))
			continue
		}
		ra, rb := map[string]Row{}, map[string]Row{}
		var keys []string
		for _, r := range sa.Rows {
			ra[r.key()] = r
			keys = append(keys, r.key())
		}
		for _, r := range sb.Rows {
			rb[r.key()] = r
			if _, ok := ra[r.key()]; !ok {
				keys = append(keys, r.key())
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			x, y := ra[k], rb[k]
			if x.RVR != y.RVR {
				out = append(out, fmt.Sprintf("%s: %s rvr: %s %q, %s %q", sa.Name, k, a.Backend, x.RVR, b.Backend, y.RVR))
			}
			if x.Kernel != y.Kernel {
				out = append(out, fmt.Sprintf("%s: %s drbd: %s %q, %s %q", sa.Name, k, a.Backend, x.Kernel, b.Backend, y.Kernel))
			}
		}
	}
	for _, sb := range b.Steps {
		if !seen[sb.Name] {
			out = append(out, fmt.Sprintf("%s: only on %s", sb.Name, b.Backend))
		}
	}
	return out
}
