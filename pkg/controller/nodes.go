package controller

import (
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Node facts come from two places: the Node object (labels, zone, cordon) and the agent's
// Lease (liveness, and the facts the agent reports on its annotations: addresses, zone,
// HMAC algorithms, per-pool capacity). docs/contract.md says why the Lease carries them.

// splitList reads a comma-separated annotation.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Cordoned reports whether placement must keep new replicas off the node: the meshvol
// cordon label (any value but "false") or a cordoned Node (spec.unschedulable, which
// `kubectl cordon` and `kubectl drain` set).
func Cordoned(n *corev1.Node) bool {
	if n == nil {
		return false
	}
	if v, ok := n.Labels[v1.LabelCordon]; ok && v != "false" {
		return true
	}
	return n.Spec.Unschedulable
}

// nodeZone is the node's zone: its topology label, else what its agent reports.
func nodeZone(n *corev1.Node, l *coordinationv1.Lease) string {
	if n != nil {
		if z := n.Labels[v1.LabelZone]; z != "" {
			return z
		}
	}
	if l != nil {
		return l.Annotations[v1.AnnotationZone]
	}
	return ""
}

// EligibleNodes computes a pool's status.eligibleNodes: the Nodes that match the pool's
// nodeSelector and zones (and, for LVM pools, are listed in volumeGroups), with their
// zone, readiness (the agent is live and reports the pool's capacity), cordon and
// capacity. Sorted by name (the status list is a map keyed by name; a stable order keeps
// a rewrite from being a change).
func EligibleNodes(rsp *v1.ReplicatedStoragePool, nodes []corev1.Node, leases map[string]*coordinationv1.Lease, now time.Time, grace time.Duration) ([]v1.EligibleNode, error) {
	var sel labels.Selector
	if rsp.Spec.NodeSelector != nil {
		var err error
		if sel, err = metav1.LabelSelectorAsSelector(rsp.Spec.NodeSelector); err != nil {
			return nil, fmt.Errorf("spec.nodeSelector: %w", err)
		}
	}
	var out []v1.EligibleNode
	for i := range nodes {
		n := &nodes[i]
		if sel != nil && !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		if rsp.Spec.Type != v1.PoolTypeFile && !slices.ContainsFunc(rsp.Spec.VolumeGroups, func(g v1.PoolVolumeGroup) bool { return g.NodeName == n.Name }) {
			continue
		}
		l := leases[n.Name]
		zone := nodeZone(n, l)
		if len(rsp.Spec.Zones) > 0 && !slices.Contains(rsp.Spec.Zones, zone) {
			continue
		}
		e := v1.EligibleNode{NodeName: n.Name, Zone: zone, Unschedulable: Cordoned(n)}
		live := agentlease.Judge(l, now, grace).Live
		if l != nil {
			if s, ok := l.Annotations[v1.AnnotationPoolCapacityPrefix+rsp.Name]; ok {
				if c, err := v1.ParsePoolCapacity(s); err == nil {
					e.TotalCapacity = resource.NewQuantity(c.Total, resource.BinarySI)
					e.FreeCapacity = resource.NewQuantity(c.Free, resource.BinarySI)
					// A node whose agent reports missing prerequisites (no DRBD 9.2
					// module, say) takes no replicas until it is fixed.
					e.Ready = live && l.Annotations[v1.AnnotationPrerequisites] == ""
				}
			}
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b v1.EligibleNode) int { return strings.Compare(a.NodeName, b.NodeName) })
	return out, nil
}

// EligibleChanged reports whether a pool's eligible nodes changed in a way a person or
// placement cares about: a node came or went, its zone, readiness or cordon changed, or
// its capacity moved by at least min(1 % of total, 1 GiB). Smaller capacity moves are
// not written: they would rewrite the pool's status on every replica created.
func EligibleChanged(old, cur []v1.EligibleNode) bool {
	if len(old) != len(cur) {
		return true
	}
	for i := range old {
		a, b := &old[i], &cur[i]
		if a.NodeName != b.NodeName || a.Zone != b.Zone || a.Ready != b.Ready || a.Unschedulable != b.Unschedulable {
			return true
		}
		if (a.TotalCapacity == nil) != (b.TotalCapacity == nil) || (a.FreeCapacity == nil) != (b.FreeCapacity == nil) {
			return true
		}
		if a.TotalCapacity == nil || a.FreeCapacity == nil {
			continue
		}
		if a.TotalCapacity.Value() != b.TotalCapacity.Value() {
			return true
		}
		threshold := min(b.TotalCapacity.Value()/100, int64(1)<<30)
		d := a.FreeCapacity.Value() - b.FreeCapacity.Value()
		if d < 0 {
			d = -d
		}
		if d >= threshold && d > 0 {
			return true
		}
	}
	return false
}
