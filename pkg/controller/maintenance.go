package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
	"github.com/meshvol/meshvol/pkg/drbd/quorum"
)

// Node maintenance (docs/operating.md, "Node maintenance"): one reconcile per
// ReplicatedNodeMaintenance. The phase is a function of what the caches hold now, like a
// volume's: the pre-checks ask DRBD's own quorum rule (pkg/drbd/quorum) whether every
// volume with a member on the node keeps quorum, with its quorum-minimum-redundancy (the
// guaranteed redundancy), on the members left, after the agreement DRBD runs among them
// once the node is gone (survivesWithout); a volume that would not is copied elsewhere
// first, raised to a layout that does; attached volumes hold the node in
// Draining until their pods move; then the node may go down. While a maintenance is
// active its node's members are never force-removed (lostMembers), so a node away for
// maintenance leaves its volumes Degraded, not replaced (nodesAway). Once ReadyForMaintenance the
// phase stays until spec.return: the node going down must not turn it into Blocked.

// maintenanceActive: the node is out of service or about to be.
func maintenanceActive(p v1.MaintenancePhase) bool {
	return p == v1.MaintenanceDraining || p == v1.MaintenanceReadyForMaintenance || p == v1.MaintenanceReturning
}

// volumeOnNode is a volume with a replica on the maintained node.
type volumeOnNode struct {
	rv   *v1.ReplicatedVolume
	rvrs map[string]*v1.ReplicatedVolumeReplica
}

// maintenanceFacts is everything the verdict reads.
type maintenanceFacts struct {
	m *v1.ReplicatedNodeMaintenance
	// busy names another node whose maintenance is active ("" when none).
	busy    string
	volumes []volumeOnNode
	// attached are the volumes attached, or asked to attach, on the node.
	attached []string
	// live says whether a node's agent is live; nodeLive is the maintained node's.
	live     func(node string) bool
	nodeLive bool
	// now is the controller's clock: spec.maxDowntime is measured against it.
	now time.Time
}

// judgeMaintenance is the maintenance's status for the facts.
func judgeMaintenance(f maintenanceFacts) v1.ReplicatedNodeMaintenanceStatus {
	m, node := f.m, f.m.Spec.NodeName
	st := v1.ReplicatedNodeMaintenanceStatus{ObservedGeneration: m.Generation, AwaySince: m.Status.AwaySince,
		CopiedVolumes: m.Status.CopiedVolumes}
	if judgeEnd(f, &st) {
		return st
	}
	if m.Status.Phase == v1.MaintenanceReadyForMaintenance {
		st.Phase, st.Message = v1.MaintenanceReadyForMaintenance, m.Status.Message
		return st
	}
	if f.busy != "" {
		st.Phase = v1.MaintenanceBlocked
		st.Message = "Node " + f.busy + " is in maintenance: one node at a time"
		return st
	}
	if unlisted := unlistedReplicas(f); len(unlisted) > 0 {
		st.Phase = v1.MaintenancePending
		st.Message = "Waiting for the datamesh of these volumes to list their replica on node " + node +
			" (joining, or its status not read yet) before judging them: " + strings.Join(unlisted, ", ")
		return st
	}
	var why, copying, newCopies []string
	for _, v := range f.volumes {
		ok, reason := survivesWithout(v.rv, v.rvrs, node, f.live)
		switch {
		case ok && slices.Contains(st.CopiedVolumes, v.rv.Name):
			if w := raiseRunning(v); w != "" {
				copying = append(copying, w)
			}
		case ok:
		case slices.Contains(st.CopiedVolumes, v.rv.Name):
			if refused := copyRefused(v.rv); refused != "" {
				st.BlockingVolumes = append(st.BlockingVolumes, v.rv.Name)
				why = append(why, v.rv.Name+": "+reason+"; no node can take a copy: "+refused)
			} else {
				copying = append(copying, copyProgress(v, node, reason))
			}
		default:
			if whyNot := copyImpossible(v, node, f.live); whyNot != "" {
				st.BlockingVolumes = append(st.BlockingVolumes, v.rv.Name)
				why = append(why, v.rv.Name+": "+reason+"; "+whyNot)
			} else {
				newCopies = append(newCopies, v.rv.Name)
				copying = append(copying, copyAsked(v, reason))
			}
		}
	}
	if len(why) > 0 {
		st.Phase = v1.MaintenanceBlocked
		st.Message = "Taking node " + node + " out would leave these volumes without quorum or their guaranteed redundancy: " + strings.Join(why, "; ")
		return st
	}
	if len(copying) > 0 {
		// A copied volume stays copied until the maintenance ends: dropping it once
		// the copy is made would let the engine remove the copy again.
		st.CopiedVolumes = append(slices.Clone(st.CopiedVolumes), newCopies...)
		sort.Strings(st.CopiedVolumes)
		st.Phase = v1.MaintenanceDraining
		st.Message = "Copying the volumes that need node " + node + " to another node first: " + strings.Join(copying, "; ")
		return st
	}
	if len(f.attached) > 0 {
		st.Phase, st.AttachedVolumes = v1.MaintenanceDraining, f.attached
		st.Message = "Waiting for the volumes attached on node " + node + " to detach: " + strings.Join(f.attached, ", ") +
			"; their pods must be moved by their owners (kubectl drain " + node + ")"
		return st
	}
	st.Phase = v1.MaintenanceReadyForMaintenance
	if st.AwaySince == nil {
		now := metav1.NewTime(f.now)
		st.AwaySince = &now
	}
	st.Message = fmt.Sprintf("Node %s may be taken down: nothing is attached on it, and the %d volume(s) with a replica there keep quorum and their guaranteed redundancy without it",
		node, len(f.volumes))
	return st
}

// judgeEnd judges a maintenance that has failed, has run past spec.maxDowntime, or is
// asked to end (spec.return): it fills st and says so, or returns false for the
// judgement of a node going out.
func judgeEnd(f maintenanceFacts, st *v1.ReplicatedNodeMaintenanceStatus) bool {
	m, node := f.m, f.m.Spec.NodeName
	if m.Status.Phase == v1.MaintenanceFailed {
		st.CopiedVolumes = nil
		st.Phase, st.Message = v1.MaintenanceFailed, m.Status.Message
		return true
	}
	if away := m.Status.AwaySince; away != nil && m.Spec.MaxDowntime != nil && maintenanceActive(m.Status.Phase) &&
		f.now.Sub(away.Time) > m.Spec.MaxDowntime.Duration {
		st.Phase, st.CopiedVolumes = v1.MaintenanceFailed, nil
		st.Message = fmt.Sprintf("Node %s has been away since %s, longer than spec.maxDowntime %s: it is lost now, and its volumes' members there may be replaced",
			node, away.UTC().Format(time.RFC3339), m.Spec.MaxDowntime.Duration)
		if waits := returnWaits(f); len(waits) > 0 {
			st.Message += "; still missing: " + strings.Join(waits, "; ")
		}
		return true
	}
	if m.Spec.Return {
		if !maintenanceActive(m.Status.Phase) {
			st.Phase, st.Message = v1.MaintenanceCompleted, "Completed: node "+node+" was never taken out of service"
			st.CopiedVolumes = nil
			return true
		}
		if waits := returnWaits(f); len(waits) > 0 {
			st.Phase, st.Message = v1.MaintenanceReturning, "Waiting for node "+node+" to be back in sync: "+strings.Join(waits, "; ")
			return true
		}
		st.Phase, st.Message = v1.MaintenanceCompleted, "Node "+node+" is back: its agent is live and every replica on it is in sync"
		if len(m.Status.CopiedVolumes) > 0 {
			st.Message += "; the volumes copied for the maintenance go back to their configured layout: " + strings.Join(m.Status.CopiedVolumes, ", ")
		}
		st.CopiedVolumes = nil
		return true
	}
	return false
}

// copyImpossible says why no copy elsewhere can make the volume survive without node
// ("" when one can): the copy raises the volume's layout to one that keeps quorum while
// one of its Diskful nodes is away (the engine's Input.ExtraFTT,
// layout.Layout.RaisedForMaintenance), which needs a resolved configuration with a
// layout above it, and every member on another node up, since the copy's join waits
// for each of them.
func copyImpossible(v volumeOnNode, node string, live func(string) bool) string {
	c := v.rv.Status.Configuration
	if c == nil {
		return "its configuration is not resolved, so no copy elsewhere is asked for"
	}
	if _, ok := configLayout(c).RaisedForMaintenance(); !ok {
		return fmt.Sprintf("a copy elsewhere cannot help: no layout is above its own (FTT=%d, GMDR=%d; both are at most %d)",
			c.FailuresToTolerate, c.GuaranteedMinimumDataRedundancy, layout.MaxFTT)
	}
	for _, mem := range v.rv.Status.Datamesh.Members {
		if r := v.rvrs[mem.Name]; mem.NodeName != node && (r == nil || !live(mem.NodeName) || !reportingAgent(r)) {
			return "a copy elsewhere waits for every other member to be up, and " + mem.Name + " on node " + mem.NodeName + " is not"
		}
	}
	return ""
}

// configLayout is the layout of a volume's resolved configuration.
func configLayout(c *v1.ReplicatedVolumeConfiguration) layout.Layout {
	return layout.Layout{FTT: int(c.FailuresToTolerate), GMDR: int(c.GuaranteedMinimumDataRedundancy)}
}

// copyAsked is the progress line of a volume whose copy elsewhere is asked for now:
// the layout it is raised to, and the cost, a full sync of each new Diskful replica
// (docs/operating.md, "Copying a volume elsewhere before its node goes").
func copyAsked(v volumeOnNode, reason string) string {
	from := configLayout(v.rv.Status.Configuration)
	to, _ := from.RaisedForMaintenance()
	return fmt.Sprintf("%s: a copy elsewhere is asked for, %s raised to %s while the maintenance lasts (a full sync of each new Diskful replica), since %s",
		v.rv.Name, from, to, reason)
}

// raiseRunning says what a copied volume that keeps quorum without the node still
// lacks of its raised layout ("" when it is reached): a step in flight when the node
// goes waits for the node's confirmation until it is back — the TieBreaker leaving a
// 2D+1TB raised to 3D, say —, and attaching the volume meanwhile would wait behind it.
func raiseRunning(v volumeOnNode) string {
	if ts := v.rv.Status.DatameshTransitions; len(ts) > 0 {
		var running []string
		for _, t := range ts {
			running = append(running, strings.TrimSpace(string(t.Type)+" "+t.ReplicaName))
		}
		return v.rv.Name + ": waiting for its steps in flight: " + strings.Join(running, ", ")
	}
	c := v.rv.Status.Configuration
	if c == nil {
		return ""
	}
	raised, ok := configLayout(c).RaisedForMaintenance()
	if !ok {
		return ""
	}
	var d, tb int
	for _, m := range v.rv.Status.Datamesh.Members {
		switch m.Type {
		case v1.MemberTypeDiskful:
			d++
		case v1.MemberTypeTieBreaker:
			tb++
		}
	}
	if wantTB := layout.TieBreakerMin(raised.DiskfulCount(), raised.FTT); d != raised.DiskfulCount() || tb != wantTB {
		return fmt.Sprintf("%s: raised to %s, it has %d Diskful and %d TieBreaker members", v.rv.Name, raised, d, tb)
	}
	return ""
}

// copyRefused is placement's refusal of a copied volume's new replicas (its Scheduled
// condition), "" when there is none.
func copyRefused(rv *v1.ReplicatedVolume) string {
	if c := meta.FindStatusCondition(rv.Status.Conditions, v1.ConditionScheduled); c != nil && c.Status == metav1.ConditionFalse {
		return c.Message
	}
	return ""
}

// copyProgress names a copied volume's copies not in sync yet, with their progress, or
// else what it still lacks (reason, survivesWithout's).
func copyProgress(v volumeOnNode, node, reason string) string {
	var copies []string
	for _, r := range v.rvrs {
		if r.Spec.NodeName == node || r.DeletionTimestamp != nil || r.Spec.Type != v1.ReplicaTypeDiskful {
			continue
		}
		member := slices.ContainsFunc(v.rv.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.Name == r.Name })
		switch {
		case !member:
			copies = append(copies, "copy "+r.Name+" on node "+r.Spec.NodeName+" joining")
		case r.Status.DiskState != v1.DiskStateUpToDate:
			w := "copy " + r.Name + " on node " + r.Spec.NodeName + " " + string(orUnknown(r.Status.DiskState))
			if pct, ok := resyncPercent(r); ok {
				w += fmt.Sprintf(" (syncing %d%%)", pct)
			}
			copies = append(copies, w)
		}
	}
	sort.Strings(copies)
	if len(copies) == 0 {
		return v.rv.Name + ": " + reason
	}
	return v.rv.Name + ": " + strings.Join(copies, ", ")
}

// unlistedReplicas are the replicas on the node that their volume's datamesh does not
// list as members: survivesWithout reads only the datamesh, which would let the node go
// with a copy the status does not show yet (a join in progress, or a volume status
// older than its replica in the cache). A replica being deleted is leaving, not
// joining.
func unlistedReplicas(f maintenanceFacts) []string {
	node := f.m.Spec.NodeName
	var out []string
	for _, v := range f.volumes {
		r := v.rvrs[v1.ReplicaName(v.rv.Name, node)]
		if r == nil || r.DeletionTimestamp != nil ||
			slices.ContainsFunc(v.rv.Status.Datamesh.Members, func(m v1.DatameshMember) bool { return m.NodeName == node }) {
			continue
		}
		out = append(out, r.Name)
	}
	return out
}

// returnWaits lists what a returning node still lacks: a live agent; every replica
// on it UpToDate (Diskful) and running the volume's revision; and, since the node's own
// report may be the one it left before going down, every peer that connects to it on
// a live node reporting the connection Established (and its disk UpToDate): the
// peers' reports are fresh.
func returnWaits(f maintenanceFacts) []string {
	node := f.m.Spec.NodeName
	if !f.nodeLive {
		return []string{"the agent of node " + node + " is not live"}
	}
	var waits []string
	for _, v := range f.volumes {
		for _, mem := range v.rv.Status.Datamesh.Members {
			r := v.rvrs[mem.Name]
			if mem.NodeName != node || r == nil {
				continue
			}
			switch {
			case mem.Type.HasDisk() && r.Status.DiskState != v1.DiskStateUpToDate:
				w := mem.Name + ": " + string(orUnknown(r.Status.DiskState))
				if pct, ok := resyncPercent(r); ok {
					w += fmt.Sprintf(" (syncing %d%%)", pct)
				}
				waits = append(waits, w)
			case r.Status.DatameshRevision < v.rv.Status.DatameshRevision:
				waits = append(waits, fmt.Sprintf("%s: runs revision %d of %d", mem.Name, r.Status.DatameshRevision, v.rv.Status.DatameshRevision))
			}
			waits = append(waits, peersWait(v, mem, f.live)...)
		}
	}
	return waits
}

// peersWait: what the live peers of mem report about their connection to it.
func peersWait(v volumeOnNode, mem v1.DatameshMember, live func(string) bool) []string {
	var waits []string
	for _, p := range v.rv.Status.Datamesh.Members {
		pr := v.rvrs[p.Name]
		if p.Name == mem.Name || pr == nil || !live(p.NodeName) || !reportingAgent(pr) ||
			!p.Type.ConnectsToAllPeers() && !mem.Type.ConnectsToAllPeers() {
			continue
		}
		i := slices.IndexFunc(pr.Status.Peers, func(ps v1.PeerStatus) bool { return ps.Name == mem.Name })
		if i < 0 {
			waits = append(waits, p.Name+" reports no connection to "+mem.Name)
			continue
		}
		ps := pr.Status.Peers[i]
		if ps.ConnectionState != "Connected" || ps.ReplicationState != "Established" || mem.Type.HasDisk() && ps.PeerDiskState != v1.DiskStateUpToDate {
			waits = append(waits, fmt.Sprintf("%s sees %s %s/%s/%s", p.Name, mem.Name, ps.ConnectionState, ps.ReplicationState, ps.PeerDiskState))
		}
	}
	return waits
}

// survivesWithout asks DRBD's quorum rule, from the view of each UpToDate Diskful
// member left (not on node, agent live and reporting), whether it keeps quorum with
// the volume's q and qmr while node's members are gone: at the moment they go, and
// after the agreement DRBD runs among the nodes left a moment later, which takes every
// node they do not reach out of their electorate (quorum.AfterLostPeer;
// docs/drbd-quorum.md, "The members set"). Judged at the moment alone, a 2D+1TB passes
// through the tiebreaker and then loses quorum on its one Diskful survivor. No member
// is judged as a Primary, whom DRBD lets keep its quorum through that agreement: the
// next connection loss among the survivors runs another one. ok when one member keeps
// quorum; otherwise the reason of the first one asked, in DRBD's words.
func survivesWithout(rv *v1.ReplicatedVolume, rvrs map[string]*v1.ReplicatedVolumeReplica, node string, live func(string) bool) (bool, string) {
	dm := &rv.Status.Datamesh
	if !slices.ContainsFunc(dm.Members, func(m v1.DatameshMember) bool { return m.NodeName == node }) {
		return true, ""
	}
	up := func(m v1.DatameshMember) bool {
		r := rvrs[m.Name]
		return m.NodeName != node && r != nil && live(m.NodeName) && reportingAgent(r)
	}
	in := quorum.Input{Quorum: quorum.Count(int(dm.Quorum)), MinRedundancy: quorum.Count(int(dm.QuorumMinimumRedundancy)), Self: quorum.DiskUpToDate}
	if dm.Quorum == 0 {
		in.Quorum = quorum.Majority
	}
	why := ""
	for i, self := range dm.Members {
		if self.Type != v1.MemberTypeDiskful || !up(self) || rvrs[self.Name].Status.DiskState != v1.DiskStateUpToDate {
			continue
		}
		in.Peers = in.Peers[:0]
		for j, p := range dm.Members {
			if j != i {
				in.Peers = append(in.Peers, quorumPeer(p, up(p), rvrs[p.Name]))
			}
		}
		q := rvrs[self.Name].Status.Quorum
		in.QuorateNow = q != nil && *q
		r := quorum.AfterLostPeer(&in)
		if r.Quorate {
			return true, ""
		}
		if why == "" {
			why = "on " + self.NodeName + ", " + r.Reason()
			if quorum.Compute(&in).Quorate {
				why += " once DRBD's agreement among the nodes left takes node " + node + " out of the electorate"
			}
		}
	}
	if why == "" {
		why = "no UpToDate Diskful replica with a live agent is left outside node " + node
	}
	return false, why
}

// quorumPeer is a member as a surviving Diskful peer sees it once node is gone: a
// member that is not up counts as an absent voter of unknown state (a clean shutdown
// does not outdate it).
func quorumPeer(m v1.DatameshMember, up bool, r *v1.ReplicatedVolumeReplica) quorum.Peer {
	switch {
	case m.Type == v1.MemberTypeShadowDiskful || m.Type == v1.MemberTypeLiminalShadowDiskful:
		return quorum.Peer{Excluded: true}
	case !m.Type.IsVoter():
		return quorum.Peer{Diskless: true, Connected: up}
	case !up:
		return quorum.Peer{}
	}
	p := quorum.Peer{Connected: true, Disk: quorum.DiskPresent}
	switch {
	case r.Status.DiskState == v1.DiskStateUpToDate:
		p.Disk = quorum.DiskUpToDate
	case !m.Type.HasDisk() || r.Status.DiskState == v1.DiskStateDiskless:
		p.Disk = quorum.DiskDetached
	}
	return p
}

func (c *Controller) setupMaintenance(mgr ctrl.Manager) error {
	// Any volume, replica, attachment or agent Lease may change a maintenance's verdict (a
	// member elsewhere failing blocks a drain): wake them all. There are few
	// maintenances (one active at a time), and none most of the time.
	all := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		var list v1.ReplicatedNodeMaintenanceList
		if err := c.reader.List(ctx, &list); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for _, m := range list.Items {
			if m.Status.Phase != v1.MaintenanceCompleted {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: m.Name}})
			}
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("node-maintenance").
		For(&v1.ReplicatedNodeMaintenance{}).
		Watches(&v1.ReplicatedVolume{}, all).
		Watches(&v1.ReplicatedVolumeReplica{}, all).
		Watches(&v1.ReplicatedVolumeAttachment{}, all).
		Watches(&coordinationv1.Lease{}, all).
		Complete(reconcile.Func(c.reconcileMaintenance))
}

func (c *Controller) reconcileMaintenance(ctx context.Context, req reconcile.Request) (ctrl.Result, error) {
	m := &v1.ReplicatedNodeMaintenance{}
	if err := c.reader.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if m.DeletionTimestamp != nil || m.Status.Phase == v1.MaintenanceFailed ||
		m.Status.Phase == v1.MaintenanceCompleted && m.Status.ObservedGeneration == m.Generation {
		return ctrl.Result{}, nil
	}
	f, err := c.maintenanceFacts(ctx, m, c.cachedFacts())
	if err != nil {
		return ctrl.Result{}, err
	}
	st := judgeMaintenance(f)
	if st.Phase == v1.MaintenanceReadyForMaintenance && m.Status.Phase != v1.MaintenanceReadyForMaintenance {
		// ReadyForMaintenance lets the node go down and stays once written: it is
		// judged again from the API server, since the cache may not have seen yet a
		// replica, an attachment or a volume status written a moment ago.
		if f, err = c.maintenanceFacts(ctx, m, c.freshFacts()); err != nil {
			return ctrl.Result{}, err
		}
		st = judgeMaintenance(f)
	}
	st.LastPhaseChange = m.Status.LastPhaseChange
	if st.Phase != m.Status.Phase || st.LastPhaseChange == nil {
		now := metav1.NewTime(c.opts.Now())
		st.LastPhaseChange = &now
	}
	if st.Phase == m.Status.Phase && st.Message == m.Status.Message && st.ObservedGeneration == m.Status.ObservedGeneration &&
		slices.Equal(st.BlockingVolumes, m.Status.BlockingVolumes) && slices.Equal(st.AttachedVolumes, m.Status.AttachedVolumes) &&
		slices.Equal(st.CopiedVolumes, m.Status.CopiedVolumes) {
		return c.maintenanceRequeue(m), nil
	}
	if st.Phase != m.Status.Phase || !slices.Equal(st.CopiedVolumes, m.Status.CopiedVolumes) {
		for _, v := range f.volumes {
			// The volumes read maintenanceActive for their node (lostMembers) and
			// whether they are copied (maintenanceView).
			c.wakeVolume(v.rv.Name)
		}
	}
	if err := applyStatus(ctx, c.client, "ReplicatedNodeMaintenance", m.Name, m.ResourceVersion, st); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// Judged from a stale cache, or deleted meanwhile: judge again.
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, fmt.Errorf("writing the status of maintenance %s: %w", m.Name, err)
	}
	return ctrl.Result{}, nil
}

// maintenanceRequeue: an agent Lease expires by the clock with no event; a returning
// or blocked maintenance looks again after the grace period; a node away looks again
// when its spec.maxDowntime runs out.
func (c *Controller) maintenanceRequeue(m *v1.ReplicatedNodeMaintenance) ctrl.Result {
	var after time.Duration
	if m.Status.Phase == v1.MaintenanceReturning || m.Status.Phase == v1.MaintenanceBlocked {
		after = max(c.opts.AgentGracePeriod, time.Second)
	}
	if maintenanceActive(m.Status.Phase) && m.Status.AwaySince != nil && m.Spec.MaxDowntime != nil {
		left := m.Status.AwaySince.Add(m.Spec.MaxDowntime.Duration).Sub(c.opts.Now()) + time.Second
		if after == 0 || left < after {
			after = max(left, time.Second)
		}
	}
	return ctrl.Result{RequeueAfter: after}
}

// factsSource is where maintenanceFacts reads: the cache through its field indexes, or
// the API server through the labels the controller and the CSI service put on every
// replica and attachment (v1.LabelNode, v1.LabelVolume).
type factsSource struct {
	client.Reader
	onNode, ofVolume func(string) client.ListOption
}

// cachedFacts: onNode serves replicas and attachments alike, as indexNode and
// indexNodeRVA are the same field.
func (c *Controller) cachedFacts() factsSource {
	return factsSource{c.reader,
		func(n string) client.ListOption { return client.MatchingFields{indexNode: n} },
		func(v string) client.ListOption { return client.MatchingFields{indexVolume: v} }}
}

func (c *Controller) freshFacts() factsSource {
	return factsSource{c.api,
		func(n string) client.ListOption { return client.MatchingLabels{v1.LabelNode: n} },
		func(v string) client.ListOption { return client.MatchingLabels{v1.LabelVolume: v} }}
}

// maintenanceFacts reads the maintenance's facts from src.
func (c *Controller) maintenanceFacts(ctx context.Context, m *v1.ReplicatedNodeMaintenance, src factsSource) (maintenanceFacts, error) {
	node := m.Spec.NodeName
	f := maintenanceFacts{m: m, now: c.opts.Now()}
	var others v1.ReplicatedNodeMaintenanceList
	if err := src.List(ctx, &others); err != nil {
		return f, err
	}
	for _, o := range others.Items {
		if o.Name != m.Name && o.Spec.NodeName != node && maintenanceActive(o.Status.Phase) {
			f.busy = o.Spec.NodeName
		}
	}
	var leases coordinationv1.LeaseList
	if err := src.List(ctx, &leases, client.InNamespace(c.opts.Namespace)); err != nil {
		return f, err
	}
	byNode := map[string]*coordinationv1.Lease{}
	for i := range leases.Items {
		if n := agentlease.NodeName(&leases.Items[i]); n != "" {
			byNode[n] = &leases.Items[i]
		}
	}
	f.live = func(n string) bool { return agentlease.Judge(byNode[n], f.now, c.opts.AgentGracePeriod).Live }
	f.nodeLive = f.live(node)
	var here v1.ReplicatedVolumeReplicaList
	if err := src.List(ctx, &here, src.onNode(node)); err != nil {
		return f, err
	}
	attached := map[string]bool{}
	for _, r := range here.Items {
		vol := r.Spec.ReplicatedVolumeName
		if slices.ContainsFunc(f.volumes, func(v volumeOnNode) bool { return v.rv.Name == vol }) {
			continue
		}
		rv := &v1.ReplicatedVolume{}
		if err := src.Get(ctx, types.NamespacedName{Name: vol}, rv); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return f, err
		}
		var rvrs v1.ReplicatedVolumeReplicaList
		if err := src.List(ctx, &rvrs, src.ofVolume(vol)); err != nil {
			return f, err
		}
		v := volumeOnNode{rv: rv, rvrs: map[string]*v1.ReplicatedVolumeReplica{}}
		for i := range rvrs.Items {
			v.rvrs[rvrs.Items[i].Name] = &rvrs.Items[i]
		}
		f.volumes = append(f.volumes, v)
		for _, mem := range rv.Status.Datamesh.Members {
			if mem.NodeName == node && mem.Attached {
				attached[vol] = true
			}
		}
	}
	var rvas v1.ReplicatedVolumeAttachmentList
	if err := src.List(ctx, &rvas, src.onNode(node)); err != nil {
		return f, err
	}
	for _, a := range rvas.Items {
		attached[a.Spec.ReplicatedVolumeName] = true
	}
	for v := range attached {
		f.attached = append(f.attached, v)
	}
	sort.Strings(f.attached)
	sort.Slice(f.volumes, func(i, j int) bool { return f.volumes[i].rv.Name < f.volumes[j].rv.Name })
	return f, nil
}

// maintenanceView is what the volumes read of the maintenances: the nodes taken down
// (ReadyForMaintenance, or Returning, not in sync yet), whose members are never
// force-removed — a node that crashes while Draining is lost as any other —, and the
// volumes copied elsewhere first (status.copiedVolumes of a maintenance neither
// Completed nor Failed), which tolerate one more failure until it ends.
func (c *Controller) maintenanceView(ctx context.Context) (away, copied map[string]bool, err error) {
	var list v1.ReplicatedNodeMaintenanceList
	if err := c.reader.List(ctx, &list); err != nil {
		return nil, nil, err
	}
	away, copied = map[string]bool{}, map[string]bool{}
	for _, m := range list.Items {
		if m.Status.Phase == v1.MaintenanceReadyForMaintenance || m.Status.Phase == v1.MaintenanceReturning {
			away[m.Spec.NodeName] = true
		}
		if m.Status.Phase != v1.MaintenanceCompleted && m.Status.Phase != v1.MaintenanceFailed {
			for _, name := range m.Status.CopiedVolumes {
				copied[name] = true
			}
		}
	}
	return away, copied, nil
}
