package agent

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The agent's metrics (docs/operating.md, "Agent metrics"), served on its metrics endpoint by
// controller-runtime's registry. Per resource they describe what the agent last
// reported in the replica's status (the same view the controller and `kubectl
// meshvol` read), computed at scrape time from the informer cache: nothing is
// stored twice and a deleted replica leaves no series behind. Labels are bounded:
// a volume label only where one series per volume is the point (as kube-state-metrics
// does for PVCs), peers by node, states by DRBD's fixed vocabularies.

var (
	drbdCommandSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "meshvol_agent_drbd_command_duration_seconds",
		Help:    "Time the node agent's DRBD commands took (drbdadm, drbdsetup, drbdmeta), by command, failed or not.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	}, []string{"command"})
	drbdCommandFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "meshvol_agent_drbd_command_failures_total",
		Help: "DRBD commands of the node agent that returned an error (including a timeout), by command.",
	}, []string{"command"})
	attachStallCycles = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meshvol_agent_attach_stall_cycles_total",
		Help: "Connections the node agent disconnected and connected again because a disk attached beside connected peers stayed Negotiating (a DRBD 9.2 attach that lost a peer's handshake).",
	})
	collectorPasses = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "meshvol_agent_collector_passes_total",
		Help: "Passes of the node agent's collector of orphaned DRBD resources and backing volumes that read every replica, resource and backing volume of the node (a pass with nothing changed since the last is skipped).",
	})
)

func init() {
	metrics.Registry.MustRegister(drbdCommandSeconds, drbdCommandFailures, collectorPasses, attachStallCycles)
}

// observeCommand records one DRBD command's duration and outcome. The failure counter
// of a command exists from its first run, at 0: an alert on its increase sees the first
// failure, which it would miss on a series that appears with it.
func observeCommand(command string, start time.Time, err error) {
	drbdCommandSeconds.WithLabelValues(command).Observe(time.Since(start).Seconds())
	failures := drbdCommandFailures.WithLabelValues(command)
	if err != nil {
		failures.Inc()
	}
}

// capacity is a pool's size and free space, in bytes.
type capacity struct{ total, free int64 }

// poolStats is the last capacity the agent measured of each pool it serves, kept by
// the Lease renewal (which measures it anyway) for the metrics. The zero value is
// ready to use.
type poolStats struct {
	mu    sync.Mutex
	pools map[string]capacity
}

func (s *poolStats) set(pool string, total, free int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pools == nil {
		s.pools = map[string]capacity{}
	}
	s.pools[pool] = capacity{total: total, free: free}
}

func (s *poolStats) forget(pool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pools, pool)
}

func (s *poolStats) snapshot() map[string]capacity {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]capacity, len(s.pools))
	for k, v := range s.pools {
		out[k] = v
	}
	return out
}

// replicaSource returns the node's replicas and their volumes by name.
type replicaSource func(ctx context.Context) ([]v1.ReplicatedVolumeReplica, map[string]*v1.ReplicatedVolume, error)

// nodeCollector is the per-node Prometheus collector of one agent. Its series carry
// the node as a constant label, so the agents of an in-process cluster register side
// by side.
type nodeCollector struct {
	source replicaSource
	pools  *poolStats
	onErr  func(error)

	role, disk, quorum, suspended, current *prometheus.Desc
	peerState, peerOutOfSync, peerResync   *prometheus.Desc
	poolTotal, poolFree, replicas          *prometheus.Desc
}

// diskStates and roles are DRBD's vocabularies as the API spells them; every value is
// exported (1 for the current one, 0 for the others), as kube-state-metrics does for
// enumerations, so a query sees a change as a value and not as a vanished series.
var (
	diskStates = []v1.DiskState{v1.DiskStateDiskless, v1.DiskStateAttaching, v1.DiskStateDetaching, v1.DiskStateFailed,
		v1.DiskStateNegotiating, v1.DiskStateInconsistent, v1.DiskStateOutdated, v1.DiskStateUnknown, v1.DiskStateConsistent,
		v1.DiskStateUpToDate}
	roles = []v1.ReplicaRole{v1.RolePrimary, v1.RoleSecondary, v1.RoleUnknown}
)

// notInDatamesh is the type label of a replica that is not a datamesh member.
const notInDatamesh = "NotInDatamesh"

func newNodeCollector(node string, source replicaSource, pools *poolStats, onErr func(error)) *nodeCollector {
	c := prometheus.Labels{"node": node}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, c)
	}
	return &nodeCollector{
		source: source, pools: pools, onErr: onErr,
		role:      d("meshvol_agent_replica_role", "DRBD role of the volume's replica on this node: 1 for the current role.", "volume", "role"),
		disk:      d("meshvol_agent_replica_disk_state", "DRBD disk state of the volume's replica on this node: 1 for the current state.", "volume", "state"),
		quorum:    d("meshvol_agent_replica_quorum", "1 when the replica's DRBD has quorum, 0 when not; absent before DRBD reports it.", "volume"),
		suspended: d("meshvol_agent_replica_io_suspended", "1 when DRBD holds the replica's IO (suspend-io without quorum or data).", "volume"),
		current: d("meshvol_agent_replica_revision_current",
			"1 when DRBD on this node runs the volume's current datamesh revision, 0 while the agent has not applied it.", "volume"),
		peerState: d("meshvol_agent_peer_connection_state",
			"DRBD connection state of the replica to the peer on peer_node: 1 for the current state.", "volume", "peer_node", "state"),
		peerOutOfSync: d("meshvol_agent_peer_out_of_sync_bytes",
			"Bytes still to resynchronise with the peer while a resync runs, 0 when connected and in sync; absent when unknown.", "volume", "peer_node"),
		peerResync: d("meshvol_agent_peer_resync_progress_ratio", "Share of the device in sync with the peer while a resync runs, 0 to 1.", "volume", "peer_node"),
		poolTotal:  d("meshvol_agent_pool_capacity_bytes", "Size of the storage pool on this node.", "pool"),
		poolFree:   d("meshvol_agent_pool_free_bytes", "Bytes of the storage pool on this node that can still be allocated.", "pool"),
		replicas: d("meshvol_agent_replicas",
			"Replicas on this node by datamesh member type ("+notInDatamesh+" for a replica that is not a member).", "type"),
	}
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.role, c.disk, c.quorum, c.suspended, c.current, c.peerState, c.peerOutOfSync,
		c.peerResync, c.poolTotal, c.poolFree, c.replicas} {
		ch <- d
	}
}

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	for pool, cp := range c.pools.snapshot() {
		ch <- prometheus.MustNewConstMetric(c.poolTotal, prometheus.GaugeValue, float64(cp.total), pool)
		ch <- prometheus.MustNewConstMetric(c.poolFree, prometheus.GaugeValue, float64(cp.free), pool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rvrs, rvs, err := c.source(ctx)
	if err != nil {
		// The cache is not synced yet, or stopping: no replica series this scrape
		// rather than a wrong count.
		if c.onErr != nil {
			c.onErr(err)
		}
		return
	}
	byType := map[string]int{}
	for i := range rvrs {
		byType[c.collectReplica(ch, &rvrs[i], rvs[rvrs[i].Spec.ReplicatedVolumeName])]++
	}
	for t, n := range byType {
		ch <- prometheus.MustNewConstMetric(c.replicas, prometheus.GaugeValue, float64(n), t)
	}
}

// collectReplica emits one replica's series and returns its member type.
func (c *nodeCollector) collectReplica(ch chan<- prometheus.Metric, r *v1.ReplicatedVolumeReplica, rv *v1.ReplicatedVolume) string {
	vol, st := r.Spec.ReplicatedVolumeName, &r.Status
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{vol}, labels...)...)
	}
	for _, role := range roles {
		gauge(c.role, boolValue(st.Role == role), string(role))
	}
	for _, s := range diskStates {
		gauge(c.disk, boolValue(st.DiskState == s), string(s))
	}
	if st.Quorum != nil {
		gauge(c.quorum, boolValue(*st.Quorum))
	}
	gauge(c.suspended, boolValue(st.IOSuspended))
	typ := notInDatamesh
	if rv != nil {
		gauge(c.current, boolValue(st.DatameshRevision > 0 && st.DatameshRevision >= rv.Status.DatameshRevision))
		for _, m := range rv.Status.Datamesh.Members {
			if m.Name == r.Name {
				typ = string(m.Type)
			}
		}
	}
	for _, p := range st.Peers {
		// A peer replica is named <volume>-<node> (v1alpha1.ReplicaName).
		peer := strings.TrimPrefix(p.Name, vol+"-")
		gauge(c.peerState, 1, peer, p.ConnectionState)
		switch {
		case p.Resync != nil:
			gauge(c.peerOutOfSync, float64(p.Resync.OutOfSyncBytes), peer)
			gauge(c.peerResync, float64(p.Resync.PercentDone)/100, peer)
		case p.ConnectionState == "Connected" && p.ReplicationState == "Established":
			gauge(c.peerOutOfSync, 0, peer)
		}
	}
	return typ
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// cacheSource reads the node's replicas (the cache holds only this node's) and their
// volumes from the agent's informer cache.
func (a *Agent) cacheSource(ctx context.Context) ([]v1.ReplicatedVolumeReplica, map[string]*v1.ReplicatedVolume, error) {
	var list v1.ReplicatedVolumeReplicaList
	if err := a.cache.List(ctx, &list); err != nil {
		return nil, nil, err
	}
	rvs := map[string]*v1.ReplicatedVolume{}
	for _, r := range list.Items {
		name := r.Spec.ReplicatedVolumeName
		if _, done := rvs[name]; done {
			continue
		}
		rv := &v1.ReplicatedVolume{}
		if err := a.cache.Get(ctx, client.ObjectKey{Name: name}, rv); err != nil {
			rv = nil // deleted: the replica is reported without a revision verdict
		}
		rvs[name] = rv
	}
	return list.Items, rvs, nil
}
