package controller_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/controller"
	"github.com/meshvol/meshvol/pkg/sharedsecret"
)

type eventList []corev1.Event

func (cl *cluster) events(name string) eventList {
	var list corev1.EventList
	must(cl.t, cl.c.List(cl.ctx, &list, client.MatchingFields{"involvedObject.name": name}))
	return list.Items
}

func (l eventList) has(reason, substr string) bool {
	return slices.ContainsFunc(l, func(e corev1.Event) bool { return e.Reason == reason && strings.Contains(e.Message, substr) })
}

func (l eventList) String() string {
	var s []string
	for _, e := range l {
		s = append(s, e.Reason+": "+e.Message)
	}
	return strings.Join(s, "\n")
}

// formed drives a volume through formation as agents would and waits for Ready.
func (cl *cluster) formed(rv string, replicas int) *v1.ReplicatedVolume {
	cl.t.Helper()
	cl.eventually(cl.t, "replicas placed", func() (bool, string) { return len(cl.rvrs(rv)) == replicas, "" })
	var cur *v1.ReplicatedVolume
	cl.eventually(cl.t, rv+" Ready", func() (bool, string) {
		cur = cl.rv(rv)
		cl.agentConfirm(rv, cur.Status.DatameshRevision, nil)
		return cur.Status.Phase == v1.VolumePhaseReady, phaseOf(cur)
	})
	return cur
}

// A controller restarted in the middle of formation resumes from the status: the
// volume keeps its minor, a formed volume's members keep their ports, and volumes
// created after the restart never get a minor the first holds, or a port a member on
// the same node holds, even with many volumes racing. Ports are unique per node only:
// with more volumes than ports in --port-range, members on different nodes share one.
func TestRestartMidFormation(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{portMax: 7005}, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100})
	class := cl.class("2d", 0, 1, v1.TopologyIgnored)
	held := cl.volume("held", class, "1Gi")
	heldBefore := cl.formed(held.Name, 2).Status.Datamesh
	first := cl.volume("first", class, "1Gi")
	cl.eventually(t, "first allocated and placed", func() (bool, string) {
		cur := cl.rv(first.Name)
		return cur.Status.Datamesh.SharedSecret != nil && len(cl.rvrs(first.Name)) == 2, phaseOf(cur)
	})
	before := cl.rv(first.Name).Status.Datamesh
	replicasBefore := cl.rvrs(first.Name)

	cl.stop()
	// Meanwhile the agents report addresses: formation will publish under the new one.
	for _, r := range replicasBefore {
		cl.agentStatus(r.Name, map[string]any{"addresses": []any{"10.0.0.7"}})
	}
	var names []string
	for i := range 6 {
		names = append(names, cl.volume(fmt.Sprintf("after%d", i), class, "1Gi").Name)
	}
	cl.start()

	cl.eventually(t, "first formed by the new controller", func() (bool, string) {
		cur := cl.rv(first.Name)
		return len(cur.Status.Datamesh.Members) == 2, phaseOf(cur)
	})
	after := cl.rv(first.Name).Status.Datamesh
	if after.Minor != before.Minor || after.SharedSecret.SecretName != before.SharedSecret.SecretName {
		t.Fatalf("first was allocated again: before minor %d, after minor %d", before.Minor, after.Minor)
	}
	if got := cl.rvrs(first.Name); len(got) != 2 || got[0].UID != replicasBefore[0].UID || got[1].UID != replicasBefore[1].UID {
		t.Fatalf("first's replicas were replaced across the restart")
	}
	// 8 volumes of 2 replicas on 3 nodes hold 16 ports, with 6 in the range: only
	// ports unique per node let every one form.
	minors := map[int32]string{}
	ports := map[string]string{} // node/port → member
	for _, n := range append(names, first.Name, held.Name) {
		cur := cl.formed(n, 2)
		dm := cur.Status.Datamesh
		if o, dup := minors[dm.Minor]; dup {
			t.Errorf("%s and %s share minor %d", n, o, dm.Minor)
		}
		minors[dm.Minor] = n
		for _, m := range dm.Members {
			if m.Port < 7000 || m.Port > 7005 {
				t.Errorf("%s: member %s has port %d, want one of its own in 7000-7005", n, m.Name, m.Port)
			}
			k := fmt.Sprintf("%s/%d", m.NodeName, m.Port)
			if o, dup := ports[k]; dup {
				t.Errorf("members %s and %s share port %d on node %s", m.Name, o, m.Port, m.NodeName)
			}
			ports[k] = m.Name
		}
	}
	heldAfter := cl.rv(held.Name).Status.Datamesh
	for i, m := range heldBefore.Members {
		if heldAfter.Members[i].Name != m.Name || heldAfter.Members[i].Port != m.Port {
			t.Errorf("held's member %s had port %d before the restart, %s has %d after", m.Name, m.Port, heldAfter.Members[i].Name, heldAfter.Members[i].Port)
		}
	}
}

// A node whose Lease expires past the grace period: its replica is marked
// AgentReady=False by the controller's own condition, and once no live peer reports a
// connection to it, it is force-removed and a replacement is placed.
//
// With --taint-lost-nodes the lost node is tainted out-of-service, and untainted once it
// is back and holds nothing stale.
func TestNodeLost(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{taint: true}, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100}, nodeSpec{"d", "", 10})
	class := cl.class("3d", 1, 1, v1.TopologyIgnored)
	rv := cl.volume("vol", class, "5Gi")
	cur := cl.formed(rv.Name, 3)
	var lost string
	for _, m := range cur.Status.Datamesh.Members {
		if m.NodeName == cl.node("c") {
			lost = m.Name
		}
	}
	if lost == "" {
		t.Fatalf("no member on node c: %+v", cur.Status.Datamesh.Members)
	}

	// Node c dies; its peers, still connected for a moment, then lose it.
	cl.setRenew("c", false)
	cl.eventually(t, "AgentReady=False on "+lost, func() (bool, string) {
		r := &v1.ReplicatedVolumeReplica{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: lost}, r))
		c := meta.FindStatusCondition(r.Status.Conditions, v1.ConditionAgentReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonAgentLeaseExpired, cond(r.Status.Conditions, v1.ConditionAgentReady)
	})
	// The managed fields show the condition is the controller's alone.
	r := &v1.ReplicatedVolumeReplica{}
	must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: lost}, r))
	for _, mf := range r.ManagedFields {
		if mf.Subresource == "status" && mf.Manager == v1.FieldManagerAgent && strings.Contains(string(mf.FieldsV1.Raw), `"k:{\"type\":\"AgentReady\"}"`) {
			t.Errorf("the agent's field manager owns AgentReady: %s", mf.FieldsV1.Raw)
		}
	}
	cl.eventually(t, "force-removed and replaced on d", func() (bool, string) {
		cur = cl.rv(rv.Name)
		cl.agentConfirm(rv.Name, cur.Status.DatameshRevision, func(r *v1.ReplicatedVolumeReplica, st map[string]any) {
			if r.Spec.NodeName == cl.node("c") {
				return
			}
			var peers []any
			for _, p := range st["peers"].([]any) {
				if p.(map[string]any)["name"] == lost {
					p = map[string]any{"name": lost, "connectionState": "Connecting"}
				}
				peers = append(peers, p)
			}
			st["peers"] = peers
		})
		cl.agentReleaseDeleted(rv.Name)
		var nodes []string
		for _, r := range cl.rvrs(rv.Name) {
			if r.DeletionTimestamp == nil {
				nodes = append(nodes, strings.TrimPrefix(r.Spec.NodeName, cl.prefix+"-"))
			}
		}
		member := slices.ContainsFunc(cur.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == lost })
		return !member && slices.Equal(nodes, []string{"a", "b", "d"}) && cur.Status.Phase == v1.VolumePhaseReady,
			fmt.Sprintf("replicas on %v, %s still member: %v, %s", nodes, lost, member, phaseOf(cur))
	})
	evs := cl.events(rv.Name)
	if !evs.has("ForceRemoveStarted", lost) {
		t.Errorf("no ForceRemoveStarted event for %s:\n%s", lost, evs)
	}
	// The dead node's replica is gone although no agent removed its finalizer: the
	// controller did, the node being lost.
	cl.eventually(t, lost+" deleted", func() (bool, string) {
		err := cl.c.Get(cl.ctx, types.NamespacedName{Name: lost}, &v1.ReplicatedVolumeReplica{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	hasTaint := func() bool {
		n := &corev1.Node{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: cl.node("c")}, n))
		return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == controller.TaintOutOfService.Key && t.Value == "nodeshutdown" && t.Effect == corev1.TaintEffectNoExecute
		})
	}
	cl.eventually(t, "node c tainted out-of-service", func() (bool, string) { return hasTaint(), "" })
	// Node c comes back: nothing of the volume is left on it, so the taint goes.
	cl.setRenew("c", true)
	cl.eventually(t, "taint removed from node c", func() (bool, string) { return !hasTaint(), "" })
	// The write log is appended after each write returns, so the removal may be seen
	// on the Node a moment before it is in the log.
	cl.eventually(t, "two writes to node c", func() (bool, string) {
		ws := cl.writes.since(0, cl.node("c"))
		return len(ws) >= 2, fmt.Sprint(ws)
	})
	if ws := cl.writes.since(0, cl.node("c")); len(ws) != 2 {
		t.Errorf("writes to node c: %v, want the taint and its removal", ws)
	}
}

// Every agent misses its Lease at once — an apiserver that stalls, or the controller
// cut off from it, looks like that — and the controller declares no node lost: no
// AgentReady=False, no ForceLeave, no taint, however long it lasts. Once agents renew
// again, a node still silent is lost only a whole Lease duration and grace period after
// the controller saw the first renewal (docs/controller.md, "Every agent silent at
// once").
func TestEveryAgentSilentAtOnce(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{taint: true}, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100}, nodeSpec{"c", "", 100})
	class := cl.class("3d", 1, 1, v1.TopologyIgnored)
	rv := cl.volume("vol", class, "5Gi")
	cl.formed(rv.Name, 3)
	replicaOn := func(node string) string {
		for _, r := range cl.rvrs(rv.Name) {
			if r.Spec.NodeName == cl.node(node) {
				return r.Name
			}
		}
		t.Fatalf("no replica on node %s", node)
		return ""
	}
	onC := replicaOn("c")
	agentReady := func(name string) *metav1.Condition {
		r := &v1.ReplicatedVolumeReplica{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: name}, r))
		return meta.FindStatusCondition(r.Status.Conditions, v1.ConditionAgentReady)
	}
	nothingForced := func() string {
		for _, r := range cl.rvrs(rv.Name) {
			if c := agentReady(r.Name); c != nil && c.Status == metav1.ConditionFalse {
				return r.Name + " marked " + cond(r.Status.Conditions, v1.ConditionAgentReady)
			}
		}
		for _, q := range cl.rv(rv.Name).Status.DatameshReplicaRequests {
			if q.Operation == v1.ReplicaOperationForceLeave {
				return "ForceLeave requested for " + q.Name + ": " + q.Message
			}
		}
		for _, n := range []string{"a", "b", "c"} {
			node := &corev1.Node{}
			must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: cl.node(n)}, node))
			for _, taint := range node.Spec.Taints {
				if taint.Key == controller.TaintOutOfService.Key || taint.Key == controller.TaintLost.Key {
					return "node " + n + " tainted " + taint.ToString()
				}
			}
		}
		return ""
	}

	for _, n := range []string{"a", "b", "c"} {
		cl.setRenew(n, false)
	}
	// Three Lease durations and grace periods: every node would be lost twice over.
	lostAfter := time.Duration(cl.leaseSz)*time.Second + cl.grace
	for end := time.Now().Add(3 * lostAfter); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if why := nothingForced(); why != "" {
			t.Fatalf("while every agent was silent: %s", why)
		}
	}
	if m := scrapeMetrics(t); !strings.Contains(m, "meshvol_controller_agents_silent 1") {
		t.Errorf("meshvol_controller_agents_silent is not 1 while every agent is silent")
	}

	// Two agents come back; c's stays silent. Its Lease expired long ago, but it has a
	// fresh Lease duration and grace period from the end of the disruption.
	resumed := time.Now()
	cl.setRenew("a", true)
	cl.setRenew("b", true)
	cl.eventually(t, "AgentReady=False on "+onC, func() (bool, string) {
		c := agentReady(onC)
		return c != nil && c.Status == metav1.ConditionFalse, fmt.Sprint(c)
	})
	// Condition times have whole seconds: one second of slack.
	if at := agentReady(onC).LastTransitionTime.Time; at.Before(resumed.Add(lostAfter - time.Second)) {
		t.Errorf("node c declared lost at %s, %s after the agents renewed again; want no sooner than a Lease duration and grace period (%s)",
			at.Format(time.RFC3339), at.Sub(resumed).Round(time.Millisecond), lostAfter)
	}
	for _, n := range []string{"a", "b"} {
		if c := agentReady(replicaOn(n)); c != nil && c.Status == metav1.ConditionFalse {
			t.Errorf("node %s, whose agent renews, marked %s", n, c.Message)
		}
	}
	if m := scrapeMetrics(t); !strings.Contains(m, "meshvol_controller_agents_silent 0") {
		t.Errorf("meshvol_controller_agents_silent is not 0 once agents renew")
	}
}

// A node no agent ever held a Lease for — meshvol's DaemonSet does not select it, or its
// agent has not started yet — is never tainted, however long it stays so, while a node
// whose agent stopped renewing is: nothing of meshvol runs on the first, and the
// out-of-service taint would evict every pod of a node that is up.
func TestNodeWithoutAgentNeverTainted(t *testing.T) {
	cl := newClusterWith(t, clusterOptions{taint: true}, nodeSpec{name: "a", freeGi: 100}, nodeSpec{name: "b", freeGi: 100})
	bare := cl.node("bare")
	must(t, cl.c.Create(cl.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: bare, Labels: map[string]string{"test": cl.prefix}}}))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: bare}})
	})
	tainted := func(node string) bool {
		n := &corev1.Node{}
		must(t, cl.c.Get(cl.ctx, types.NamespacedName{Name: node}, n))
		return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == controller.TaintOutOfService.Key || t.Key == controller.TaintLost.Key
		})
	}
	// Node b's agent stops: it is tainted once its Lease is past the grace period,
	// which is as long as the bare node has been without one.
	cl.setRenew("b", false)
	cl.eventually(t, "node b tainted", func() (bool, string) { return tainted(cl.node("b")), "" })
	if tainted(bare) {
		t.Fatalf("node %s, which never had an agent Lease, was tainted", bare)
	}
	// Another grace period and Lease after that: still untouched.
	time.Sleep(cl.grace + time.Duration(cl.leaseSz)*time.Second)
	if tainted(bare) {
		t.Fatalf("node %s, which never had an agent Lease, was tainted", bare)
	}
	if ws := cl.writes.since(0, bare); len(ws) != 0 {
		t.Errorf("writes to node %s: %v, want none", bare, ws)
	}
}

// Neither the shared secret nor the cluster key it is derived from ever appears in the
// volume's status, in events, in the controller's logs or in its metrics.
func TestSecretNeverLeaks(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100})
	class := cl.class("2d", 0, 1, v1.TopologyIgnored)
	rv := cl.volume("vol", class, "1Gi")
	cur := cl.formed(rv.Name, 2)
	s := &corev1.Secret{}
	must(t, cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: cur.Status.Datamesh.SharedSecret.SecretName}, s))
	key := s.Data[v1.SecretKeyDRBDKey]
	if len(key) != sharedsecret.KeyLen {
		t.Fatalf("the cluster key is %d bytes, want %d", len(key), sharedsecret.KeyLen)
	}
	secret := sharedsecret.Derive(key, cur.UID)
	raw, err := base64.RawURLEncoding.DecodeString(secret)
	if err != nil || len(raw) != 32 {
		t.Fatalf("the secret is not 32 bytes, base64url: %v (%d bytes)", err, len(raw))
	}
	needles := []string{secret, base64.StdEncoding.EncodeToString([]byte(secret)), base64.StdEncoding.EncodeToString(raw), fmt.Sprintf("%x", raw),
		base64.StdEncoding.EncodeToString(key), base64.RawURLEncoding.EncodeToString(key), fmt.Sprintf("%x", key)}

	haystacks := map[string]string{}
	for _, r := range cl.rvrs(rv.Name) {
		haystacks["status of "+r.Name] = fmt.Sprintf("%+v", r.Status)
	}
	haystacks["rv"] = fmt.Sprintf("%+v %+v", cur.Status, cur.ObjectMeta)
	haystacks["events"] = cl.events(rv.Name).String()
	logs.Lock()
	haystacks["logs"] = logs.String()
	logs.Unlock()
	haystacks["metrics"] = scrapeMetrics(t)
	for where, text := range haystacks {
		for _, n := range needles {
			if strings.Contains(text, n) {
				t.Errorf("the shared secret appears in %s", where)
			}
		}
	}
	if len(haystacks["logs"]) == 0 || !strings.Contains(haystacks["metrics"], "meshvol_controller_writes_total") {
		t.Fatalf("nothing to search: logs %d bytes, metrics without meshvol's counters", len(haystacks["logs"]))
	}
}

// scrapeMetrics reads controller-runtime's registry (what the metrics endpoint serves)
// the way Prometheus does.
func scrapeMetrics(t *testing.T) string {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}).ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("metrics: HTTP %d", rec.Code)
	}
	return rec.Body.String()
}

// A volume formed before the cluster key keeps its own Secret and its reference across
// an upgrade of the controller, and the controller deletes that Secret with the volume;
// it creates no Secret for it (docs/controller.md, "Allocation and the shared secret").
func TestVolumeWithItsOwnSecretAcrossUpgrade(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100})
	class := cl.class("2d", 0, 1, v1.TopologyIgnored)
	cl.stop()
	// What the earlier controller left: the volume, its Secret, the reference.
	rv := cl.volume("old", class, "1Gi")
	own := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: controller.SecretName(rv.Name), Namespace: cl.ns, Labels: map[string]string{v1.LabelVolume: rv.Name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.SchemeGroupVersion.String(), Kind: "ReplicatedVolume", Name: rv.Name, UID: rv.UID}}},
		Data: map[string][]byte{v1.SecretKeySharedSecret: []byte("its-own-secret-of-43-characters-base64url-x")},
	}
	must(t, cl.c.Create(cl.ctx, own))
	ref := v1.SharedSecretReference{SecretName: own.Name, Key: v1.SecretKeySharedSecret, Algorithm: "sha256"}
	rv.Status.Datamesh.SharedSecret = ref.DeepCopy()
	must(t, cl.c.Status().Update(cl.ctx, rv))
	mark := cl.writes.mark()
	cl.start()
	cur := cl.formed(rv.Name, 2)
	if got := *cur.Status.Datamesh.SharedSecret; got != ref {
		t.Fatalf("the reference changed: %+v, want %+v", got, ref)
	}
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1.ConditionAllocated); c == nil || !strings.Contains(c.Message, "shared secret in Secret "+cl.ns+"/"+own.Name) {
		t.Errorf("Allocated: %v, want it to name the volume's own Secret", c)
	}

	must(t, cl.c.Delete(cl.ctx, rv))
	cl.eventually(t, "volume gone", func() (bool, string) {
		if cur := cl.rv(rv.Name); cur != nil {
			cl.agentConfirm(rv.Name, cur.Status.DatameshRevision, nil)
			cl.agentReleaseDeleted(rv.Name)
			return false, phaseOf(cur)
		}
		return true, ""
	})
	if err := cl.c.Get(cl.ctx, client.ObjectKeyFromObject(own), &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the volume's own Secret after its deletion: %v, want it deleted", err)
	}
	var secretWrites []string
	for _, w := range cl.writes.since(mark, rv.Name) {
		if w.Kind == "Secret" {
			secretWrites = append(secretWrites, w.Verb+" "+w.Name)
		}
	}
	if !slices.Equal(secretWrites, []string{"delete " + own.Name}) {
		t.Errorf("Secret writes for the volume: %v, want its own Secret's delete alone", secretWrites)
	}
}

// During a rolling upgrade of the agents a new volume's shared secret is derived only
// once every agent announces that it knows derived references: while an agent of the
// earlier version runs, a new volume gets a Secret of its own, which that agent reads;
// once every agent announces, the next volume's secret is derived; a reference once
// given never changes (an expansion goes through the allocation again); and an earlier
// agent that renews a newer one's Lease (a rollback) voids the announcement it kept
// (docs/install.md, "Upgrading"). A Secret left by an earlier volume of the same name is
// replaced, not used.
func TestOwnSecretUntilEveryAgentAnnounces(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100})
	class := cl.class("2d", 0, 1, v1.TopologyIgnored)
	mark := cl.writes.mark()
	// Node b's agent is of the earlier version: it announces nothing.
	cl.editLease("b", func(ann map[string]string) {
		delete(ann, v1.AnnotationCapabilities)
		delete(ann, v1.AnnotationCapabilitiesAgentVersion)
		ann[v1.AnnotationAgentVersion] = "v-earlier"
	})
	cl.controllerSeesAnnouncement("b", v1.CapabilityDerivedSharedSecret, false)
	// A Secret of an earlier volume of the same name, which the garbage collector
	// would delete: replaced, not used.
	stale := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: controller.SecretName(cl.prefix + "-first"), Namespace: cl.ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.SchemeGroupVersion.String(), Kind: "ReplicatedVolume", Name: cl.prefix + "-first", UID: "an-earlier-volume"}}},
		Data: map[string][]byte{v1.SecretKeySharedSecret: []byte("the-earlier-volumes-secret")}}
	must(t, cl.c.Create(cl.ctx, stale))
	cl.eventually(t, "the controller's cache shows the earlier volume's Secret", func() (bool, string) {
		err := cl.cache.Get(cl.ctx, client.ObjectKeyFromObject(stale), &corev1.Secret{})
		return err == nil, fmt.Sprint(err)
	})
	first := cl.volume("first", class, "1Gi")
	cur := cl.formed(first.Name, 2)
	ref := *cur.Status.Datamesh.SharedSecret
	if want := (v1.SharedSecretReference{SecretName: controller.SecretName(first.Name), Key: v1.SecretKeySharedSecret, Algorithm: "sha256"}); ref != want {
		t.Fatalf("with an agent of the earlier version, the reference is %+v, want the volume's own Secret %+v", ref, want)
	}
	own := &corev1.Secret{}
	must(t, cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: ref.SecretName}, own))
	if raw, err := base64.RawURLEncoding.DecodeString(string(own.Data[v1.SecretKeySharedSecret])); err != nil || len(raw) != 32 {
		t.Errorf("Secret %s: data.%s is not 32 bytes base64url (%d bytes, %v)", own.Name, v1.SecretKeySharedSecret, len(raw), err)
	}
	if own.UID == stale.UID || len(own.OwnerReferences) != 1 || own.OwnerReferences[0].UID != cur.UID || own.Labels[v1.LabelVolume] != first.Name {
		t.Errorf("Secret %s: owners %+v, labels %v, want the volume (UID %s) and its label", own.Name, own.OwnerReferences, own.Labels, cur.UID)
	}
	if c := meta.FindStatusCondition(cur.Status.Conditions, v1.ConditionAllocated); c == nil || !strings.Contains(c.Message, "shared secret in Secret "+cl.ns+"/"+own.Name) {
		t.Errorf("Allocated: %v, want it to name the volume's own Secret", c)
	}

	// Node b's agent upgraded: every agent announces.
	cl.editLease("b", func(ann map[string]string) {
		ann[v1.AnnotationAgentVersion] = agentVersion
		ann[v1.AnnotationCapabilities] = v1.CapabilityDerivedSharedSecret
		ann[v1.AnnotationCapabilitiesAgentVersion] = agentVersion
	})
	cl.controllerSeesAnnouncement("b", v1.CapabilityDerivedSharedSecret, true)
	second := cl.volume("second", class, "1Gi")
	if ref := cl.formed(second.Name, 2).Status.Datamesh.SharedSecret; ref.SecretName != v1.SecretDRBDKey || ref.Derivation != v1.DerivationHMACSHA256 || ref.KeyFingerprint == "" {
		t.Fatalf("with every agent announcing, the reference is %+v, want one derived from the cluster key", ref)
	}

	// The first volume keeps its reference and its Secret through a pass of the
	// allocation (an expansion), now that every agent would take a derived one.
	grown := cl.rv(first.Name)
	grown.Spec.Size = resource.MustParse("2Gi")
	must(t, cl.c.Update(cl.ctx, grown))
	cl.eventually(t, "the first volume's expansion published", func() (bool, string) {
		cur = cl.rv(first.Name)
		cl.agentConfirm(first.Name, cur.Status.DatameshRevision, nil)
		return cur.Status.Datamesh.Size != nil && cur.Status.Datamesh.Size.String() == "2Gi", fmt.Sprint(cur.Status.Datamesh.Size)
	})
	if got := *cur.Status.Datamesh.SharedSecret; got != ref {
		t.Errorf("the first volume's reference changed to %+v, want %+v", got, ref)
	}
	again := &corev1.Secret{}
	must(t, cl.c.Get(cl.ctx, client.ObjectKeyFromObject(own), again))
	if again.UID != own.UID || string(again.Data[v1.SecretKeySharedSecret]) != string(own.Data[v1.SecretKeySharedSecret]) {
		t.Errorf("the first volume's Secret was replaced or changed")
	}

	// Node a's agent rolled back: the earlier agent renews the Lease keeping the
	// announcement it does not know, but writes its own version.
	cl.editLease("a", func(ann map[string]string) { ann[v1.AnnotationAgentVersion] = "v-earlier" })
	cl.controllerSeesAnnouncement("a", v1.CapabilityDerivedSharedSecret, false)
	third := cl.volume("third", class, "1Gi")
	if ref := cl.formed(third.Name, 2).Status.Datamesh.SharedSecret; ref.SecretName != controller.SecretName(third.Name) || ref.Derivation != "" {
		t.Fatalf("after a rollback of node a's agent, the reference is %+v, want the volume's own Secret", ref)
	}

	var secretWrites []string
	for _, w := range cl.writes.since(mark, cl.prefix) {
		if w.Kind == "Secret" {
			secretWrites = append(secretWrites, w.Verb+" "+w.Name)
		}
	}
	slices.Sort(secretWrites)
	if want := []string{"create " + controller.SecretName(first.Name), "create " + controller.SecretName(third.Name), "delete " + stale.Name}; !slices.Equal(secretWrites, want) {
		t.Errorf("Secret writes of the volumes: %v, want %v", secretWrites, want)
	}
}

// helm upgrade leaves a chart's CRDs alone: a cluster upgraded with it alone keeps the
// earlier ReplicatedVolume CRD, whose schema lacks a derived reference's derivation and
// keyFingerprint, and the apiserver would drop them. While the installed CRD lacks them,
// new volumes get Secrets of their own; the CRD applied and the controller restarted
// (as helm upgrade restarts it), the next volume's secret is derived and stored whole
// (docs/install.md, "Upgrading").
func TestOwnSecretWhileTheCRDLacksDerivation(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100}, nodeSpec{"b", "", 100})
	class := cl.class("2d", 0, 1, v1.TopologyIgnored)
	cl.stop()
	restore := cl.earlierRVCRD()
	cl.start()
	first := cl.volume("first", class, "1Gi")
	if ref := cl.formed(first.Name, 2).Status.Datamesh.SharedSecret; ref.SecretName != controller.SecretName(first.Name) || ref.Key != v1.SecretKeySharedSecret {
		t.Fatalf("with the earlier CRD, the reference is %+v, want the volume's own Secret", ref)
	}
	must(t, cl.c.Get(cl.ctx, types.NamespacedName{Namespace: cl.ns, Name: controller.SecretName(first.Name)}, &corev1.Secret{}))

	cl.stop()
	restore()
	cl.start()
	second := cl.volume("second", class, "1Gi")
	if ref := cl.formed(second.Name, 2).Status.Datamesh.SharedSecret; ref.SecretName != v1.SecretDRBDKey || ref.Derivation != v1.DerivationHMACSHA256 || ref.KeyFingerprint == "" {
		t.Fatalf("with this tree's CRD, the reference is %+v, want one derived from the cluster key", ref)
	}
}

// earlierRVCRD makes the installed ReplicatedVolume CRD the release before's (no
// derivation, no keyFingerprint, and so no rule that ties them) until the returned
// function, or the test's end, puts this tree's back. Each waits until the apiserver
// stores status by the schema it set: a derived reference whole, or pruned.
func (cl *cluster) earlierRVCRD() (restore func()) {
	cl.t.Helper()
	key := types.NamespacedName{Name: "replicatedvolumes.storage.meshvol.io"}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	must(cl.t, cl.c.Get(cl.ctx, key, crd))
	original := crd.Spec.DeepCopy()
	set := func(spec func(*apiextensionsv1.CustomResourceDefinitionSpec), keeps bool) {
		must(cl.t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &apiextensionsv1.CustomResourceDefinition{}
			if err := cl.c.Get(context.Background(), key, cur); err != nil {
				return err
			}
			spec(&cur.Spec)
			return cl.c.Update(context.Background(), cur)
		}))
		cl.waitStoresDerivation(keeps)
	}
	set(func(spec *apiextensionsv1.CustomResourceDefinitionSpec) {
		for i := range spec.Versions {
			ss := spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"].Properties["sharedSecret"]
			delete(ss.Properties, "derivation")
			delete(ss.Properties, "keyFingerprint")
			ss.XValidations = nil
			spec.Versions[i].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"].Properties["sharedSecret"] = ss
		}
	}, false)
	var once sync.Once
	restore = func() {
		once.Do(func() {
			set(func(spec *apiextensionsv1.CustomResourceDefinitionSpec) { *spec = *original.DeepCopy() }, true)
		})
	}
	cl.t.Cleanup(restore)
	return restore
}

// waitStoresDerivation waits until the apiserver stores a derived reference's fields in
// an RV's status (keeps), or drops them, trying on a probe volume of its own with no
// controller running.
func (cl *cluster) waitStoresDerivation(keeps bool) {
	cl.t.Helper()
	probe := &v1.ReplicatedVolume{ObjectMeta: metav1.ObjectMeta{Name: cl.prefix + "-crd-probe"}, Spec: v1.ReplicatedVolumeSpec{
		Size: resource.MustParse("1Gi"), ReplicatedStorageClassName: cl.prefix + "-crd-probe"}}
	must(cl.t, cl.c.Create(context.Background(), probe))
	defer func() { _ = cl.c.Delete(context.Background(), probe) }()
	cl.eventually(cl.t, fmt.Sprintf("the apiserver storing a derived reference whole: %v", keeps), func() (bool, string) {
		cur := &v1.ReplicatedVolume{}
		if err := cl.c.Get(context.Background(), client.ObjectKeyFromObject(probe), cur); err != nil {
			return false, err.Error()
		}
		cur.Status.Datamesh.SharedSecret = &v1.SharedSecretReference{SecretName: v1.SecretDRBDKey, Key: v1.SecretKeyDRBDKey, Algorithm: "sha256",
			Derivation: v1.DerivationHMACSHA256, KeyFingerprint: "0123456789abcdef"}
		if err := cl.c.Status().Update(context.Background(), cur); err != nil {
			return false, err.Error()
		}
		stored := cur.Status.Datamesh.SharedSecret
		return (stored.Derivation != "" && stored.KeyFingerprint != "") == keeps, fmt.Sprintf("%+v", stored)
	})
}

// controllerSeesAnnouncement waits until the controller's cache shows node's agent Lease
// announcing capability, or not: the controller's next pass reads it there.
func (cl *cluster) controllerSeesAnnouncement(node, capability string, announces bool) {
	cl.t.Helper()
	key := types.NamespacedName{Namespace: cl.ns, Name: v1.AgentLeasePrefix + cl.node(node)}
	cl.eventually(cl.t, fmt.Sprintf("the controller's cache shows node %s announcing %s: %v", node, capability, announces), func() (bool, string) {
		l := &coordinationv1.Lease{}
		if err := cl.cache.Get(cl.ctx, key, l); err != nil {
			return false, err.Error()
		}
		return agentlease.Announces(l, capability) == announces, fmt.Sprint(l.Annotations)
	})
}

// A key Secret that holds no usable key (written by someone else) holds allocation back
// with a condition that names the Secret, the field and the rule; the key put right, the
// volume allocates at once (the key's Secret wakes the volumes waiting for it).
func TestUnusableKeyHoldsAllocation(t *testing.T) {
	cl := newCluster(t, nodeSpec{"a", "", 100})
	class := cl.class("one", 0, 0, v1.TopologyIgnored)
	cl.stop()
	short := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: v1.SecretDRBDKey, Namespace: cl.ns},
		Data: map[string][]byte{v1.SecretKeyDRBDKey: []byte("too short")}}
	must(t, cl.c.Create(cl.ctx, short))
	cl.start()
	rv := cl.volume("vol", class, "1Gi")
	want := "Secret " + cl.ns + "/" + v1.SecretDRBDKey + " data." + v1.SecretKeyDRBDKey + ": is 9 bytes, must be at least 32"
	cl.eventually(t, "allocation held back, naming the key", func() (bool, string) {
		c := meta.FindStatusCondition(cl.rv(rv.Name).Status.Conditions, v1.ConditionAllocated)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "SharedSecretKeyUnavailable" && strings.Contains(c.Message, want), fmt.Sprint(c)
	})
	key, err := sharedsecret.NewKey()
	must(t, err)
	short.Data[v1.SecretKeyDRBDKey] = key
	must(t, cl.c.Update(cl.ctx, short))
	cur := cl.formed(rv.Name, 1)
	if ref := cur.Status.Datamesh.SharedSecret; ref.KeyFingerprint != sharedsecret.Fingerprint(key) || ref.Derivation != v1.DerivationHMACSHA256 {
		t.Fatalf("reference %+v, want one derived from the key put right (fingerprint %s)", ref, sharedsecret.Fingerprint(key))
	}
}
