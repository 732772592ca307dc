package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// NodeCapacity is what external-provisioner published for one storage
// class on one node: the CSIStorageCapacity whose topology selects the
// node, as the scheduler reads it.
type NodeCapacity struct {
	Class, Node, Object string
	// Available is GetCapacity's available_capacity; MaxVolumeSize its
	// maximum_volume_size, which the scheduler compares with a claim.
	Available, MaxVolumeSize int64
}

// Capacities returns, for every storage class of the sandbox and every
// node, the CSIStorageCapacity the scheduler would use; a class and node
// without one are missing from the result.
func (s *Sandbox) Capacities(ctx context.Context) ([]NodeCapacity, error) {
	var caps storagev1.CSIStorageCapacityList
	if err := s.Client.List(ctx, &caps, client.InNamespace(s.Namespace),
		client.MatchingLabels{"csi.storage.k8s.io/drivername": v1.CSIDriverName}); err != nil {
		return nil, err
	}
	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes); err != nil {
		return nil, err
	}
	var out []NodeCapacity
	for _, n := range nodes.Items {
		for _, sc := range storageClasses {
			for _, c := range caps.Items {
				if c.StorageClassName != sc.name || c.NodeTopology == nil {
					continue
				}
				sel, err := metav1.LabelSelectorAsSelector(c.NodeTopology)
				if err != nil || !sel.Matches(labels.Set(n.Labels)) {
					continue
				}
				nc := NodeCapacity{Class: sc.name, Node: n.Name, Object: c.Name}
				if c.Capacity != nil {
					nc.Available = c.Capacity.Value()
				}
				if c.MaximumVolumeSize != nil {
					nc.MaxVolumeSize = c.MaximumVolumeSize.Value()
				}
				out = append(out, nc)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Class != out[j].Class {
			return out[i].Class < out[j].Class
		}
		return out[i].Node < out[j].Node
	})
	return out, nil
}

// waitCapacities waits until external-provisioner has published a
// non-zero capacity for every storage class on every node: until then the
// scheduler finds no node with room for a claim of that class, and a pod
// created at once would wait for the next poll.
func (s *Sandbox) waitCapacities(ctx context.Context) ([]NodeCapacity, error) {
	want := len(storageClasses) * len(s.Kube.Nodes)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		caps, err := s.Capacities(ctx)
		if err == nil {
			nonzero := 0
			for _, c := range caps {
				if c.MaxVolumeSize > 0 {
					nonzero++
				}
			}
			if nonzero == want {
				return caps, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sandbox: external-provisioner published %s within 2 minutes, want a non-zero capacity for each of %d classes on each of %d nodes (see logs/csi-provisioner.log)",
				describeCapacities(caps), len(storageClasses), len(s.Kube.Nodes))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// describeCapacities is one line per class: the largest volume the
// scheduler admits on each node.
func describeCapacities(caps []NodeCapacity) string {
	if len(caps) == 0 {
		return "no CSIStorageCapacity"
	}
	var lines []string
	for i := 0; i < len(caps); {
		j := i
		var per []string
		for ; j < len(caps) && caps[j].Class == caps[i].Class; j++ {
			per = append(per, fmt.Sprintf("%s %s", caps[j].Node, bytesIEC(caps[j].MaxVolumeSize)))
		}
		lines = append(lines, fmt.Sprintf("%s: %s", caps[i].Class, strings.Join(per, ", ")))
		i = j
	}
	return strings.Join(lines, "; ")
}

func bytesIEC(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// waitPoolCapacity waits until the controller reports the pool's free
// space on every node, which GetCapacity answers from.
func (s *Sandbox) waitPoolCapacity(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for {
		var rsp v1.ReplicatedStoragePool
		known := 0
		if err := s.Client.Get(ctx, client.ObjectKey{Name: PoolName}, &rsp); err == nil {
			for _, n := range rsp.Status.EligibleNodes {
				if n.Ready && n.FreeCapacity != nil {
					known++
				}
			}
		}
		if known == len(s.Kube.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox: the controller reported the free space of pool %s on %d of %d nodes within a minute (status.eligibleNodes)", PoolName, known, len(s.Kube.Nodes))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
