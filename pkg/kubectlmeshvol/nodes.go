package kubectlmeshvol

import (
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// NodeView is one node as `kubectl meshvol nodes` shows it.
type NodeView struct {
	Name string `json:"name"`
	Zone string `json:"zone,omitempty"`
	// Agent is the agent's liveness from its Lease (Live, Lost, NoLease), and
	// AgentMessage what the Lease says about it.
	Agent        string `json:"agent"`
	AgentMessage string `json:"agentMessage,omitempty"`
	AgentVersion string `json:"agentVersion,omitempty"`
	// Capabilities are what the agent announces it understands of the controller
	// (storage.meshvol.io/capabilities, valid only beside the version that wrote it):
	// during a rolling upgrade, which nodes hold a newer behaviour back
	// (docs/install.md, "Upgrading").
	Capabilities []string `json:"capabilities,omitempty"`
	// Cordoned: placement puts no new replicas here (the meshvol cordon label or
	// the Node's spec.unschedulable).
	Cordoned bool `json:"cordoned,omitempty"`
	// Prerequisites are the node checks that failed, as the agent reports them.
	Prerequisites string     `json:"prerequisites,omitempty"`
	Pools         []PoolView `json:"pools,omitempty"`
	// Replicas counts the replicas on the node by datamesh member type; a replica
	// outside the datamesh counts as "-<replica type>" (e.g. "-Diskful": placed,
	// not joined yet).
	Replicas map[string]int `json:"replicas"`
	// Attached are the volumes attached (DRBD Primary allowed) on the node.
	Attached []string `json:"attached,omitempty"`
}

// PoolView is one storage pool's capacity on a node, as the agent reports it.
type PoolView struct {
	Name       string `json:"name"`
	TotalBytes int64  `json:"totalBytes"`
	FreeBytes  int64  `json:"freeBytes"`
}

// NodeObjects are the objects the nodes view is built from.
type NodeObjects struct {
	Nodes    []corev1.Node
	Leases   []coordinationv1.Lease
	Volumes  []v1.ReplicatedVolume
	Replicas []v1.ReplicatedVolumeReplica
}

// BuildNodes is the view of every node that has a Node object, an agent Lease or
// a replica, sorted by name.
func BuildNodes(o NodeObjects, now time.Time) []NodeView {
	views := map[string]*NodeView{}
	get := func(name string) *NodeView {
		if views[name] == nil {
			views[name] = &NodeView{Name: name, Agent: "NoLease", Replicas: map[string]int{}}
		}
		return views[name]
	}
	for _, n := range o.Nodes {
		nv := get(n.Name)
		nv.Zone = n.Labels[v1.LabelZone]
		nv.Cordoned = n.Spec.Unschedulable || (n.Labels[v1.LabelCordon] != "" && n.Labels[v1.LabelCordon] != "false")
	}
	for i := range o.Leases {
		l := &o.Leases[i]
		name := agentlease.NodeName(l)
		if name == "" {
			continue
		}
		nv := get(name)
		fillLease(nv, l, now)
	}
	memberType := map[string]string{}
	for _, rv := range o.Volumes {
		for _, m := range rv.Status.Datamesh.Members {
			memberType[m.Name] = string(m.Type)
			if m.Attached {
				nv := get(m.NodeName)
				nv.Attached = append(nv.Attached, rv.Name)
			}
		}
	}
	for _, r := range o.Replicas {
		if r.Spec.NodeName == "" {
			continue
		}
		t, ok := memberType[r.Name]
		if !ok {
			t = "-" + string(r.Spec.Type)
		}
		get(r.Spec.NodeName).Replicas[t]++
	}
	out := make([]NodeView, 0, len(views))
	for _, nv := range views {
		sort.Strings(nv.Attached)
		out = append(out, *nv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// fillLease reads the agent's liveness and the facts it publishes on its Lease
// (pkg/apis/storage/v1alpha1/wellknown.go).
func fillLease(nv *NodeView, l *coordinationv1.Lease, now time.Time) {
	lv := agentlease.Judge(l, now, 0)
	nv.Agent, nv.AgentMessage = "Lost", lv.Message
	if lv.Live {
		nv.Agent = "Live"
	}
	if z := l.Annotations[v1.AnnotationZone]; z != "" && nv.Zone == "" {
		nv.Zone = z
	}
	nv.AgentVersion = l.Annotations[v1.AnnotationAgentVersion]
	nv.Capabilities = agentlease.Capabilities(l)
	nv.Prerequisites = l.Annotations[v1.AnnotationPrerequisites]
	for k, val := range l.Annotations {
		pool, ok := strings.CutPrefix(k, v1.AnnotationPoolCapacityPrefix)
		if !ok {
			continue
		}
		c, err := v1.ParsePoolCapacity(val)
		if err != nil {
			// A value this plugin cannot read is shown, not guessed at.
			nv.Pools = append(nv.Pools, PoolView{Name: pool + "(unreadable)", TotalBytes: -1, FreeBytes: -1})
			continue
		}
		nv.Pools = append(nv.Pools, PoolView{Name: pool, TotalBytes: c.Total, FreeBytes: c.Free})
	}
	sort.Slice(nv.Pools, func(i, j int) bool { return nv.Pools[i].Name < nv.Pools[j].Name })
}
