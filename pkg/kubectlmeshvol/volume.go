// Package kubectlmeshvol is the logic of the kubectl plugin `kubectl meshvol`: it
// reads meshvol's objects (RV, RVR, RVA, the agents' Leases) and core objects (PVC,
// PV, Node), turns them into views (VolumeView, NodeView), and renders those views as
// a tree, a table, YAML or JSON. Building and rendering a view are pure functions of
// the objects and the time, so they are tested on real objects without a cluster;
// fetch.go is the only part that talks to an apiserver.
package kubectlmeshvol

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// VolumeView is one volume as `kubectl meshvol status` shows it.
type VolumeView struct {
	Name string `json:"name"`
	// PVC is "<namespace>/<name>" of the claim bound to the volume, when one is.
	PVC      string `json:"pvc,omitempty"`
	Phase    string `json:"phase"`
	Size     string `json:"size"`
	Revision int64  `json:"datameshRevision"`
	// Configured and Effective are the protection asked for and the protection the
	// datamesh provides now (docs/datamesh.md); Degraded says Effective is less.
	Configured *Protection `json:"configured,omitempty"`
	Effective  *Protection `json:"effective,omitempty"`
	// UpToDateDiskful counts the Diskful members that are UpToDate with a live
	// agent: the copies the volume has now, of the configured layout's
	// WantDiskful. The effective layout changes only with membership, so a lost
	// node shows here first.
	UpToDateDiskful int `json:"upToDateDiskful"`
	WantDiskful     int `json:"wantDiskful"`
	// Degraded: the effective protection is below the configured one, or fewer
	// copies are UpToDate than the configured layout has.
	Degraded    bool             `json:"degraded"`
	Quorum      int32            `json:"quorum"`
	QMR         int32            `json:"quorumMinimumRedundancy"`
	Members     []MemberView     `json:"members"`
	Transitions []TransitionView `json:"transitions,omitempty"`
	Requests    []RequestView    `json:"requests,omitempty"`
	// Conditions are the volume's conditions that are not True: why it is not Ready.
	Conditions []ConditionView `json:"conditions,omitempty"`
}

// Protection is a layout: failures to tolerate and guaranteed data redundancy, with
// the replica set they need (e.g. "2D+1TB").
type Protection struct {
	FTT    int32  `json:"failuresToTolerate"`
	GMDR   int32  `json:"guaranteedMinimumDataRedundancy"`
	Layout string `json:"layout"`
}

func (p *Protection) String() string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%s (FTT=%d GMDR=%d)", p.Layout, p.FTT, p.GMDR)
}

func protection(ftt, gmdr int32) *Protection {
	return &Protection{FTT: ftt, GMDR: gmdr, Layout: layout.Layout{FTT: int(ftt), GMDR: int(gmdr)}.String()}
}

// MemberView is one replica of the volume: a datamesh member, or a replica that
// is not (or no longer) one.
type MemberView struct {
	Name string `json:"name"`
	Node string `json:"node"`
	Zone string `json:"zone,omitempty"`
	// Type is the datamesh member type (D, D∅, TB, ... spelled out), or
	// "-" for a replica outside the datamesh; Wants is its replica type then.
	Type     string `json:"type"`
	Wants    string `json:"wants,omitempty"`
	Attached bool   `json:"attached,omitempty"`
	// Agent is the node agent's liveness from its Lease: Live, Expired (within
	// the grace period nothing is decided yet) or Lost.
	Agent string `json:"agent"`
	// Stale: the agent is not Live, so disk, role, quorum and sync are its last
	// report, not the node's state now.
	Stale       bool   `json:"stale,omitempty"`
	Disk        string `json:"disk"`
	Role        string `json:"role"`
	Sync        string `json:"sync"`
	Quorum      string `json:"quorum"`
	IOSuspended bool   `json:"ioSuspended,omitempty"`
	// Revision is the datamesh revision DRBD runs on the node; Current says it is
	// the volume's.
	Revision int64      `json:"datameshRevision"`
	Current  bool       `json:"current"`
	Peers    []PeerView `json:"peers,omitempty"`
}

// PeerView is a member's DRBD connection to one peer.
type PeerView struct {
	Name        string `json:"name"`
	Connection  string `json:"connection"`
	Replication string `json:"replication,omitempty"`
	PeerDisk    string `json:"peerDisk,omitempty"`
}

// TransitionView is a transition in flight with its steps.
type TransitionView struct {
	Type    string     `json:"type"`
	Replica string     `json:"replica,omitempty"`
	From    string     `json:"from,omitempty"`
	To      string     `json:"to,omitempty"`
	Plan    string     `json:"plan"`
	Steps   []StepView `json:"steps"`
}

// StepView is one step; Age is how long an active step has been waiting.
type StepView struct {
	Name     string `json:"name"`
	Status   string `json:"status"`
	Revision int64  `json:"datameshRevision,omitempty"`
	Age      string `json:"age,omitempty"`
	Message  string `json:"message,omitempty"`
}

// RequestView is a membership change a replica asks for and why it waits.
type RequestView struct {
	Replica   string `json:"replica"`
	Operation string `json:"operation"`
	Type      string `json:"type,omitempty"`
	Message   string `json:"message,omitempty"`
}

// ConditionView is a condition that is not True.
type ConditionView struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// VolumeObjects are the objects a VolumeView is built from.
type VolumeObjects struct {
	RV       *v1.ReplicatedVolume
	Replicas []v1.ReplicatedVolumeReplica
	// Leases are the agents' Leases by node name.
	Leases map[string]*coordinationv1.Lease
	// PVC is "<namespace>/<name>" of the bound claim, "" when none is known.
	PVC string
}

// BuildVolume is the view of one volume at time now.
func BuildVolume(o VolumeObjects, now time.Time) VolumeView {
	rv := o.RV
	st := &rv.Status
	v := VolumeView{
		Name: rv.Name, PVC: o.PVC, Phase: string(st.Phase), Size: rv.Spec.Size.String(),
		Revision: st.DatameshRevision, Quorum: st.Datamesh.Quorum, QMR: st.Datamesh.QuorumMinimumRedundancy,
	}
	if v.Phase == "" {
		v.Phase = "-"
	}
	if c := st.Configuration; c != nil {
		v.Configured = protection(c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy)
	}
	if e := st.EffectiveLayout; e != nil {
		v.Effective = protection(e.FailuresToTolerate, e.GuaranteedMinimumDataRedundancy)
	}
	v.Members = members(o, now)
	for _, m := range v.Members {
		if m.Type == string(v1.MemberTypeDiskful) && m.Disk == string(v1.DiskStateUpToDate) && m.Agent == "Live" {
			v.UpToDateDiskful++
		}
	}
	if v.Configured != nil {
		v.WantDiskful = int(v.Configured.FTT + v.Configured.GMDR + 1)
		v.Degraded = v.Effective == nil || v.Effective.FTT < v.Configured.FTT || v.Effective.GMDR < v.Configured.GMDR ||
			v.UpToDateDiskful < v.WantDiskful
	}
	for _, t := range st.DatameshTransitions {
		v.Transitions = append(v.Transitions, transition(t, now))
	}
	for _, r := range st.DatameshReplicaRequests {
		v.Requests = append(v.Requests, RequestView{Replica: r.Name, Operation: string(r.Operation), Type: string(r.Type), Message: r.Message})
	}
	for _, c := range st.Conditions {
		if c.Status != metav1.ConditionTrue {
			v.Conditions = append(v.Conditions, ConditionView{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message})
		}
	}
	return v
}

// members lists the datamesh members in node-id order, then the replicas outside it
// by name.
func members(o VolumeObjects, now time.Time) []MemberView {
	byName := map[string]*v1.ReplicatedVolumeReplica{}
	for i := range o.Replicas {
		byName[o.Replicas[i].Name] = &o.Replicas[i]
	}
	dm := slices.Clone(o.RV.Status.Datamesh.Members)
	sort.Slice(dm, func(i, j int) bool { return dm[i].NodeID < dm[j].NodeID })
	var out []MemberView
	seen := map[string]bool{}
	for _, m := range dm {
		seen[m.Name] = true
		mv := MemberView{Name: m.Name, Node: m.NodeName, Zone: m.Zone, Type: string(m.Type), Attached: m.Attached}
		fillReplica(&mv, byName[m.Name], o, now)
		out = append(out, mv)
	}
	var rest []string
	for name := range byName {
		if !seen[name] {
			rest = append(rest, name)
		}
	}
	sort.Strings(rest)
	for _, name := range rest {
		r := byName[name]
		mv := MemberView{Name: name, Node: r.Spec.NodeName, Type: "-", Wants: string(r.Spec.Type)}
		if mv.Node == "" {
			mv.Node = "(unplaced)"
		}
		fillReplica(&mv, r, o, now)
		out = append(out, mv)
	}
	return out
}

// fillReplica adds what the replica's agent reports, and its agent's liveness.
func fillReplica(mv *MemberView, r *v1.ReplicatedVolumeReplica, o VolumeObjects, now time.Time) {
	mv.Agent = agentLiveness(o.Leases[mv.Node], now)
	mv.Disk, mv.Role, mv.Sync, mv.Quorum = "-", "-", "-", "-"
	if r == nil {
		return
	}
	st := &r.Status
	mv.Stale = mv.Agent != "Live"
	if st.DiskState != "" {
		mv.Disk = string(st.DiskState)
	}
	if st.Role != "" {
		mv.Role = string(st.Role)
	}
	if st.Quorum != nil {
		mv.Quorum = strconv.FormatBool(*st.Quorum)
	}
	mv.IOSuspended = st.IOSuspended
	mv.Revision = st.DatameshRevision
	mv.Current = st.DatameshRevision > 0 && st.DatameshRevision >= o.RV.Status.DatameshRevision
	mv.Sync = syncOf(st)
	for _, p := range st.Peers {
		mv.Peers = append(mv.Peers, PeerView{Name: p.Name, Connection: p.ConnectionState, Replication: p.ReplicationState, PeerDisk: string(p.PeerDiskState)})
	}
}

// syncOf is how far the replica's own disk is in sync: 100% when UpToDate, the
// least progress of the resyncs toward it while it syncs, "-" without a disk or a
// report.
func syncOf(st *v1.ReplicatedVolumeReplicaStatus) string {
	switch st.DiskState {
	case v1.DiskStateUpToDate:
		return "100%"
	case "", v1.DiskStateDiskless, v1.DiskStateUnknown:
		return "-"
	}
	least := int32(-1)
	for _, p := range st.Peers {
		if p.Resync != nil && (least < 0 || p.Resync.PercentDone < least) {
			least = p.Resync.PercentDone
		}
	}
	if least < 0 {
		return "0%"
	}
	return strconv.Itoa(int(least)) + "%"
}

// agentLiveness reads a node's agent Lease the way the controller does, with no
// grace period: Live while the Lease is valid, Lost after it expired.
func agentLiveness(l *coordinationv1.Lease, now time.Time) string {
	if l == nil {
		return "NoLease"
	}
	if agentlease.Judge(l, now, 0).Live {
		return "Live"
	}
	return "Lost"
}

func transition(t v1.DatameshTransition, now time.Time) TransitionView {
	tv := TransitionView{Type: string(t.Type), Replica: t.ReplicaName, From: string(t.FromType), To: string(t.ToType),
		Plan: t.PlanID + "/v" + strconv.Itoa(int(t.PlanVersion))}
	for _, s := range t.Steps {
		sv := StepView{Name: s.Name, Status: string(s.Status), Revision: s.DatameshRevision, Message: s.Message}
		if s.Status == v1.StepActive && s.StartedAt != nil {
			sv.Age = now.Sub(s.StartedAt.Time).Round(time.Second).String()
		}
		tv.Steps = append(tv.Steps, sv)
	}
	return tv
}

// summary is a one-line count of members by type, e.g. "2 Diskful, 1 TieBreaker".
func (v VolumeView) summary() string {
	n := map[string]int{}
	var types []string
	for _, m := range v.Members {
		if m.Type == "-" {
			continue
		}
		if n[m.Type] == 0 {
			types = append(types, m.Type)
		}
		n[m.Type]++
	}
	parts := make([]string, 0, len(types))
	for _, t := range types {
		parts = append(parts, strconv.Itoa(n[t])+" "+t)
	}
	return strings.Join(parts, ", ")
}
