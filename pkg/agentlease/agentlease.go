// Package agentlease judges a node agent's Lease: whether the node is live, in its
// grace period, or lost (docs/controller.md, "Node lifecycle"). The controller acts on
// the verdict; `kubectl meshvol` shows it. It is a package of its own so that the
// plugin reads the controller's rule without linking the controller.
package agentlease

import (
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// Liveness is the verdict on one node's agent.
type Liveness struct {
	// Live: the Lease is held and not expired (placement puts replicas only here).
	Live bool
	// Lost: the Lease is missing or expired for longer than the grace period: the
	// node's replicas are marked AgentReady=False and may be force-removed.
	Lost bool
	// Reason is AgentReady's reason: LeaseValid, LeaseExpired or LeaseMissing.
	Reason string
	// Message explains the verdict for people.
	Message string
	// Next is when the verdict changes by the clock alone (zero: never, without a
	// new write to the Lease).
	Next time.Time
}

// Judge judges a node's agent Lease at now. A nil lease is missing. grace is how
// long past expiry the node stays "not live but not lost": long enough for an agent
// restart or a short apiserver hiccup, short enough that a dead node's volumes are
// repaired quickly.
func Judge(l *coordinationv1.Lease, now time.Time, grace time.Duration) Liveness {
	if l == nil {
		return Liveness{Lost: true, Reason: v1.ReasonAgentLeaseMissing, Message: "no agent Lease for this node"}
	}
	renew := renewTime(l)
	if renew.IsZero() || l.Spec.LeaseDurationSeconds == nil {
		return Liveness{Lost: true, Reason: v1.ReasonAgentLeaseExpired, Message: "the agent Lease " + l.Name + " has never been renewed"}
	}
	expires := renew.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	lostAt := expires.Add(grace)
	switch {
	case now.Before(expires):
		return Liveness{Live: true, Reason: v1.ReasonAgentLeaseValid, Message: "the agent renews Lease " + l.Name, Next: expires}
	case now.Before(lostAt):
		// Expired, within the grace period: not a place for new replicas, not lost yet.
		return Liveness{Reason: v1.ReasonAgentLeaseValid, Message: "the agent Lease " + l.Name + " expired at " +
			expires.UTC().Format(time.RFC3339) + "; within the grace period", Next: lostAt}
	}
	return Liveness{Lost: true, Reason: v1.ReasonAgentLeaseExpired, Message: "the agent Lease " + l.Name + " expired at " +
		expires.UTC().Format(time.RFC3339) + ", more than " + grace.String() + " ago"}
}

func renewTime(l *coordinationv1.Lease) time.Time {
	switch {
	case l.Spec.RenewTime != nil:
		return l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		return l.Spec.AcquireTime.Time
	}
	return time.Time{}
}

// NodeName returns the node an agent Lease belongs to ("" if it is not one).
func NodeName(l *coordinationv1.Lease) string {
	if !strings.HasPrefix(l.Name, v1.AgentLeasePrefix) {
		return ""
	}
	return strings.TrimPrefix(l.Name, v1.AgentLeasePrefix)
}

// Addresses returns the node's DRBD replication addresses the agent publishes on its
// Lease (nil when it publishes none).
func Addresses(l *coordinationv1.Lease) []string {
	if l == nil || l.Annotations[v1.AnnotationAddresses] == "" {
		return nil
	}
	return strings.Split(l.Annotations[v1.AnnotationAddresses], ",")
}
