package controller_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
)

// The node lifecycle's promises (docs/controller.md, "Node lifecycle"), checked as invariants over
// what anyone can read from the apiserver — the Leases, the replicas' reports, the
// volume's status and the Nodes — after every step, not as the lines of code that
// keep them today. A change to the controller that breaks one fails here whichever
// line it touches:
//
//   - lost means unreached: no ForceLeave request, no ForceDetach or ForceRemoveReplica
//     transition and no out-of-service taint for a node to whose replica a replica on a
//     node with a valid Lease reports a Connected connection (the node runs; forcing
//     would move an attachment while the old Primary still writes);
//   - lost means past the grace period: none of those, and no AgentReady=False, for a
//     node whose Lease expired less than the grace period ago (a network blip or a quick
//     reboot must not force anything that nothing re-checks).

// forcedAgainst lists what the controller has done to treat node as lost: ForceLeave
// requests and force transitions naming its replicas, AgentReady=False on them, the
// out-of-service taint on the Node.
func (cl *cluster) forcedAgainst(rv *v1.ReplicatedVolume, node string, withAgentReady bool) []string {
	onNode := map[string]bool{}
	var out []string
	for _, r := range cl.rvrs(rv.Name) {
		if r.Spec.NodeName != node {
			continue
		}
		onNode[r.Name] = true
		if c := meta.FindStatusCondition(r.Status.Conditions, v1.ConditionAgentReady); withAgentReady && c != nil && c.Status == metav1.ConditionFalse {
			out = append(out, fmt.Sprintf("AgentReady=False on %s (%s)", r.Name, c.Reason))
		}
	}
	for _, q := range rv.Status.DatameshReplicaRequests {
		if onNode[q.Name] && q.Operation == v1.ReplicaOperationForceLeave {
			out = append(out, "ForceLeave request for "+q.Name)
		}
	}
	for _, t := range rv.Status.DatameshTransitions {
		if onNode[t.ReplicaName] && (t.Type == v1.TransitionForceDetach || t.Type == v1.TransitionForceRemoveReplica) {
			out = append(out, fmt.Sprintf("%s transition of %s", t.Type, t.ReplicaName))
		}
	}
	n := &corev1.Node{}
	must(cl.t, cl.c.Get(cl.ctx, types.NamespacedName{Name: node}, n))
	if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == controller.TaintOutOfService.Key }) {
		out = append(out, "out-of-service taint on "+node)
	}
	return out
}

// lease reads node's agent Lease and says until when it is valid and until when it is
// within the grace period, from the Lease's own fields.
func (cl *cluster) lease(node string) (valid, grace time.Time) {
	l := &coordinationv1.Lease{}
	must(cl.t, cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: v1.AgentLeasePrefix + node}, l))
	valid = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	return valid, valid.Add(cl.grace)
}

// reachedByLive lists the replicas on live nodes (valid Lease) that report a Connected
// connection to a replica on node.
func (cl *cluster) reachedByLive(rv, node string) []string {
	rvrs := cl.rvrs(rv)
	onNode := map[string]bool{}
	for _, r := range rvrs {
		if r.Spec.NodeName == node {
			onNode[r.Name] = true
		}
	}
	var out []string
	for _, r := range rvrs {
		if r.Spec.NodeName == node {
			continue
		}
		if valid, _ := cl.lease(r.Spec.NodeName); time.Now().After(valid) {
			continue
		}
		for _, p := range r.Status.Peers {
			if onNode[p.Name] && p.ConnectionState == "Connected" {
				out = append(out, r.Name+" → "+p.Name)
			}
		}
	}
	return out
}

// attachedOn forms a 3D volume over nodes a, b, c (d is the spare) and attaches it on
// node c; it returns the volume and the name of c's replica.
func (cl *cluster) attachedOn(node string) (*v1.ReplicatedVolume, string) {
	cl.t.Helper()
	class := cl.class("3d", 1, 1, v1.TopologyIgnored)
	rv := cl.volume("vol", class, "5Gi")
	cur := cl.formed(rv.Name, 3)
	victim := ""
	for _, m := range cur.Status.Datamesh.Members {
		if m.NodeName == cl.node(node) {
			victim = m.Name
		}
	}
	if victim == "" {
		cl.t.Fatalf("no member on node %s: %+v", node, cur.Status.Datamesh.Members)
	}
	rva := &v1.ReplicatedVolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: rv.Name + "-" + cl.node(node)},
		Spec: v1.ReplicatedVolumeAttachmentSpec{ReplicatedVolumeName: rv.Name, NodeName: cl.node(node)}}
	must(cl.t, cl.c.Create(cl.ctx, rva))
	cl.eventually(cl.t, "attached on "+node, func() (bool, string) {
		cur = cl.rv(rv.Name)
		cl.agentConfirm(rv.Name, cur.Status.DatameshRevision, nil)
		return slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == victim && m.Attached }) &&
			len(cur.Status.DatameshTransitions) == 0, phaseOf(cur)
	})
	return cur, victim
}

// reportAllBut has every replica but those on dead report the current revision, the
// dead node's replica Connected (reach) or Connecting (!reach); the dead node's replica
// keeps the revision it last confirmed, its agent being gone.
func (cl *cluster) reportAllBut(rv, dead, victim string, reach bool) {
	frozen := map[string]int64{}
	for _, r := range cl.rvrs(rv) {
		frozen[r.Name] = r.Status.DatameshRevision
	}
	cur := cl.rv(rv)
	cl.agentConfirm(rv, cur.Status.DatameshRevision, func(r *v1.ReplicatedVolumeReplica, st map[string]any) {
		if r.Spec.NodeName == dead {
			st["datameshRevision"] = frozen[r.Name]
			return
		}
		if reach {
			return
		}
		var peers []any
		for _, p := range st["peers"].([]any) {
			if p.(map[string]any)["name"] == victim {
				p = map[string]any{"name": victim, "connectionState": "Connecting"}
			}
			peers = append(peers, p)
		}
		st["peers"] = peers
	})
}

// A node whose agent stops renewing its Lease but whose replica its peers still reach
// (its DRBD runs: only the agent, or its link to the control plane, is gone) is never
// treated as lost — no ForceLeave, ForceDetach, force removal or out-of-service taint,
// however long it lasts; once no live peer reaches it, it is (so the check above is not
// vacuous: the Lease alone would have condemned it).
func TestNoForceWhileAPeerReaches(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{taint: true}, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100}, nodeSpec{"d", "", 10})
	rv, victim := cl.attachedOn("c")
	dead := cl.node("c")
	cl.setRenew("c", false)

	_, lostAt := cl.lease(dead)
	sawExpired := false
	for end := lostAt.Add(3 * (cl.grace + 2*time.Second)); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		cl.reportAllBut(rv.Name, dead, victim, true)
		cur := cl.rv(rv.Name)
		reached := cl.reachedByLive(rv.Name, dead)
		if len(reached) == 0 {
			t.Fatalf("setup: no live peer reports a connection to %s", victim)
		}
		if bad := cl.forcedAgainst(cur, dead, false); len(bad) > 0 {
			t.Fatalf("%s is reached by live peers (%s) yet treated as lost: %s", dead, strings.Join(reached, ", "), strings.Join(bad, "; "))
		}
		if r := cl.rvrByName(rv.Name, victim); r != nil {
			c := meta.FindStatusCondition(r.Status.Conditions, v1.ConditionAgentReady)
			sawExpired = sawExpired || c != nil && c.Status == metav1.ConditionFalse
		}
	}
	if !sawExpired {
		t.Fatalf("the Lease of %s never counted as expired: the check above proved nothing", dead)
	}

	// No live peer reaches it any more: now it is lost, force-detached and left.
	cl.eventually(t, "force-left and tainted once unreached", func() (bool, string) {
		cl.reportAllBut(rv.Name, dead, victim, false)
		cl.agentReleaseDeleted(rv.Name)
		bad := cl.forcedAgainst(cl.rv(rv.Name), dead, false)
		left := !slices.ContainsFunc(cl.rv(rv.Name).Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == victim })
		tainted := slices.ContainsFunc(bad, func(s string) bool { return strings.HasPrefix(s, "out-of-service") })
		return left && tainted, fmt.Sprintf("member left %v, %v", left, bad)
	})
}

// A node whose Lease has expired but is still inside the grace period is not lost, even
// when no peer reaches it (a reboot, a blip): no AgentReady=False, ForceLeave,
// ForceDetach, force removal or taint until the grace period ends; after it, all follow.
func TestGracePeriodIsNotLost(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{taint: true}, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100}, nodeSpec{"d", "", 10})
	cl.stop()
	cl.grace = 6 * time.Second
	cl.start()
	rv, victim := cl.attachedOn("c")
	dead := cl.node("c")
	cl.setRenew("c", false)
	time.Sleep(600 * time.Millisecond) // the last renewal in flight lands
	valid, lostAt := cl.lease(dead)

	// Each check writes every live replica's status and reads the volume back: on a
	// loaded machine one takes most of a second, so what makes the check mean
	// something is its spread over the grace period, not how many fit in it.
	checked := 0
	var first, last time.Time
	for time.Now().Before(lostAt.Add(-200 * time.Millisecond)) {
		cl.reportAllBut(rv.Name, dead, victim, false)
		cur := cl.rv(rv.Name)
		if v, g := cl.lease(dead); v != valid {
			t.Fatalf("the Lease of %s was renewed (valid until %s, then %s, grace until %s)", dead, valid, v, g)
		}
		if time.Now().Before(lostAt.Add(-200 * time.Millisecond)) { // the read above is older than now
			if bad := cl.forcedAgainst(cur, dead, true); len(bad) > 0 {
				t.Fatalf("%s's Lease expired at %s, its grace period ends at %s, yet at %s it is treated as lost: %s",
					dead, valid.Format(time.StampMilli), lostAt.Format(time.StampMilli), time.Now().Format(time.StampMilli), strings.Join(bad, "; "))
			}
			if now := time.Now(); now.After(valid) {
				checked++
				if first.IsZero() {
					first = now
				}
				last = now
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if window := lostAt.Sub(valid); checked < 3 || last.Sub(first) < window/2 {
		t.Fatalf("%d checks between the Lease's expiry and the end of its grace period, over %s of its %s: too few to prove it",
			checked, last.Sub(first).Round(time.Millisecond), window)
	}
	cl.eventually(t, "lost after the grace period", func() (bool, string) {
		cl.reportAllBut(rv.Name, dead, victim, false)
		bad := cl.forcedAgainst(cl.rv(rv.Name), dead, true)
		return slices.ContainsFunc(bad, func(s string) bool { return strings.HasPrefix(s, "ForceLeave") }) &&
			slices.ContainsFunc(bad, func(s string) bool { return strings.HasPrefix(s, "AgentReady=False") }), fmt.Sprint(bad)
	})
}

func (cl *cluster) rvrByName(rv, name string) *v1.ReplicatedVolumeReplica {
	for _, r := range cl.rvrs(rv) {
		if r.Name == name {
			return &r
		}
	}
	return nil
}
