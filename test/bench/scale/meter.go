package main

import (
	"context"
	"strings"

	"github.com/meshvol/meshvol/internal/localcluster"
)

// meter reads every write counter at once: the apiserver's audit log and the
// counters of the controller process and of the agents.
type meter struct {
	audit string
	ctrl  *controllerProc
	lc    *localcluster.Cluster
}

// reading is the counters at one moment.
type reading struct {
	audit  auditCounts
	ctrl   controllerCounters
	agents map[string]int
}

func (m meter) read(ctx context.Context) (reading, error) {
	var r reading
	var err error
	if r.audit, err = readAudit(m.audit); err != nil {
		return r, err
	}
	if r.ctrl, err = m.ctrl.counters(ctx); err != nil {
		return r, err
	}
	r.agents = m.lc.Writes.Snapshot()
	return r, nil
}

// since is the writes between before and r, per volume where it says so.
func (r reading) since(before reading, volumes int) Writes {
	a := r.audit.since(before.audit)
	agentsHTTP := 0
	for k, v := range r.agents {
		if !strings.HasPrefix(k, "agent ") {
			continue
		}
		d := v - before.agents[k]
		if !strings.HasSuffix(k, " leases") {
			agentsHTTP += d
		}
	}
	w := Writes{
		AuditController:      a.Writes["controller"],
		AuditAgents:          a.Writes["agent"],
		Leases:               a.Leases["controller"] + a.Leases["agent"],
		ControllerHTTP:       r.ctrl.HTTPWrites - before.ctrl.HTTPWrites,
		ControllerReconciler: r.ctrl.ReconcilerWrites - before.ctrl.ReconcilerWrites,
		AgentsHTTP:           agentsHTTP,
		VolumeReconciles:     r.ctrl.VolumeReconciles - before.ctrl.VolumeReconciles,
		ByResource:           map[string]int{},
	}
	for k, v := range a.ByResource {
		if !strings.HasPrefix(k, "load ") {
			w.ByResource[k] = v
		}
	}
	nonLease := func(n, leases int) float64 { return float64(n-leases) / float64(volumes) }
	w.ControllerPerVolume = nonLease(w.AuditController, a.Leases["controller"])
	w.AgentsPerVolume = nonLease(w.AuditAgents, a.Leases["agent"])
	w.PerVolume = w.ControllerPerVolume + w.AgentsPerVolume
	// Lease renewals run on their own clock, so one may be in flight at a
	// boundary (counted by the agent as it leaves, by the audit log as it
	// completes): the agreement is of the other writes.
	w.Agree = w.AuditController == w.ControllerHTTP && w.AuditAgents-a.Leases["agent"] == w.AgentsHTTP
	return w
}
