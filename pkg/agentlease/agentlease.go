// Package agentlease judges a node agent's Lease: whether the node is live, in its
// grace period, or lost (docs/controller.md, "Node lifecycle"). The controller acts on
// the verdict; `kubectl meshvol` shows it. It is a package of its own so that the
// plugin reads the controller's rule without linking the controller.
package agentlease

import (
	"slices"
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

// Fleet is what every agent's Lease says together. When every agent goes silent at
// once (a full disruption), the control plane — an apiserver that stalls, or the
// controller's own connection to it — is a likelier culprit than every node at once,
// so no node is declared lost while it lasts, nor until a whole Lease duration and
// grace period after it ended, as if every still-silent agent had renewed at that
// moment: Kubernetes' node lifecycle controller stops evicting in a zone whose every
// node is NotReady and resets its nodes' timers once the zone is back, for the same
// reason (docs/controller.md, "Every agent silent at once").
type Fleet struct {
	// Disrupted: no agent Lease is live (Silent).
	Disrupted bool
	// Start is when the current or the last disruption began: when the last live
	// Lease expired. Zero: none seen.
	Start time.Time
	// End is when the last disruption was seen to end; zero while one lasts or when
	// none was seen.
	End time.Time
}

// Silent reports whether, among leases, at least one agent Lease has been renewed
// and none is live at now; start is when the last of them expired.
func Silent(leases map[string]*coordinationv1.Lease, now time.Time) (silent bool, start time.Time) {
	for _, l := range leases {
		expires, ok := expiry(l)
		if !ok {
			continue
		}
		if now.Before(expires) {
			return false, time.Time{}
		}
		if expires.After(start) {
			start = expires
		}
	}
	return !start.IsZero(), start
}

// Judge judges l as the package's Judge does, within the fleet: a node that was not
// yet lost when every agent went silent is not declared lost while the disruption
// lasts, nor before a Lease duration and the grace period have passed since it ended.
// A node lost before it began stays lost, and a missing Lease is judged as ever.
func (f Fleet) Judge(l *coordinationv1.Lease, now time.Time, grace time.Duration) Liveness {
	lv := Judge(l, now, grace)
	expires, ok := expiry(l)
	if !lv.Lost || !ok || f.Start.IsZero() || !f.Disrupted && f.End.IsZero() || !expires.Add(grace).After(f.Start) {
		return lv
	}
	silent := "the agent Lease " + l.Name + " expired at " + expires.UTC().Format(time.RFC3339) +
		"; every agent Lease expired at once at " + f.Start.UTC().Format(time.RFC3339) + " (a full disruption)"
	if f.Disrupted {
		// Next stays zero: the disruption ends with a renewal, not by the clock.
		return Liveness{Reason: v1.ReasonAgentLeaseValid, Message: silent + ": no node is declared lost until an agent renews"}
	}
	lostAt := f.End.Add(expires.Sub(renewTime(l)) + grace)
	if now.Before(lostAt) {
		return Liveness{Reason: v1.ReasonAgentLeaseValid, Message: silent + " until " + f.End.UTC().Format(time.RFC3339) +
			": the node is lost at " + lostAt.UTC().Format(time.RFC3339) + " if its agent has not renewed by then", Next: lostAt}
	}
	return lv
}

// expiry is when l expires; false for a missing Lease or one never renewed.
func expiry(l *coordinationv1.Lease) (time.Time, bool) {
	if l == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	renew := renewTime(l)
	if renew.IsZero() {
		return time.Time{}, false
	}
	return renew.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second), true
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

// Capabilities returns what the node's agent announces it understands
// (v1alpha1.AnnotationCapabilities): nil for a missing Lease, one that announces
// nothing, or one whose announcement was written by another agent version than the
// one that renews the Lease now. An agent keeps the annotations it does not know when
// it renews, so an earlier agent that replaced a newer one would otherwise carry the
// newer one's announcement; it rewrites the version annotation, which voids it
// (docs/contract.md, "Node facts and liveness").
func Capabilities(l *coordinationv1.Lease) []string {
	if l == nil {
		return nil
	}
	caps, ok := l.Annotations[v1.AnnotationCapabilities]
	writer, okWriter := l.Annotations[v1.AnnotationCapabilitiesAgentVersion]
	renewer, okRenewer := l.Annotations[v1.AnnotationAgentVersion]
	if !ok || !okWriter || !okRenewer || writer != renewer || caps == "" {
		return nil
	}
	var out []string
	for c := range strings.SplitSeq(caps, ",") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

// Announces reports whether the node's agent announces capability (Capabilities).
func Announces(l *coordinationv1.Lease, capability string) bool {
	return slices.Contains(Capabilities(l), capability)
}
