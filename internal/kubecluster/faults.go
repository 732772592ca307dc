package kubecluster

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Faults beyond Crash: a crashed node booted again, and a node cut off
// from the control plane while it runs.

// RestartNode boots a crashed node again, as a machine powered back on:
// new namespaces (its link on the bridge, its proxy to the apiserver, what
// Options.PrepareNode adds), then containerd and the kubelet on the node's
// directory as the crash left it — the images are still in containerd's
// root, and containerd cleans up the tasks whose shims died, as after any
// crash of its own. It returns once the kubelet has reported the node Ready
// again.
func (c *Cluster) RestartNode(ctx context.Context, name string) error {
	n := c.Node(name)
	if n == nil {
		return fmt.Errorf("kubecluster: no node %q", name)
	}
	if !n.crashed {
		return fmt.Errorf("kubecluster: node %s has not crashed", name)
	}
	began := time.Now()
	if c.opts.Namespaces {
		// The dead namespace takes its link with it, asynchronously: a
		// link of the same name may still be there.
		_, _ = execOutput("ip", "link", "del", n.vethName())
		if err := c.startNodeNamespaces(ctx, n, c.opts.PrepareNode); err != nil {
			return err
		}
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	kc := filepath.Join(c.Dir, n.Name, "kubelet.kubeconfig")
	if err := n.startKubelet(c.BinDir, kc, c.NodeIP, c.kubeletCA, c.opts.KubeletVerbosity); err != nil {
		return err
	}
	n.crashed = false
	// The Node object may still say Ready from before the crash: wait for
	// a heartbeat of the new kubelet (whole seconds, hence the margin).
	since := began.Add(time.Second)
	err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		if n.kubelet.exited() {
			return false, fmt.Errorf("the kubelet of %s exited: %v\n%s", n.Name, n.kubelet.err, n.kubelet.tail(20))
		}
		var node corev1.Node
		if err := c.Env.Client.Get(ctx, client.ObjectKey{Name: n.Name}, &node); err != nil {
			return false, nil
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since), nil
			}
		}
		return false, nil
	}, "node "+n.Name+" Ready after its restart")
	if err == nil {
		c.logf("node %s restarted and Ready in %s", n.Name, time.Since(began).Round(time.Millisecond))
	}
	return err
}

// CutOff cuts a running node off from the control plane, as a pulled
// network cable would: its link on the bridge goes down, so the
// apiserver's calls to its kubelet (logs, exec) fail, and its proxy to the
// apiserver stops carrying bytes — connections in flight hang, new ones
// are accepted and hang too. Everything on the node goes on running.
// Reconnect undoes it. It needs Options.Namespaces.
func (n *Node) CutOff() error {
	if n.nsPID == 0 || n.proxy == nil {
		return fmt.Errorf("kubecluster: node %s has no network of its own to cut", n.Name)
	}
	if n.crashed {
		return fmt.Errorf("kubecluster: node %s has crashed", n.Name)
	}
	if _, err := execOutput("ip", "link", "set", n.vethName(), "down"); err != nil {
		return fmt.Errorf("kubecluster: cutting %s off: %w", n.Name, err)
	}
	n.proxy.hold()
	return nil
}

// Reconnect ends CutOff: the link comes up, and the proxy carries the
// bytes it held and what follows.
func (n *Node) Reconnect() error {
	if n.nsPID == 0 || n.proxy == nil {
		return errors.New("kubecluster: node " + n.Name + " has no network of its own")
	}
	if _, err := execOutput("ip", "link", "set", n.vethName(), "up"); err != nil {
		return fmt.Errorf("kubecluster: reconnecting %s: %w", n.Name, err)
	}
	n.proxy.release()
	return nil
}

// vethName is the machine's end of the node's link on the bridge (an
// interface name has at most 15 bytes).
func (n *Node) vethName() string {
	v := vethPrefix + n.Name
	if len(v) > 15 {
		v = v[:15]
	}
	return v
}

// TaskRunning says whether container id has a running task in the node's
// containerd (ctr tasks ls, namespace k8s.io: the kubelet's).
func TaskRunning(n *Node, id string) (bool, error) {
	out, err := execOutput("ctr", "--address", n.ContainerdAddress, "--namespace", "k8s.io", "tasks", "ls")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id {
			return f[2] == "RUNNING", nil
		}
	}
	return false, nil
}

// StallAPIServer holds every node's connections to the apiserver for d,
// as an apiserver that stops answering would: the kubelets', the agents',
// the controllers' requests and watches wait, then go on. The machine's
// own clients (kube-controller-manager, the scheduler, a test) are not
// held.
func (c *Cluster) StallAPIServer(d time.Duration) error {
	var held []*apiProxy
	for _, n := range c.Nodes {
		if n.proxy == nil || n.crashed {
			continue
		}
		n.proxy.hold()
		held = append(held, n.proxy)
	}
	if len(held) == 0 {
		return errors.New("kubecluster: no node's apiserver connection to stall (Options.Namespaces)")
	}
	time.Sleep(d)
	for _, p := range held {
		p.release()
	}
	return nil
}
