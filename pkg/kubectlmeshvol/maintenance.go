package kubectlmeshvol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// cordonMaintenance is the value of the meshvol cordon label `drain` sets, so that
// `uncordon` removes only a cordon it put there.
const cordonMaintenance = "maintenance"

// Maintainer runs `kubectl meshvol drain` and `uncordon`: the two commands that write.
// Drain cordons the node for meshvol's placement, creates the node's
// ReplicatedNodeMaintenance and follows its phases; uncordon asks the node back and
// follows it until every replica there is in sync (docs/operating.md, "Node
// maintenance").
type Maintainer struct {
	Client client.WithWatch
	// Reader finds the PVCs of attached volumes for the progress lines.
	Reader Reader
	Out    io.Writer
	// Poll is how often drain tries again to create a maintenance while the last one
	// is still being deleted (default 1 s); Timeout how long a command follows the
	// maintenance (default 10 min).
	Poll, Timeout time.Duration
	// Now is the clock of the progress lines (default time.Now).
	Now func() time.Time
	// MaxDowntime is the drain's spec.maxDowntime (0: no bound).
	MaxDowntime time.Duration
}

func (m *Maintainer) defaults() {
	if m.Poll == 0 {
		m.Poll = time.Second
	}
	if m.Timeout == 0 {
		m.Timeout = 10 * time.Minute
	}
	if m.Now == nil {
		m.Now = time.Now
	}
}

// ErrBlocked is the error of a drain the controller refused.
var ErrBlocked = errors.New("drain refused")

// ErrFailed is the error of an uncordon whose maintenance failed: the node was away
// longer than its maxDowntime and counts as lost.
var ErrFailed = errors.New("maintenance failed")

// Drain takes node out of service: it returns once the node may be taken down, or
// with ErrBlocked (and nothing left behind: no maintenance, no cordon) when the
// pre-checks refuse.
func (m *Maintainer) Drain(ctx context.Context, node string) error {
	m.defaults()
	n := &corev1.Node{}
	if err := m.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	old := &v1.ReplicatedNodeMaintenance{}
	switch err := m.Client.Get(ctx, client.ObjectKey{Name: node}, old); {
	case err == nil && (old.Status.Phase == v1.MaintenanceCompleted || old.Status.Phase == v1.MaintenanceFailed):
		// A finished maintenance is the record of the last one: replace it.
		if err := m.Client.Delete(ctx, old); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	case err == nil:
		return fmt.Errorf("node %s already has a maintenance in phase %s: follow it with `kubectl get rnm %s -w`, or end it with `kubectl meshvol uncordon %s`",
			node, phaseOrPending(old.Status.Phase), node, node)
	case !apierrors.IsNotFound(err):
		return err
	}
	cordoned, err := m.cordon(ctx, n)
	if err != nil {
		return err
	}
	rnm := &v1.ReplicatedNodeMaintenance{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: v1.ReplicatedNodeMaintenanceSpec{NodeName: node}}
	if m.MaxDowntime > 0 {
		rnm.Spec.MaxDowntime = &metav1.Duration{Duration: m.MaxDowntime}
	}
	if err := m.createFresh(ctx, rnm); err != nil {
		return err
	}
	m.line("maintenance %s created; node %s cordoned for meshvol", node, node)
	st, err := m.follow(ctx, rnm, func(p v1.MaintenancePhase) bool {
		return p == v1.MaintenanceReadyForMaintenance || p == v1.MaintenanceBlocked
	})
	if err != nil {
		return err
	}
	if st.Phase == v1.MaintenanceBlocked {
		if err := m.Client.Delete(ctx, rnm); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		if cordoned {
			if err := m.uncordonLabel(ctx, node); err != nil {
				return err
			}
		}
		return fmt.Errorf("%w: %s (blocking volumes: %s); the maintenance was deleted and node %s uncordoned",
			ErrBlocked, st.Message, strings.Join(st.BlockingVolumes, ", "), node)
	}
	m.line("node %s may be taken down; bring it back with `kubectl meshvol uncordon %s`", node, node)
	return nil
}

// Uncordon brings node back: it returns once its replicas are in sync again.
func (m *Maintainer) Uncordon(ctx context.Context, node string) error {
	m.defaults()
	rnm := &v1.ReplicatedNodeMaintenance{}
	if err := m.Client.Get(ctx, client.ObjectKey{Name: node}, rnm); err != nil {
		return fmt.Errorf("maintenance of node %s: %w", node, err)
	}
	if !rnm.Spec.Return && rnm.Status.Phase != v1.MaintenanceFailed {
		patch := client.MergeFrom(rnm.DeepCopy())
		rnm.Spec.Return = true
		if err := m.Client.Patch(ctx, rnm, patch); err != nil {
			return fmt.Errorf("asking node %s back: %w", node, err)
		}
		m.line("maintenance %s: return requested", node)
	}
	st, err := m.follow(ctx, rnm, func(p v1.MaintenancePhase) bool { return p == v1.MaintenanceCompleted || p == v1.MaintenanceFailed })
	if err != nil {
		return err
	}
	if err := m.uncordonLabel(ctx, node); err != nil {
		return err
	}
	if st.Phase == v1.MaintenanceFailed {
		return fmt.Errorf("%w: %s; node %s uncordoned for meshvol", ErrFailed, st.Message, node)
	}
	m.line("node %s is back in service and uncordoned for meshvol", node)
	return nil
}

// follow prints every phase or message change of the maintenance from rnm on (the
// object as this command last wrote or read it) until done says its phase ends the
// command. It watches from rnm's resourceVersion rather than polling: a phase the
// controller holds for less than a poll's interval (a copy made in a moment, a
// volume detached at once) is still printed, in order.
func (m *Maintainer) follow(ctx context.Context, rnm *v1.ReplicatedNodeMaintenance, done func(v1.MaintenancePhase) bool) (v1.ReplicatedNodeMaintenanceStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	var last v1.ReplicatedNodeMaintenanceStatus
	// show prints rnm's status if it is new and current, and says whether it ends
	// the command.
	show := func(rnm *v1.ReplicatedNodeMaintenance) bool {
		st := rnm.Status
		if st.ObservedGeneration != rnm.Generation || st.Phase == "" {
			return false
		}
		if st.Phase != last.Phase || st.Message != last.Message {
			m.line("%s: %s", st.Phase, st.Message)
			if st.Phase == v1.MaintenanceDraining {
				m.attachedPVCs(ctx, st.AttachedVolumes)
			}
		}
		last = st
		return done(st.Phase)
	}
	timedOut := func() error {
		return fmt.Errorf("maintenance of node %s still %s after %s: %w", rnm.Name, phaseOrPending(last.Phase), m.Timeout, ctx.Err())
	}
	if show(rnm) {
		return last, nil
	}
	rv := rnm.ResourceVersion
	for {
		w, err := m.Client.Watch(ctx, &v1.ReplicatedNodeMaintenanceList{},
			client.MatchingFields{"metadata.name": rnm.Name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			if ctx.Err() != nil {
				return last, timedOut()
			}
			return last, fmt.Errorf("watching the maintenance of node %s: %w", rnm.Name, err)
		}
		resync := false
		for ev := range w.ResultChan() {
			switch cur, ok := ev.Object.(*v1.ReplicatedNodeMaintenance); {
			case ev.Type == watch.Error:
				// Most often 410 Gone: rv is older than the API server keeps.
				// Read the object as it is now and watch on from there.
				resync = true
			case ev.Type == watch.Deleted:
				w.Stop()
				return last, fmt.Errorf("maintenance of node %s was deleted while %s", rnm.Name, phaseOrPending(last.Phase))
			case ok:
				rv = cur.ResourceVersion
				if show(cur) {
					w.Stop()
					return last, nil
				}
			}
			if resync {
				break
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return last, timedOut()
		}
		if resync {
			cur := &v1.ReplicatedNodeMaintenance{}
			if err := m.Client.Get(ctx, client.ObjectKey{Name: rnm.Name}, cur); err != nil {
				return last, fmt.Errorf("maintenance of node %s: %w", rnm.Name, err)
			}
			if show(cur) {
				return last, nil
			}
			rv = cur.ResourceVersion
		}
	}
}

// attachedPVCs names the PVC of each attached volume: the pods using it are the
// ones to move.
func (m *Maintainer) attachedPVCs(ctx context.Context, vols []string) {
	for _, v := range vols {
		if pvc, err := m.Reader.pvcOfVolume(ctx, v); err == nil && pvc != "" {
			m.line("  %s is PVC %s: move the pods that use it", v, pvc)
		}
	}
}

// createFresh creates the maintenance, waiting out a previous one still being deleted.
func (m *Maintainer) createFresh(ctx context.Context, rnm *v1.ReplicatedNodeMaintenance) error {
	deadline := m.Now().Add(30 * time.Second)
	for {
		err := m.Client.Create(ctx, rnm)
		if !apierrors.IsAlreadyExists(err) || m.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(m.Poll):
		}
	}
}

// cordon sets the meshvol cordon label unless the node is cordoned for meshvol
// already; cordoned says whether this call set it.
func (m *Maintainer) cordon(ctx context.Context, n *corev1.Node) (cordoned bool, err error) {
	if v, ok := n.Labels[v1.LabelCordon]; ok && v != "false" {
		return false, nil
	}
	patch := client.MergeFrom(n.DeepCopy())
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[v1.LabelCordon] = cordonMaintenance
	if err := m.Client.Patch(ctx, n, patch); err != nil {
		return false, fmt.Errorf("cordoning node %s: %w", n.Name, err)
	}
	return true, nil
}

// uncordonLabel removes the cordon label drain set; one a person set stays.
func (m *Maintainer) uncordonLabel(ctx context.Context, node string) error {
	n := &corev1.Node{}
	if err := m.Client.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if n.Labels[v1.LabelCordon] != cordonMaintenance {
		return nil
	}
	patch := client.MergeFrom(n.DeepCopy())
	delete(n.Labels, v1.LabelCordon)
	if err := m.Client.Patch(ctx, n, patch); err != nil {
		return fmt.Errorf("uncordoning node %s: %w", node, err)
	}
	return nil
}

func (m *Maintainer) line(format string, args ...any) {
	fmt.Fprintf(m.Out, "%s  "+format+"\n", append([]any{m.Now().UTC().Format("15:04:05")}, args...)...)
}

func phaseOrPending(p v1.MaintenancePhase) v1.MaintenancePhase {
	if p == "" {
		return v1.MaintenancePending
	}
	return p
}
