package controller

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/meshvol/meshvol/pkg/agentlease"
)

// agentsSilent is 1 while every agent's Lease has expired at once (a full disruption:
// no node is declared lost) and 0 otherwise.
var agentsSilent = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "meshvol_controller_agents_silent",
	Help: "1 while every node agent's Lease has expired at once (a full disruption: the controller declares no node lost until an agent renews), 0 otherwise.",
})

// disruption remembers the last time every agent went silent at once, so that the
// nodes still silent after it ended get a whole Lease duration and grace period from
// its end before they are declared lost (agentlease.Fleet; docs/controller.md, "Every
// agent silent at once"). It lives in the controller's memory only: a controller that
// starts leading after a disruption ended judges every Lease by itself again.
type disruption struct {
	mu    sync.Mutex
	fleet agentlease.Fleet
}

// observe judges every agent Lease at now together, records a disruption that begins
// or ends, and returns the fleet to judge each node within. Every reconcile that
// judges a node calls it with the Leases it read, so a disruption is seen by the first
// pass that finds every Lease expired and its end by the first that finds one renewed.
func (d *disruption) observe(leases map[string]*coordinationv1.Lease, now time.Time) agentlease.Fleet {
	silent, start := agentlease.Silent(leases, now)
	if !silent {
		return d.liveSeen(now)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.fleet.Disrupted {
		ctrl.Log.WithName("node-lifecycle").Info("every agent Lease has expired at once: a full disruption (the apiserver or the controller's connection to it is the likelier culprit); no node is declared lost until an agent renews",
			"agents", len(leases), "since", start.UTC().Format(time.RFC3339))
		agentsSilent.Set(1)
	}
	d.fleet = agentlease.Fleet{Disrupted: true, Start: start}
	return d.fleet
}

// liveSeen is observe for a pass that has seen one agent Lease live at now, which is
// enough to know that not every agent is silent: a disruption that lasted ends. The
// node-lifecycle pass of a node whose Lease was just renewed — the common case, one per
// node every renew interval — so reads one Lease instead of all of them.
func (d *disruption) liveSeen(now time.Time) agentlease.Fleet {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fleet.Disrupted {
		d.fleet.Disrupted, d.fleet.End = false, now
		ctrl.Log.WithName("node-lifecycle").Info("an agent renews again: the full disruption has ended; an agent still silent is declared lost a Lease duration and grace period from now",
			"since", d.fleet.Start.UTC().Format(time.RFC3339), "ended", now.UTC().Format(time.RFC3339))
		agentsSilent.Set(0)
	}
	return d.fleet
}
