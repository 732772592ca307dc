package agent

import (
	"context"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/storage"
)

// runGC looks for DRBD resources and backing volumes that no replica of this
// node owns any more and removes them: a node that comes back after the
// controller force-removed its replicas finds them gone (docs/contract.md
// "Node that is gone") and must never reuse their stale data. A backing volume
// is owned by its key (backingKey), so the volume of a force-removed replica
// goes even when a new replica of the same name is already placed here.
//
// It runs only with a synced cache and a synced Observer: an empty cache
// must never read as "nothing is ours" (kubelet's reconstruct.go: unknown
// never means delete). A pass runs every GCInterval, as soon as a replica
// of this node is gone from the cache (what it ran is then no replica's:
// a node back from a partition learns so only now) unless this agent took
// that replica down and released it itself (released), and again when the
// take-down of a resource was refused, once it may be tried again (the
// device of a stale Primary stays held until its pod is gone).
//
// A pass reads every replica, resource and backing volume of the node, so a
// pass every GCInterval would cost an idle node work in proportion to its
// replicas. A pass whose inputs have not changed since the last one found
// nothing to do finds nothing again, so the clock's pass is skipped when
// neither the kernel (an Observer change), nor the replicas (a reconcile, which
// every replica event comes with, or a backing volume created or deleted),
// nor the pools have changed since (a.changes, collectInputs); a full pass
// still runs every GCFullInterval, in case a change came by a way not counted.
func (a *Agent) runGC(ctx context.Context) error {
	if !a.cache.WaitForCacheSync(ctx) {
		return nil
	}
	due := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	var last, lastPass time.Time
	var clean *collectInputs // the inputs of the last pass, when it found nothing to do
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-a.collectNow:
			// Replicas deleted by the thousand ask for a pass each: one a
			// second is enough.
			if soon := last.Add(collectSpacing); soon.Before(due) {
				due = soon
				t.Reset(time.Until(due))
			}
			continue
		case <-t.C:
		}
		last = time.Now()
		next := a.cfg.GCInterval
		in := a.collectInputs(ctx)
		switch {
		case !a.obs.Synced():
			next = min(next, collectSpacing)
			clean = nil
		case clean != nil && *clean == in && last.Sub(lastPass) < a.cfg.GCFullInterval:
			// Nothing changed since a pass that found nothing to do.
		default:
			lastPass = last
			collectorPasses.Inc()
			retry, acted := a.collect(ctx)
			clean = nil
			switch {
			case retry > 0:
				next = min(next, retry)
			case !acted: // what a pass takes down or deletes is a change of its own
				clean = &in
			}
		}
		due = last.Add(next)
		t.Reset(next)
	}
}

// collectInputs is what a collector pass depends on, cheaply: how many changes of the
// kernel and of the replicas the agent has seen, and the pools' specs (generations: a
// status the controller writes as capacity drifts is no change to the collector).
type collectInputs struct {
	changes uint64
	pools   string
}

// collectInputs reads the inputs before a pass: a change counted after it is seen by
// the next one.
func (a *Agent) collectInputs(ctx context.Context) collectInputs {
	in := collectInputs{changes: a.changes.Load()}
	var rsps v1.ReplicatedStoragePoolList
	if err := a.cache.List(ctx, &rsps, client.UnsafeDisableDeepCopy); err != nil {
		in.pools = "unknown: " + err.Error()
		return in
	}
	var b strings.Builder
	for i := range rsps.Items {
		b.WriteString(rsps.Items[i].Name + "@" + strconv.FormatInt(rsps.Items[i].Generation, 10) + " ")
	}
	in.pools = b.String()
	return in
}

// collectSpacing is the least time between two collector passes asked for
// by events (requestCollect) rather than by the clock.
const collectSpacing = time.Second

// requestCollect asks for a collector pass soon; one already asked for is
// enough.
func (a *Agent) requestCollect() {
	select {
	case a.collectNow <- struct{}{}:
	default:
	}
}

// released is a replica this agent took down and then released (releaseReplica): its
// DRBD resource down (leave), its configuration and its backing volume deleted, and the
// agent's own finalizer released by this agent. Such a replica leaves nothing on the
// node, so its departure from the cache asks for no collector pass: deleting thousands
// of volumes at once, those passes (one a second per agent, each listing every backing
// volume of the node) were about 8 % of the bench process's CPU (docs/scale.md, "What
// is left of the deletion after the ninth pass"). Every other departure asks for one: a
// replica force-removed by the controller, one whose finalizer someone else released,
// one whose take-down or backing volume deletion failed (it is then not released), one
// released by an agent since restarted (the marks live in memory only). Two leftovers
// no departure announces are the clock's to find, each a change (collectInputs): a
// resource the event stream had not shown yet when leave decided (it takes down what
// the Observer shows running), and the backing volume of an earlier replica of the
// name that no reconcile found gone (the cache showed the next one at once; its
// resource is evicted, evictEarlierIncarnation, its backing volume is the collector's).
//
// A mark is by UID: a replica created again under the name is another replica, and a
// reconcile that finds it drops the earlier one's mark (releasedHere), so that its own
// departure asks for a pass. The agent acts for a replica only in a reconcile that finds
// it, and the reconciles of one name never run at once, so a mark present when the name
// is found gone means that the last replica of the name the agent acted for is one it
// released.
type released struct {
	uid types.UID
	// gone: when a reconcile first found the name gone from the cache; zero while
	// it is there.
	gone time.Time
}

// releasedKeep is how long a mark outlives its replica's departure from the cache. A
// name may be found gone more than once (an event queued while the replica was still
// cached, then its deletion's own, which the informer hands on after it left the
// cache), and none of these asks for a pass. Then the mark goes (goneReplica), so that
// the marks kept are those of the node's replicas still in the cache and of those gone
// in the last minute or two: a mark whose name is never found gone is one whose replica
// is still cached, or was replaced by one of the same name, which drops it.
const releasedKeep = time.Minute

// markReleased records that rvr is released here (released).
func (a *Agent) markReleased(rvr *v1.ReplicatedVolumeReplica) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.released[rvr.Name] = released{uid: rvr.UID}
}

// releasedHere: rvr, as the cache shows it, is a replica this agent released; its
// deletion comes next, or has come already and the cache has yet to show it. A mark of
// another replica of that name is dropped.
func (a *Agent) releasedHere(rvr *v1.ReplicatedVolumeReplica) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, ok := a.released[rvr.Name]
	if ok && m.uid != rvr.UID {
		delete(a.released, rvr.Name)
		return false
	}
	return ok
}

// goneReplica is told that the cache has no replica called name (any more) and says
// whether a collector pass should look for what it ran: not for a replica this agent
// released (released). It forgets the marks found gone more than releasedKeep ago, at
// most once per releasedKeep.
func (a *Agent) goneReplica(name string, now time.Time) (collect bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.releasedSwept) >= releasedKeep {
		for n, m := range a.released {
			if !m.gone.IsZero() && now.Sub(m.gone) >= releasedKeep {
				delete(a.released, n)
			}
		}
		a.releasedSwept = now
	}
	m, ok := a.released[name]
	if !ok {
		return true
	}
	if m.gone.IsZero() {
		m.gone = now
		a.released[name] = m
	}
	return false
}

// collect is one pass. The kernel and the pools are listed before the
// replicas: whatever the agent created was for a replica already in the
// cache, so a replica created meanwhile is never mistaken for a missing one.
// It returns when to look again for a take-down that was refused, 0 if
// none was.
// acted says whether it took anything down or deleted anything.
func (a *Agent) collect(ctx context.Context) (retry time.Duration, acted bool) {
	// The event stream's view of the kernel, not `drbdsetup status all`: the
	// collector runs only while the Observer is synced, and a resource the
	// stream has not shown yet was created for a replica already in the cache.
	resources := a.obs.Resources()
	type poolVols struct {
		name string
		vols []string
	}
	var pools []poolVols
	var rsps v1.ReplicatedStoragePoolList
	if err := a.cache.List(ctx, &rsps); err != nil {
		return 0, false
	}
	for i := range rsps.Items {
		if ctx.Err() != nil {
			return 0, false // stopping: no pass on half the pools (docs/operating.md, "Stopping an agent")
		}
		p, err := a.providerFor(ctx, &rsps.Items[i])
		if err != nil {
			continue
		}
		names, err := volumeNames(ctx, p)
		if err != nil {
			a.log.Error(err, "gc: listing pool", "pool", rsps.Items[i].Name)
			continue
		}
		pools = append(pools, poolVols{name: rsps.Items[i].Name, vols: names})
	}
	var rvrs v1.ReplicatedVolumeReplicaList
	// Read only, without copies: the sweep reads every replica of the node.
	if err := a.cache.List(ctx, &rvrs, client.MatchingLabels{v1.LabelNode: a.cfg.NodeName}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, false
	}
	volumes, replicas := map[string]bool{}, map[string]bool{}
	for i := range rvrs.Items {
		volumes[rvrs.Items[i].Spec.ReplicatedVolumeName] = true
		replicas[backingKey(&rvrs.Items[i])] = true
	}
	for _, r := range resources {
		if volumes[r] {
			continue
		}
		if err := a.downs.wait(r); err != nil {
			retry = minRetry(retry, retryAfter(err, 0))
			continue
		}
		a.log.Info("gc: no replica of this node owns DRBD resource; taking it down", "resource", r)
		acted = true
		if err := a.takeDown(ctx, r); err != nil {
			a.log.Error(err, "gc: taking down", "resource", r)
			retry = minRetry(retry, retryAfter(err, 0))
		}
	}
	for _, pv := range pools {
		for _, replica := range pv.vols {
			if replicas[replica] {
				continue
			}
			p, err := a.provider(ctx, pv.name)
			if err != nil {
				continue
			}
			a.log.Info("gc: no replica owns backing volume; deleting it", "pool", pv.name, "replica", replica)
			acted = true
			if err := p.Delete(ctx, replica); err != nil {
				a.log.Error(err, "gc: deleting backing volume", "replica", replica)
				continue
			}
			a.markCapacity()
		}
	}
	return retry, acted
}

// minRetry is the sooner of two retries, 0 meaning none.
func minRetry(a, b time.Duration) time.Duration {
	if a == 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// namesLister is a provider that lists its volumes' names more cheaply than List,
// which resolves each volume's device (the file pool checks every loop device's
// status): the collector needs only the names.
type namesLister interface {
	Names(ctx context.Context) ([]string, error)
}

// volumeNames lists the names of p's volumes.
func volumeNames(ctx context.Context, p storage.Provider) ([]string, error) {
	if n, ok := p.(namesLister); ok {
		return n.Names(ctx)
	}
	vols, err := p.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(vols))
	for _, v := range vols {
		out = append(out, v.Replica)
	}
	return out, nil
}
