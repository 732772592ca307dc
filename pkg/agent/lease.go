package agent

import (
	"context"
	"errors"
	"maps"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/storage"
)

// runLease renews the node's Lease every RenewInterval until ctx ends: the
// agent's liveness, and the carrier of the node's facts (docs/contract.md
// "Node facts and liveness"). It is the one periodic write the agent makes.
func (a *Agent) runLease(ctx context.Context) error {
	var lease *coordinationv1.Lease
	t := time.NewTicker(a.cfg.RenewInterval)
	defer t.Stop()
	for {
		var err error
		if lease, err = a.renewLease(ctx, lease); err != nil && ctx.Err() == nil {
			a.log.Error(err, "renewing the node Lease")
			lease = nil // read it again next time
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// capabilities is what the agent announces on its Lease (v1alpha1.AnnotationCapabilities):
// it derives a volume's shared secret from the cluster key (sharedSecret), so the
// controller may give new volumes derived references once every agent announces it
// (docs/contract.md, "The shared secret"; docs/install.md, "Upgrading"); and it takes
// its replicas of a volume that goes down on the volume's deletion mark and releases
// them (volumeGoes), so the controller deletes them only then (docs/contract.md,
// "Deleting a volume").
var capabilities = []string{v1.CapabilityDerivedSharedSecret, v1.CapabilityTearDownWithVolume}

// LeaseName is the name of a node's agent Lease.
func LeaseName(node string) string { return v1.AgentLeasePrefix + node }

// renewLease writes the Lease once. A write that fails leaves nothing behind in the
// agent's memory: the next renewal reads the Lease again and compares the facts with
// what it holds, so a capacity annotation that never reached the apiserver is written
// then (an apiserver restart or a slow write under load must not leave a node out of
// its pools for good: the controller counts a node ready in a pool only with its
// capacity annotation, docs/contract.md "Node facts and liveness").
func (a *Agent) renewLease(ctx context.Context, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	// Each apiserver call gets a budget of two renew intervals, started when
	// it is made; the facts are gathered in between on a budget of their own
	// (fillLease). A slow fact delays a renewal but never cancels it: on a
	// starved node an lvs that used up one shared budget left the write none,
	// every renewal failed, and the controller declared the node lost
	// (test/vm/FINDINGS.md, "The product on real DRBD" 10).
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(ctx, a.cfg.RenewInterval*2)
	}
	if lease == nil {
		lease = &coordinationv1.Lease{}
		gctx, cancel := call()
		err := a.reader.Get(gctx, types.NamespacedName{Namespace: a.cfg.Namespace, Name: LeaseName(a.cfg.NodeName)}, lease)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: a.cfg.Namespace, Name: LeaseName(a.cfg.NodeName)}}
			dirty := a.fillLease(ctx, lease)
			cctx, cancel := call()
			defer cancel()
			if err := a.client.Create(cctx, lease); err != nil {
				a.keepCapacityDirty(dirty)
				return nil, err
			}
			return lease, nil
		case err != nil:
			return nil, err
		}
	}
	next := lease.DeepCopy()
	dirty := a.fillLease(ctx, next)
	uctx, cancel := call()
	defer cancel()
	if err := a.client.Update(uctx, next); err != nil {
		a.keepCapacityDirty(dirty)
		return nil, err
	}
	return next, nil
}

// keepCapacityDirty marks the capacity as changed again after a write of the Lease
// that carried a change failed.
func (a *Agent) keepCapacityDirty(dirty bool) {
	if dirty {
		a.markCapacity()
	}
}

// fillLease sets holder, times and the facts. A capacity annotation is written when
// the Lease l lacks it (or holds one that does not parse), when free space moved by at
// least min(1 % of total, 1 GiB) from the value l holds, or when a backing volume was
// created or deleted; otherwise the previous value stays. It compares with l, not with
// what the agent last tried to write, so a failed write is made again. It returns
// whether it consumed the agent's "backing volume created or deleted" mark.
func (a *Agent) fillLease(ctx context.Context, l *coordinationv1.Lease) bool {
	// The renewal time is taken once the facts are in, so that a slow one
	// does not age the renewal it delays.
	defer func() {
		now := metav1.NewMicroTime(time.Now())
		holder := a.cfg.NodeName
		secs := int32(a.cfg.LeaseDuration / time.Second)
		l.Spec.HolderIdentity = &holder
		l.Spec.LeaseDurationSeconds = &secs
		l.Spec.RenewTime = &now
		if l.Spec.AcquireTime == nil {
			l.Spec.AcquireTime = &now
		}
	}()
	ann := maps.Clone(l.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	ann[v1.AnnotationAddresses] = strings.Join(a.addressStrings(), ",")
	ann[v1.AnnotationZone] = a.cfg.Zone
	ann[v1.AnnotationHMACAlgorithms] = strings.Join(a.cfg.HMACAlgorithms, ",")
	ann[v1.AnnotationVerifyAlgorithms] = strings.Join(a.cfg.VerifyAlgorithms, ",")
	ann[v1.AnnotationAgentVersion] = a.cfg.Version
	// What this agent understands, in every write of the Lease (no write of its own),
	// with the version that says so: an earlier agent that replaces this one keeps the
	// announcement but rewrites the version, which voids it (agentlease.Capabilities).
	ann[v1.AnnotationCapabilities] = strings.Join(capabilities, ",")
	ann[v1.AnnotationCapabilitiesAgentVersion] = a.cfg.Version

	a.mu.Lock()
	dirty := a.capDirty
	a.capDirty = false
	a.mu.Unlock()
	// Every pool's capacity within one renew interval: lvs on a busy node
	// takes seconds, and the renewal waits for it.
	cctx, cancel := context.WithTimeout(ctx, a.cfg.RenewInterval)
	defer cancel()
	var kinds PoolTypes // of the pools served here, for the prerequisite check
	var rsps v1.ReplicatedStoragePoolList
	if err := a.cache.List(ctx, &rsps); err == nil {
		served := map[string]bool{}
		for i := range rsps.Items {
			if ctx.Err() != nil {
				// Stopping: the renewal is abandoned, and the runnable must return
				// without measuring the pools left (docs/operating.md, "Stopping an agent").
				return dirty
			}
			rsp := &rsps.Items[i]
			p, err := a.providerFor(ctx, rsp)
			if err != nil {
				continue // not served here
			}
			kinds.add(rsp.Spec.Type)
			c, err := p.Capacity(cctx)
			if err != nil {
				a.log.Error(err, "pool capacity", "pool", rsp.Name)
				// A measurement that ran out of time says nothing about the
				// pool: the capacity the Lease holds stays, and the node
				// with it. Any other failure (the volume group gone) takes
				// the node out of the pool.
				if errors.Is(err, storage.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
					served[rsp.Name] = true
				}
				continue
			}
			served[rsp.Name] = true
			a.poolMetrics.set(rsp.Name, c.TotalBytes, c.FreeBytes)
			key := v1.AnnotationPoolCapacityPrefix + rsp.Name
			// A missing annotation does not parse either.
			if last, err := v1.ParsePoolCapacity(ann[key]); err != nil || dirty || moved(last, c.TotalBytes, c.FreeBytes) {
				ann[key] = v1.PoolCapacity{Total: c.TotalBytes, Free: c.FreeBytes}.String()
			}
		}
		for k := range ann {
			if pool, ok := strings.CutPrefix(k, v1.AnnotationPoolCapacityPrefix); ok && !served[pool] {
				delete(ann, k)
				a.poolMetrics.forget(pool)
			}
		}
	}
	delete(ann, v1.AnnotationPrerequisites)
	if a.cfg.Prerequisites != nil {
		if missing := a.cfg.Prerequisites(kinds); len(missing) > 0 {
			ann[v1.AnnotationPrerequisites] = strings.Join(missing, "; ")
		}
	}
	l.Annotations = ann
	return dirty
}

// PoolTypes are the kinds of storage pool a node serves, which decide part of its
// prerequisites: an LVM pool needs device-mapper, an LVMThin pool its thin target too.
type PoolTypes struct{ LVM, Thin bool }

func (t *PoolTypes) add(pt v1.PoolType) {
	switch pt {
	case v1.PoolTypeLVM:
		t.LVM = true
	case v1.PoolTypeLVMThin:
		t.Thin = true
	}
}

func moved(last v1.PoolCapacity, total, free int64) bool {
	if total != last.Total {
		return true
	}
	threshold := min(total/100, int64(1)<<30)
	d := free - last.Free
	if d < 0 {
		d = -d
	}
	return d >= threshold
}
