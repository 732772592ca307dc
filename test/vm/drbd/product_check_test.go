//go:build vmtest

package drbd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/scenario"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// TestProductNodeCheck is `meshvol node`'s start-up check (pkg/nodecheck) on
// a guest without the DRBD module and then with it: the agent keeps running,
// its Lease names what is missing, the pool takes no replicas on that node
// and its Ready condition says why; once the module is loaded the next check
// (at most productCheckInterval later) clears both, without restarting the
// agent. It runs before the other tests on the guests (files run in name
// order), while no volume holds the module.
// productCheckInterval is the guests' `meshvol node
// --prerequisite-check-interval`: a tenth of the default minute, which would
// be most of this test's time.
const productCheckInterval = 10 * time.Second

func TestProductNodeCheck(t *testing.T) {
	waitProduct(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	node := prod.names[len(prod.names)-1]
	if err := prod.remotes[node].stopNode(ctx, false); err != nil {
		t.Fatal(err)
	}
	// The module is unloaded and its files hidden behind an empty tmpfs,
	// as on a node where it was never installed, so that nothing loads it
	// behind the test's back. The guest's init loaded it from updates/
	// (hack/vm-image.sh); handshake stays loaded, it holds nothing.
	hide := "d=/lib/modules/$(uname -r)/updates; rmmod drbd_transport_tcp drbd && mount -t tmpfs none $d && ! modprobe drbd 2>/dev/null && test ! -e /proc/drbd"
	if out, err := prod.Shell(ctx, node, hide); err != nil {
		t.Fatalf("unloading DRBD on %s: %v: %s", node, err, out)
	}
	restored := false
	defer func() {
		if !restored {
			_, _ = prod.Shell(ctx, node, "umount /lib/modules/$(uname -r)/updates; modprobe drbd; modprobe drbd_transport_tcp")
		}
	}()
	kc, err := prod.guestKubeconfig(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.remotes[node].startNode(ctx, node, kc); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	lease, ready := waitNodeCheck(ctx, t, node, func(prereq string, e *v1.EligibleNode, msg string) string {
		if !strings.Contains(prereq, "drbd kernel module: not loaded") || !strings.Contains(prereq, "drbd_transport_tcp (DRBD's TCP transport): not loaded") {
			return "Lease prerequisites " + fmt.Sprintf("%q", prereq)
		}
		if e == nil || e.Ready {
			return fmt.Sprintf("eligible node %+v", e)
		}
		if !strings.Contains(msg, "node "+node+" is missing prerequisites: drbd kernel module: not loaded") {
			return "pool Ready " + fmt.Sprintf("%q", msg)
		}
		return ""
	})
	t.Logf("without the module, %s after the agent started: Lease %s: %q; pool %s: %q", time.Since(began).Round(100*time.Millisecond), v1.AgentLeasePrefix+node, lease, prod.Pool(), ready)
	if out, err := prod.Shell(ctx, node, "for p in /proc/[0-9]*; do [ \"$(readlink $p/exe)\" = "+meshvolBinary+" ] && exit 0; done; exit 1"); err != nil {
		t.Fatalf("meshvol node on %s did not keep running without the module: %v: %s", node, err, out)
	}

	if out, err := prod.Shell(ctx, node, "umount /lib/modules/$(uname -r)/updates && modprobe drbd && modprobe drbd_transport_tcp && head -1 /proc/drbd"); err != nil {
		t.Fatalf("loading DRBD on %s: %v: %s", node, err, out)
	}
	restored = true
	loaded := time.Now()
	lease, ready = waitNodeCheck(ctx, t, node, func(prereq string, e *v1.EligibleNode, msg string) string {
		if prereq != "" {
			return "Lease prerequisites " + fmt.Sprintf("%q", prereq)
		}
		if e == nil || !e.Ready {
			return fmt.Sprintf("eligible node %+v", e)
		}
		if strings.Contains(msg, "missing prerequisites") {
			return "pool Ready " + fmt.Sprintf("%q", msg)
		}
		return ""
	})
	t.Logf("module loaded: the same agent cleared it %s later: Lease prerequisites %q; pool %s: %q", time.Since(loaded).Round(100*time.Millisecond), lease, prod.Pool(), ready)
	if err := scenario.WaitPool(ctx, prod, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
}

// waitNodeCheck polls node's Lease (its prerequisites annotation) and the
// product pool (node's eligible entry, the Ready condition's message) until
// cond says "" or five minutes pass; it returns the last annotation and message.
func waitNodeCheck(ctx context.Context, t *testing.T, node string, cond func(prereq string, e *v1.EligibleNode, msg string) string) (string, string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var l coordinationv1.Lease
		var rsp v1.ReplicatedStoragePool
		err := prod.env.Client.Get(ctx, client.ObjectKey{Namespace: prod.Namespace(), Name: v1.AgentLeasePrefix + node}, &l)
		if err == nil {
			err = prod.env.Client.Get(ctx, client.ObjectKey{Name: prod.Pool()}, &rsp)
		}
		var prereq, msg, last string
		if err != nil {
			last = err.Error()
		} else {
			prereq = l.Annotations[v1.AnnotationPrerequisites]
			var e *v1.EligibleNode
			for i := range rsp.Status.EligibleNodes {
				if rsp.Status.EligibleNodes[i].NodeName == node {
					e = &rsp.Status.EligibleNodes[i]
				}
			}
			if c := meta.FindStatusCondition(rsp.Status.Conditions, v1.ConditionReady); c != nil {
				msg = c.Message
			}
			if last = cond(prereq, e, msg); last == "" {
				return prereq, msg
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 minutes: %s", node, last)
		}
		time.Sleep(time.Second)
	}
}
