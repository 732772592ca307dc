package controller

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/meshvol/meshvol/pkg/agentlease"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/datamesh/layout"
)

// The controller's state metrics (docs/operating.md, "Controller metrics"): what the
// volumes, their transitions and the nodes' agents look like now, computed at scrape
// time from the informer cache, so they agree with the volumes' status and with
// `kubectl meshvol`, store nothing twice, and a deleted volume leaves no series. Only
// the elected controller serves them (stateCollector runs as a leader runnable): a
// standby's cache would count every volume a second time.

var (
	volumePhases = []v1.VolumePhase{v1.VolumePhasePending, v1.VolumePhaseForming, v1.VolumePhaseReady, v1.VolumePhaseDegraded,
		v1.VolumePhaseReconfiguring, v1.VolumePhaseFailed, v1.VolumePhaseDeleting}
	transitionTypes = []v1.TransitionType{v1.TransitionFormation, v1.TransitionAddReplica, v1.TransitionRemoveReplica,
		v1.TransitionForceRemoveReplica, v1.TransitionChangeReplicaType, v1.TransitionChangeQuorum, v1.TransitionAttach,
		v1.TransitionDetach, v1.TransitionForceDetach, v1.TransitionEnableMultiattach, v1.TransitionDisableMultiattach}
)

// Agent states of meshvol_controller_node_agent_state: the Lease verdict
// (agentlease.Judge) in three words.
const (
	agentLive    = "Live"
	agentExpired = "Expired" // expired, within the grace period: nothing decided yet
	agentLost    = "Lost"
)

// stateSource reads what the collector describes.
type stateSource func(ctx context.Context) (stateSnapshot, error)

type stateSnapshot struct {
	rvs    []v1.ReplicatedVolume
	rvrs   []v1.ReplicatedVolumeReplica
	leases []coordinationv1.Lease
}

type stateCollector struct {
	source stateSource
	now    func() time.Time
	grace  time.Duration
	onErr  func(error)
	// fleet judges the agents together (the controller's disruption.observe), so a
	// node is shown Lost exactly when the controller treats it as lost; nil: each
	// Lease alone.
	fleet func(map[string]*coordinationv1.Lease, time.Time) agentlease.Fleet

	volumes, volumesByLayout, volumePhase                  *prometheus.Desc
	ftt, gmdr, diskfulUpToDate, diskfulWanted, quorum      *prometheus.Desc
	transitions, transitionStepWait, nodes, nodeAgentState *prometheus.Desc
}

func newStateCollector(source stateSource, now func() time.Time, grace time.Duration, onErr func(error)) *stateCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &stateCollector{
		source: source, now: now, grace: grace, onErr: onErr,
		volumes: d("meshvol_controller_volumes", "Volumes by phase (status.phase; a volume the controller has not judged yet counts as Pending).", "phase"),
		volumesByLayout: d("meshvol_controller_volumes_by_layout",
			"Volumes by configured layout and by the layout the datamesh provides now (status.effectiveLayout, \"none\" before it forms).",
			"configured", "effective"),
		volumePhase: d("meshvol_controller_volume_phase", "Phase of the volume: 1 for the current phase, 0 for the others.", "volume", "phase"),
		ftt: d("meshvol_controller_volume_failures_to_tolerate",
			"Node failures the volume is configured to survive (layout=\"configured\") and the datamesh survives now (layout=\"effective\").",
			"volume", "layout"),
		gmdr: d("meshvol_controller_volume_guaranteed_minimum_data_redundancy",
			"Copies beyond one every acknowledged write is configured to have (layout=\"configured\") and has now (layout=\"effective\").",
			"volume", "layout"),
		diskfulUpToDate: d("meshvol_controller_volume_diskful_up_to_date",
			"Diskful members of the volume that are UpToDate and whose agent reports (AgentReady not False).", "volume"),
		diskfulWanted: d("meshvol_controller_volume_diskful_wanted", "Diskful members the volume's configured layout wants.", "volume"),
		quorum: d("meshvol_controller_volume_quorum",
			"1 when some member whose agent reports has quorum, 0 when members report and none has; absent before any report.", "volume"),
		transitions: d("meshvol_controller_transitions", "Datamesh transitions in flight over all volumes, by type.", "type"),
		transitionStepWait: d("meshvol_controller_volume_transition_step_wait_seconds",
			"How long the active step of the volume's transition of this type has waited (the longest, when several run).", "volume", "type"),
		nodes: d("meshvol_controller_nodes",
			"Nodes with an agent Lease or a replica, by the agent's state: Live, Expired (within the grace period) or Lost.", "state"),
		nodeAgentState: d("meshvol_controller_node_agent_state",
			"State of the node's agent as the controller judges its Lease: 1 for the current state, 0 for the others.", "node", "state"),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.volumes, c.volumesByLayout, c.volumePhase, c.ftt, c.gmdr, c.diskfulUpToDate,
		c.diskfulWanted, c.quorum, c.transitions, c.transitionStepWait, c.nodes, c.nodeAgentState} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.source(ctx)
	if err != nil {
		// The cache is not synced yet, or stopping: no series this scrape rather
		// than wrong counts.
		if c.onErr != nil {
			c.onErr(err)
		}
		return
	}
	now := c.now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	replicas := map[string]map[string]*v1.ReplicatedVolumeReplica{}
	for i := range s.rvrs {
		r := &s.rvrs[i]
		if replicas[r.Spec.ReplicatedVolumeName] == nil {
			replicas[r.Spec.ReplicatedVolumeName] = map[string]*v1.ReplicatedVolumeReplica{}
		}
		replicas[r.Spec.ReplicatedVolumeName][r.Name] = r
	}
	byPhase := map[v1.VolumePhase]int{}
	byLayout := map[[2]string]int{}
	byType := map[v1.TransitionType]int{}
	for i := range s.rvs {
		rv := &s.rvs[i]
		phase := rv.Status.Phase
		if phase == "" {
			phase = v1.VolumePhasePending
		}
		byPhase[phase]++
		for _, p := range volumePhases {
			gauge(c.volumePhase, boolValue(p == phase), rv.Name, string(p))
		}
		byLayout[[2]string{layoutName(configuredLayout(rv)), layoutName(rv.Status.EffectiveLayout)}]++
		c.collectProtection(gauge, rv, replicas[rv.Name])
		for _, t := range rv.Status.DatameshTransitions {
			byType[t.Type]++
		}
		for typ, wait := range stepWaits(rv.Status.DatameshTransitions, now) {
			if wait >= 0 {
				gauge(c.transitionStepWait, wait.Seconds(), rv.Name, string(typ))
			}
		}
	}
	for _, p := range volumePhases {
		gauge(c.volumes, float64(byPhase[p]), string(p))
	}
	for k, n := range byLayout {
		gauge(c.volumesByLayout, float64(n), k[0], k[1])
	}
	for _, t := range transitionTypes {
		gauge(c.transitions, float64(byType[t]), string(t))
	}
	c.collectNodes(gauge, s, now)
}

type gaugeFunc func(d *prometheus.Desc, v float64, labels ...string)

// collectProtection emits the volume's configured and effective protection, its
// UpToDate Diskful members and its quorum, by the rules of the Ready condition
// (ComputePhase).
func (c *stateCollector) collectProtection(gauge gaugeFunc, rv *v1.ReplicatedVolume, rvrs map[string]*v1.ReplicatedVolumeReplica) {
	cfg := configuredLayout(rv)
	if cfg == nil {
		return
	}
	gauge(c.ftt, float64(cfg.FailuresToTolerate), rv.Name, "configured")
	gauge(c.gmdr, float64(cfg.GuaranteedMinimumDataRedundancy), rv.Name, "configured")
	if eff := rv.Status.EffectiveLayout; eff != nil {
		gauge(c.ftt, float64(eff.FailuresToTolerate), rv.Name, "effective")
		gauge(c.gmdr, float64(eff.GuaranteedMinimumDataRedundancy), rv.Name, "effective")
	}
	want := layout.Layout{FTT: int(cfg.FailuresToTolerate), GMDR: int(cfg.GuaranteedMinimumDataRedundancy)}.DiskfulCount()
	gauge(c.diskfulWanted, float64(want), rv.Name)
	h := judgeMembers(rv.Status.Datamesh.Members, rvrs, reportingAgent, nil)
	gauge(c.diskfulUpToDate, float64(h.upToDate), rv.Name)
	if h.anyQuorumReport {
		gauge(c.quorum, boolValue(h.anyQuorate), rv.Name)
	}
}

// collectNodes emits the agents' states: every node with an agent Lease, and every
// node a replica is placed on (one without a Lease is Lost: LeaseMissing).
func (c *stateCollector) collectNodes(gauge gaugeFunc, s stateSnapshot, now time.Time) {
	leases := map[string]*coordinationv1.Lease{}
	for i := range s.leases {
		if n := agentlease.NodeName(&s.leases[i]); n != "" {
			leases[n] = &s.leases[i]
		}
	}
	nodes := map[string]bool{}
	for n := range leases {
		nodes[n] = true
	}
	for i := range s.rvrs {
		if n := s.rvrs[i].Spec.NodeName; n != "" {
			nodes[n] = true
		}
	}
	var fleet agentlease.Fleet
	if c.fleet != nil {
		fleet = c.fleet(leases, now)
	}
	byState := map[string]int{}
	for n := range nodes {
		state := agentState(fleet.Judge(leases[n], now, c.grace))
		byState[state]++
		for _, st := range []string{agentLive, agentExpired, agentLost} {
			gauge(c.nodeAgentState, boolValue(st == state), n, st)
		}
	}
	for _, st := range []string{agentLive, agentExpired, agentLost} {
		gauge(c.nodes, float64(byState[st]), st)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func agentState(lv agentlease.Liveness) string {
	switch {
	case lv.Live:
		return agentLive
	case lv.Lost:
		return agentLost
	}
	return agentExpired
}

func configuredLayout(rv *v1.ReplicatedVolume) *v1.Layout {
	if rv.Status.Configuration == nil {
		return nil
	}
	return &v1.Layout{FailuresToTolerate: rv.Status.Configuration.FailuresToTolerate,
		GuaranteedMinimumDataRedundancy: rv.Status.Configuration.GuaranteedMinimumDataRedundancy}
}

// layoutName is the layout as `kubectl meshvol status` spells it ("2D+1TB"), "none"
// when there is none yet.
func layoutName(l *v1.Layout) string {
	if l == nil {
		return "none"
	}
	return layout.Layout{FTT: int(l.FailuresToTolerate), GMDR: int(l.GuaranteedMinimumDataRedundancy)}.String()
}

// stepWaits maps each transition type in flight to how long its active step (the
// first not completed) has waited, the longest when several of the type run; -1 when
// no active step has started.
func stepWaits(ts []v1.DatameshTransition, now time.Time) map[v1.TransitionType]time.Duration {
	out := map[v1.TransitionType]time.Duration{}
	for _, t := range ts {
		wait := time.Duration(-1)
		for _, s := range t.Steps {
			if s.Status == v1.StepCompleted {
				continue
			}
			if s.StartedAt != nil {
				wait = max(now.Sub(s.StartedAt.Time), 0)
			}
			break
		}
		if prev, ok := out[t.Type]; !ok || wait > prev {
			out[t.Type] = wait
		}
	}
	return out
}

// cacheState reads the volumes, replicas and agent Leases from the manager's cache,
// without copies: the collector only reads them, and a deep copy of every volume and
// replica at each scrape was the largest part of the controller's heap while it held
// 10,000 volumes (docs/scale.md, "Sixth pass").
func (c *Controller) cacheState(ctx context.Context) (stateSnapshot, error) {
	var (
		s      stateSnapshot
		rvs    v1.ReplicatedVolumeList
		rvrs   v1.ReplicatedVolumeReplicaList
		leases coordinationv1.LeaseList
	)
	if err := c.reader.List(ctx, &rvs, client.UnsafeDisableDeepCopy); err != nil {
		return s, err
	}
	if err := c.reader.List(ctx, &rvrs, client.UnsafeDisableDeepCopy); err != nil {
		return s, err
	}
	if err := c.reader.List(ctx, &leases, client.InNamespace(c.opts.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return s, err
	}
	return stateSnapshot{rvs: rvs.Items, rvrs: rvrs.Items, leases: leases.Items}, nil
}

// stateMetrics serves the state collector while this controller is the elected one
// (a manager runnable needs leader election unless it says otherwise).
type stateMetrics struct{ col *stateCollector }

func (m stateMetrics) Start(ctx context.Context) error {
	// Metrics are no reason to stop managing volumes: a controller whose series
	// cannot be registered (another controller in this process serves them) runs
	// without them and says so.
	if err := metrics.Registry.Register(m.col); err != nil {
		ctrl.Log.WithName("metrics").Error(err, "volume state metrics not served")
		return nil
	}
	defer metrics.Registry.Unregister(m.col)
	<-ctx.Done()
	return nil
}

func (c *Controller) setupStateMetrics(mgr ctrl.Manager) error {
	col := newStateCollector(c.cacheState, c.opts.Now, c.opts.AgentGracePeriod, func(err error) {
		ctrl.Log.WithName("metrics").V(1).Info("volume state metrics", "err", err.Error())
	})
	col.fleet = c.disrupt.observe
	return mgr.Add(stateMetrics{col: col})
}
