package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/placement"
)

// nodeLoads is placement's view of the replicas on each node (placementNodes): how
// many replicas a node holds, and how much of each pool's free space its Diskful
// replicas take that are placed but not backed yet (the agent reports a pool's free
// space only once it created the backing volume). It is kept from the cache's events
// on replicas and volumes, so a placement costs O(nodes): reading it from the cache
// meant a list of each node's replicas, and of every volume for their sizes, per
// placement, O(N) per volume placed and O(N²) for N volumes (docs/scale.md,
// "Sixth pass").
//
// The counts follow the cache a moment behind (the informer updates its store before
// it hands the event on), so waitForCache waits for them, not for the store: a
// reconcile that created replicas returns only once the next placement counts them.
type nodeLoads struct {
	mu       sync.Mutex
	replicas map[string]replicaLoad // replica name → what it counts for
	nodes    map[string]*nodeLoad
	sizes    map[string]int64 // volume name → spec.size in bytes
	// unbacked: volume name → its replicas counted in a node's unbacked bytes, whose
	// share moves with the volume's size.
	unbacked map[string]map[string]bool
	synced   []func() bool // the event handlers' HasSynced
}

// replicaLoad is what one replica counts for.
type replicaLoad struct {
	node, volume string
	deleting     bool
	// pool is set when the replica is a Diskful replica placed, not being deleted and
	// not backed yet (no status.backingVolume) of a pool; bytes is its share of the
	// pool's space on its node (placement.BackingBytes of the volume's size).
	pool  string
	bytes int64
}

type nodeLoad struct {
	replicas int
	unbacked map[string]int64 // pool → bytes of Diskful replicas placed, not backed yet
}

func newNodeLoads() *nodeLoads {
	return &nodeLoads{replicas: map[string]replicaLoad{}, nodes: map[string]*nodeLoad{},
		sizes: map[string]int64{}, unbacked: map[string]map[string]bool{}}
}

// register feeds l from the cache's informers of replicas and volumes.
func (l *nodeLoads) register(ctx context.Context, c cache.Cache) error {
	for _, x := range []struct {
		obj client.Object
		set func(any)
		del func(string)
	}{
		{&v1.ReplicatedVolumeReplica{}, func(o any) {
			if r, ok := o.(*v1.ReplicatedVolumeReplica); ok {
				l.setReplica(r)
			}
		}, l.deleteReplica},
		{&v1.ReplicatedVolume{}, func(o any) {
			if rv, ok := o.(*v1.ReplicatedVolume); ok {
				l.setVolume(rv.Name, rv.Spec.Size.Value())
			}
		}, l.deleteVolume},
	} {
		inf, err := c.GetInformer(ctx, x.obj)
		if err != nil {
			return fmt.Errorf("informer of %T for placement's node counts: %w", x.obj, err)
		}
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    x.set,
			UpdateFunc: func(_, o any) { x.set(o) },
			DeleteFunc: func(o any) {
				if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				if m, ok := o.(client.Object); ok {
					x.del(m.GetName())
				}
			},
		})
		if err != nil {
			return fmt.Errorf("watching %T for placement's node counts: %w", x.obj, err)
		}
		l.synced = append(l.synced, reg.HasSynced)
	}
	return nil
}

// waitSynced waits until the handlers have seen the informers' initial lists: until
// then a node's counts are short of its replicas.
func (l *nodeLoads) waitSynced(ctx context.Context) error {
	for {
		done := true
		for _, s := range l.synced {
			done = done && s()
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("placement's node counts not synced: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// load returns the replicas on node and the bytes its unbacked Diskful replicas of
// pool take.
func (l *nodeLoads) load(node, pool string) (replicas int, unbacked int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodes[node]
	if n == nil {
		return 0, 0
	}
	return n.replicas, n.unbacked[pool]
}

// seen reports whether the counts hold replica name, and whether it is being deleted.
func (l *nodeLoads) seen(name string) (present, deleting bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.replicas[name]
	return ok, r.deleting
}

func (l *nodeLoads) setReplica(r *v1.ReplicatedVolumeReplica) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remove(r.Name)
	x := replicaLoad{node: r.Spec.NodeName, volume: r.Spec.ReplicatedVolumeName, deleting: r.DeletionTimestamp != nil}
	if r.Spec.NodeName != "" && r.Spec.Type == v1.ReplicaTypeDiskful && r.Status.BackingVolume == nil &&
		!x.deleting && r.Spec.Storage != nil {
		x.pool, x.bytes = r.Spec.Storage.Pool, placement.BackingBytes(l.sizes[x.volume])
	}
	l.replicas[r.Name] = x
	l.add(r.Name, x, 1)
}

func (l *nodeLoads) deleteReplica(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remove(name)
}

// remove takes replica name's share off its node; l.mu is held.
func (l *nodeLoads) remove(name string) {
	if x, ok := l.replicas[name]; ok {
		l.add(name, x, -1)
		delete(l.replicas, name)
	}
}

// add adds (sign 1) or takes off (sign -1) what x counts for; l.mu is held.
func (l *nodeLoads) add(name string, x replicaLoad, sign int) {
	if x.node == "" {
		return // not placed: on no node
	}
	n := l.nodes[x.node]
	if n == nil {
		n = &nodeLoad{unbacked: map[string]int64{}}
		l.nodes[x.node] = n
	}
	n.replicas += sign
	if x.pool != "" {
		n.unbacked[x.pool] += int64(sign) * x.bytes
		if n.unbacked[x.pool] == 0 {
			delete(n.unbacked, x.pool)
		}
		if sign > 0 {
			if l.unbacked[x.volume] == nil {
				l.unbacked[x.volume] = map[string]bool{}
			}
			l.unbacked[x.volume][name] = true
		} else {
			delete(l.unbacked[x.volume], name)
			if len(l.unbacked[x.volume]) == 0 {
				delete(l.unbacked, x.volume)
			}
		}
	}
	if n.replicas == 0 && len(n.unbacked) == 0 {
		delete(l.nodes, x.node)
	}
}

// setVolume records a volume's size; its unbacked replicas take their share anew
// (an expansion, or a replica seen before its volume).
func (l *nodeLoads) setVolume(name string, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.sizes[name]; ok && old == size {
		return
	}
	l.sizes[name] = size
	l.resize(name)
}

func (l *nodeLoads) deleteVolume(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.sizes, name)
	l.resize(name)
}

// resize recomputes the share of volume name's unbacked replicas; l.mu is held.
func (l *nodeLoads) resize(volume string) {
	var names []string // add changes the set: read it first
	for name := range l.unbacked[volume] {
		names = append(names, name)
	}
	for _, name := range names {
		x := l.replicas[name]
		l.add(name, x, -1)
		x.bytes = placement.BackingBytes(l.sizes[volume])
		l.replicas[name] = x
		l.add(name, x, 1)
	}
}
