package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// LeaderRenewals is what one leader-election Lease of the release (meshvol
// controller's or a sidecar's) showed while WatchLeaderLeases followed it:
// how often its holder renewed it and how long the holder took between two
// renewals. A holder writes renewTime as it starts a renewal, and starts
// the next one retryPeriod after the last one returned, so a gap longer
// than retryPeriod is time the holder spent renewing (the apiserver's
// latency, retries of a failed renewal). A holder that finds no renewal
// succeeding for renewDeadline stops leading (its container exits): the
// gap is the figure to hold against retryPeriod + renewDeadline
// (docs/controller.md, "Detection").
type LeaderRenewals struct {
	Lease string
	// Renewals counts the renewals by a holder that held the Lease before
	// (Gaps has one entry for each).
	Renewals int
	// Holders counts the holders seen, the first included: more than one
	// means the leadership passed on (a holder is an identity and the time
	// it acquired the Lease).
	Holders int
	// Gaps are the times between two consecutive renewals by one holder,
	// in the order seen.
	Gaps []time.Duration
	// LongestAt is when the renewal that ended the longest gap started.
	LongestAt time.Time
}

// Longest is the longest of Gaps (zero without any).
func (r LeaderRenewals) Longest() time.Duration {
	if len(r.Gaps) == 0 {
		return 0
	}
	return slices.Max(r.Gaps)
}

// Quantile is the q-quantile (0 < q <= 1, nearest rank) of Gaps.
func (r LeaderRenewals) Quantile(q float64) time.Duration {
	if len(r.Gaps) == 0 {
		return 0
	}
	s := slices.Clone(r.Gaps)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// String says it in one line.
func (r LeaderRenewals) String() string {
	if len(r.Gaps) == 0 {
		return fmt.Sprintf("%s: no renewal seen (%d holders)", r.Lease, r.Holders)
	}
	return fmt.Sprintf("%s: %d renewals, %d holders, between renewals median %s, p99 %s, longest %s (the renewal at %s)",
		r.Lease, r.Renewals, r.Holders, r.Quantile(0.5).Round(time.Millisecond), r.Quantile(0.99).Round(time.Millisecond),
		r.Longest().Round(time.Millisecond), r.LongestAt.UTC().Format("15:04:05.000"))
}

// leaseLog folds the Leases' successive states into LeaderRenewals.
type leaseLog struct {
	mu     sync.Mutex
	leases map[string]*leaseState
}

type leaseState struct {
	LeaderRenewals
	holder string
	renew  time.Time
}

// observe records one state of a Lease: a renewTime later than the last one
// by the same holder is a renewal; another holder is a hand-over (no gap:
// the time between two holders is the election's, not a renewal's), and so
// is the same holder more than leaseDuration after its last renewal — its
// Lease had expired, so this is an acquisition (a sidecar restarted on the
// same node takes the Lease again under the same identity, and client-go
// keeps the acquireTime of a Lease its identity already holds).
func (l *leaseLog) observe(name, holder string, renew time.Time, leaseDuration time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.leases == nil {
		l.leases = map[string]*leaseState{}
	}
	st := l.leases[name]
	if st == nil {
		st = &leaseState{LeaderRenewals: LeaderRenewals{Lease: name}}
		l.leases[name] = st
	}
	switch {
	case holder == "" || renew.IsZero():
		return
	case holder != st.holder || (leaseDuration > 0 && renew.Sub(st.renew) > leaseDuration):
		st.Holders++
	case renew.After(st.renew):
		gap := renew.Sub(st.renew)
		if gap > st.Longest() {
			st.LongestAt = renew
		}
		st.Gaps = append(st.Gaps, gap)
		st.Renewals++
	default:
		return
	}
	st.holder, st.renew = holder, renew
}

// report is every Lease's LeaderRenewals, by name.
func (l *leaseLog) report() []LeaderRenewals {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LeaderRenewals
	for _, st := range l.leases {
		r := st.LeaderRenewals
		r.Gaps = slices.Clone(r.Gaps)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b LeaderRenewals) int { return strings.Compare(a.Lease, b.Lease) })
	return out
}

// WatchLeaderLeases follows the leader-election Leases in the release's
// namespace (every Lease there but the agents') until ctx ends; report says
// what each showed so far.
func (s *Sandbox) WatchLeaderLeases(ctx context.Context) (report func() []LeaderRenewals, err error) {
	return s.watchLeases(ctx, func(name string) bool { return !strings.HasPrefix(name, v1.AgentLeasePrefix) })
}

// WatchAgentLeases follows the agents' Leases (one per node) the same way: how
// long each agent took between two renewals, the figure to hold against the
// Lease duration and the controller's grace period, past which its node is lost
// (docs/controller.md, "Detection"). A node crashed or cut off shows as a new
// holder when its agent renews again, not as a gap.
func (s *Sandbox) WatchAgentLeases(ctx context.Context) (report func() []LeaderRenewals, err error) {
	return s.watchLeases(ctx, func(name string) bool { return strings.HasPrefix(name, v1.AgentLeasePrefix) })
}

// watchLeases follows the Leases in the release's namespace whose name keep
// accepts.
func (s *Sandbox) watchLeases(ctx context.Context, keep func(name string) bool) (report func() []LeaderRenewals, err error) {
	cs, err := kubernetes.NewForConfig(s.Kube.Env.Config)
	if err != nil {
		return nil, err
	}
	leases := cs.CoordinationV1().Leases(ReleaseNamespace)
	var log leaseLog
	see := func(l *coordinationv1.Lease) {
		if !keep(l.Name) || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
			return
		}
		// A holder's identity can outlive its leadership (the sidecars'
		// is the host name, which a new pod on the same node shares): a
		// new acquireTime is a new holder too.
		holder := *l.Spec.HolderIdentity
		if l.Spec.AcquireTime != nil {
			holder += "@" + l.Spec.AcquireTime.UTC().Format(time.RFC3339Nano)
		}
		var d time.Duration
		if l.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		log.observe(l.Name, holder, l.Spec.RenewTime.Time, d)
	}
	list := func() (string, error) {
		ls, err := leases.List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		for i := range ls.Items {
			see(&ls.Items[i])
		}
		return ls.ResourceVersion, nil
	}
	rv, err := list()
	if err != nil {
		return nil, fmt.Errorf("sandbox: listing the Leases of %s: %w", ReleaseNamespace, err)
	}
	go func() {
		for ctx.Err() == nil {
			if rv == "" {
				var err error
				if rv, err = list(); err != nil {
					time.Sleep(time.Second)
					continue
				}
			}
			w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				rv = ""
				time.Sleep(time.Second)
				continue
			}
			for ev := range w.ResultChan() {
				if ev.Type == watch.Error {
					// Most likely 410 Gone (the resourceVersion is too old):
					// list again.
					rv = ""
					break
				}
				l, ok := ev.Object.(*coordinationv1.Lease)
				if !ok {
					continue
				}
				rv = l.ResourceVersion
				if ev.Type != watch.Deleted && ev.Type != watch.Bookmark {
					see(l)
				}
			}
			w.Stop()
		}
	}()
	return log.report, nil
}

// LeaderNodes names the node of each leader-election Lease's holder in the
// release's namespace (meshvol controller's and each sidecar's; the agents'
// Leases are not elections), by Lease name. A holder's identity starts with
// its host name — controller-runtime's "<host name>_<uuid>", the sidecars'
// host name — and the host name of a host-network pod is its node's.
func (s *Sandbox) LeaderNodes(ctx context.Context) (map[string]string, error) {
	var ls coordinationv1.LeaseList
	if err := s.Client.List(ctx, &ls, client.InNamespace(ReleaseNamespace)); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, l := range ls.Items {
		if strings.HasPrefix(l.Name, v1.AgentLeasePrefix) || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			continue
		}
		node, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
		out[l.Name] = node
	}
	return out, nil
}
