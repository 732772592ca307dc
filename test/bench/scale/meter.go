package main

import (
	"context"
	"strings"
	"time"

	"github.com/meshvol/meshvol/internal/localcluster"
)

// meter reads every write counter at once: the apiserver's audit log and the
// counters of the controller process and of the agents.
type meter struct {
	audit string
	ctrl  *controllerProc
	lc    *localcluster.Cluster
	// agents are the agents' processes (-agent-processes), whose own
	// counts are their metrics' rather than localcluster's.
	agents *agentProcs
}

// reading is the counters at one moment.
type reading struct {
	audit  auditCounts
	ctrl   controllerCounters
	agents map[string]int
	// agentProcs is the agents' processes' count of their writes, Lease
	// renewals included; -1 when the agents run in this process.
	agentProcs int
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
	r.agentProcs = -1
	if m.agents != nil {
		if r.agentProcs, err = m.agents.writes(ctx); err != nil {
			return r, err
		}
	}
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
	if r.agentProcs >= 0 {
		// The agents' processes count their Lease renewals with their other
		// writes (client-go's counter has no resource): the agreement is of
		// every write, a renewal in flight at a boundary included.
		w.AgentsHTTP = r.agentProcs - before.agentProcs
		w.Agree = w.AuditController == w.ControllerHTTP && w.AuditAgents == w.AgentsHTTP
	}
	return w
}

// settle waits until the controller has written nothing for quiet, or until limit has
// passed. It reads the controller's own counter of its requests, not the audit log,
// whose whole file each reading parses; the agents' reports come before their volume
// is Ready, so what trails a formation is the controller's.
func (m meter) settle(ctx context.Context, quiet, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	last, moved := -1, time.Now()
	for time.Now().Before(deadline) && time.Since(moved) < quiet {
		c, err := m.ctrl.counters(ctx)
		if err != nil {
			return err
		}
		if c.HTTPWrites != last {
			last, moved = c.HTTPWrites, time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	return nil
}
