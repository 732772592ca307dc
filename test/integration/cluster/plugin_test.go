package cluster_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/meshvol/meshvol/internal/metricstest"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/kubectlmeshvol"
)

// TestPluginShowsDegraded2D1TB: `kubectl meshvol status` and `nodes`, run as the
// plugin runs (a kubeconfig file, a context), on a formed 2D+1TB volume whose
// non-attached Diskful node crashed with no node left to replace it: the output
// names the volume Degraded, its effective protection below the configured one,
// the lost node's agent Lost, and the member left UpToDate. The metrics are
// scraped all along, and every metric the chart's alerts and dashboard use must
// have been exported (monitoring_test.go).
func TestPluginShowsDegraded2D1TB(t *testing.T) {
	r := newRig(t)
	scraped := r.scraper()
	const vol = "plugin-2d1tb"
	all, diskful := r.formed2D1TB(vol)
	r.cordonAllBut(all...)
	attached, lost := diskful[0], diskful[1]
	r.attach(vol, attached)
	kubeconfig := r.kubeconfig()
	claim := r.claim(vol)

	ready := r.plugin(kubeconfig, "status", vol)
	for _, want := range []string{"ReplicatedVolume " + vol, "Phase:      Ready", "configured 2D+1TB (FTT=1 GMDR=0), effective 2D+1TB (FTT=1 GMDR=0), 2/2 Diskful UpToDate\n", "Diskful,attached"} {
		if !strings.Contains(ready, want) {
			t.Errorf("status of the formed volume lacks %q:\n%s", want, ready)
		}
	}

	r.must(r.c.CrashNode(lost))
	r.t.Cleanup(func() { _ = r.c.RestartNode(lost) })
	lostReplica := v1.ReplicaName(vol, lost)
	r.eventually(vol+" degraded with "+lost+" lost", 2*time.Minute, func() string {
		cur := r.rv(vol)
		if cur.Status.Phase != v1.VolumePhaseDegraded {
			return phase(cur)
		}
		rvr := &v1.ReplicatedVolumeReplica{}
		if err := r.cl.Get(r.ctx, client.ObjectKey{Name: lostReplica}, rvr); err != nil {
			return err.Error()
		}
		if !meta.IsStatusConditionFalse(rvr.Status.Conditions, v1.ConditionAgentReady) {
			return "the controller has not judged " + lost + " lost yet"
		}
		return ""
	})
	out := r.plugin(kubeconfig, "status", vol, "-o", "wide")
	t.Logf("kubectl meshvol status %s -o wide, %s lost:\n%s", vol, lost, out)
	for _, want := range []string{"Phase:      Degraded", "configured 2D+1TB (FTT=1 GMDR=0)", "1/2 Diskful UpToDate  DEGRADED", "Not True:", "Ready=False Degraded"} {
		if !strings.Contains(out, want) {
			t.Errorf("status of the degraded volume lacks %q", want)
		}
	}
	if row := line(out, lostReplica); !strings.Contains(row, " Lost (stale report) ") {
		t.Errorf("the lost replica's row does not say its agent is Lost: %q", row)
	}
	if row := line(out, v1.ReplicaName(vol, attached)); !strings.Contains(row, "UpToDate") || !strings.Contains(row, "Primary") || !strings.Contains(row, " Live ") {
		t.Errorf("the surviving attached replica's row is not Live, UpToDate, Primary: %q", row)
	}

	var view kubectlmeshvol.VolumeView
	r.must(json.Unmarshal([]byte(r.plugin(kubeconfig, "status", vol, "-o", "json")), &view))
	if !view.Degraded || view.Configured == nil || view.Configured.Layout != "2D+1TB" || view.Phase != string(v1.VolumePhaseDegraded) {
		t.Errorf("json view: degraded %v, configured %v, phase %s", view.Degraded, view.Configured, view.Phase)
	}

	nodes := r.plugin(kubeconfig, "nodes")
	t.Logf("kubectl meshvol nodes:\n%s", nodes)
	if row := line(nodes, lost+" "); !strings.Contains(row, "Lost") {
		t.Errorf("nodes: %s is not Lost: %q", lost, row)
	}
	if row := line(nodes, attached+" "); !strings.Contains(row, "Live") || !strings.Contains(row, vol) || !strings.Contains(row, pool+" ") {
		t.Errorf("nodes: %s is not Live with %s attached and pool %s: %q", attached, vol, pool, row)
	}
	r.agentMetrics(vol, attached, lost)
	r.controllerMetrics(vol, lost)
	r.claimEvents(claim, corev1.EventTypeWarning, "VolumeDegraded", "meshvol volume "+vol+" is Degraded: 1/2 Diskful UpToDate (layout 2D+1TB)")
	r.detach(vol, attached)
	r.must(r.c.RestartNode(lost))
	r.ready(vol, 2*time.Minute)
	r.checkMonitored(scraped())
	r.deleteVolume(vol)
}

// formed2D1TB creates a 2D+1TB volume and waits until it is Ready: the nodes of
// its members, and of its Diskful members.
func (r *rig) formed2D1TB(vol string) (all, diskful []string) {
	r.t.Helper()
	for _, m := range r.formed(vol, layoutsNamed("2D+1TB")[0]).Status.Datamesh.Members {
		all = append(all, m.NodeName)
		if m.Type == v1.MemberTypeDiskful {
			diskful = append(diskful, m.NodeName)
		}
	}
	return all, diskful
}

// agentMetrics checks the agents' series of the degraded volume in the
// registry every in-process agent serves (docs/operating.md, "Agent
// metrics"): the attached survivor is Primary and UpToDate with quorum and
// the current revision, its connection to the lost node is down, the lost
// node's agent exports nothing any more, DRBD commands were timed, and every
// meshvol_agent_ name passes the Prometheus linter.
func (r *rig) agentMetrics(vol, attached, lost string) {
	r.t.Helper()
	series, names := metricstest.Series(r.t, metrics.Registry, "meshvol_agent_")
	for key := range series {
		_, labels, _ := strings.Cut(strings.TrimSuffix(key, "}"), "{")
		if slices.Contains(strings.Split(labels, ","), "node="+lost) {
			r.t.Errorf("the lost node's agent still exports %s", key)
		}
	}
	for key, want := range map[string]float64{
		"meshvol_agent_replica_role{node=" + attached + ",role=Primary,volume=" + vol + "}":                                    1,
		"meshvol_agent_replica_disk_state{node=" + attached + ",state=UpToDate,volume=" + vol + "}":                            1,
		"meshvol_agent_replica_quorum{node=" + attached + ",volume=" + vol + "}":                                               1,
		"meshvol_agent_replica_io_suspended{node=" + attached + ",volume=" + vol + "}":                                         0,
		"meshvol_agent_replica_revision_current{node=" + attached + ",volume=" + vol + "}":                                     1,
		"meshvol_agent_peer_connection_state{node=" + attached + ",peer_node=" + lost + ",state=Connected,volume=" + vol + "}": -1,
	} {
		got, ok := series[key]
		switch {
		case want < 0 && ok:
			r.t.Errorf("%s = %v: the connection to the lost node is not Connected", key, got)
		case want >= 0 && (!ok || got != want):
			r.t.Errorf("%s = %v (exported %v), want %v", key, got, ok, want)
		}
	}
	var pool bool
	var timed []string
	for key, v := range series {
		pool = pool || strings.HasPrefix(key, "meshvol_agent_pool_free_bytes{node="+attached+",") && v > 0
		if c, ok := strings.CutPrefix(key, "meshvol_agent_drbd_command_duration_seconds{command="); ok && v > 0 {
			timed = append(timed, strings.TrimSuffix(c, "}"))
		}
	}
	// Every volume's replicas were brought up and made Primary somewhere.
	if !pool || !slices.Contains(timed, "up") || !slices.Contains(timed, "primary") {
		r.t.Errorf("pool free bytes of %s exported: %v; DRBD commands timed: %v, want up and primary among them", attached, pool, timed)
	}
	metricstest.Lint(r.t, metrics.Registry, names...)
	r.t.Logf("%d agent metric families, %d series", len(names), len(series))
}

// controllerMetrics checks the controller's state series of the degraded volume
// (docs/operating.md, "Controller metrics") in the registry the in-process
// controller serves: the volume Degraded with one of two Diskful UpToDate and
// quorum, its configured protection 2D+1TB, the lost node's agent Lost, and every
// meshvol_controller_ name passes the Prometheus linter.
func (r *rig) controllerMetrics(vol, lost string) {
	r.t.Helper()
	series, names := metricstest.Series(r.t, metrics.Registry, "meshvol_controller_")
	for key, want := range map[string]float64{
		"meshvol_controller_volume_phase{phase=Degraded,volume=" + vol + "}":                                 1,
		"meshvol_controller_volume_phase{phase=Ready,volume=" + vol + "}":                                    0,
		"meshvol_controller_volume_diskful_up_to_date{volume=" + vol + "}":                                   1,
		"meshvol_controller_volume_diskful_wanted{volume=" + vol + "}":                                       2,
		"meshvol_controller_volume_quorum{volume=" + vol + "}":                                               1,
		"meshvol_controller_volume_failures_to_tolerate{layout=configured,volume=" + vol + "}":               1,
		"meshvol_controller_node_agent_state{node=" + lost + ",state=Lost}":                                  1,
		"meshvol_controller_volume_guaranteed_minimum_data_redundancy{layout=configured,volume=" + vol + "}": 0,
	} {
		if got, ok := series[key]; !ok || got != want {
			r.t.Errorf("%s = %v (exported %v), want %v", key, got, ok, want)
		}
	}
	if series["meshvol_controller_volumes{phase=Degraded}"] < 1 || series["meshvol_controller_nodes{state=Lost}"] < 1 {
		r.t.Errorf("the totals miss the degraded volume or the lost node: volumes Degraded %v, nodes Lost %v",
			series["meshvol_controller_volumes{phase=Degraded}"], series["meshvol_controller_nodes{state=Lost}"])
	}
	metricstest.Lint(r.t, metrics.Registry, names...)
	r.t.Logf("%d controller metric families, %d series", len(names), len(series))
}

// claim creates what the external-provisioner leaves for a provisioned volume: a PV
// named after the CreateVolume name (the volume's), bound to a claim.
func (r *rig) claim(vol string) *corev1.PersistentVolumeClaim {
	r.t.Helper()
	const ns = "claims"
	if err := r.cl.Create(r.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		r.t.Fatal(err)
	}
	size := resource.MustParse("64Mi")
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-" + vol, Namespace: ns}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &empty, VolumeName: vol,
		Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
	}}
	r.must(r.cl.Create(r.ctx, pvc))
	r.t.Cleanup(func() { r.remove(pvc) })
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: vol}, Spec: corev1.PersistentVolumeSpec{
		Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
		AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
		ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: pvc.Name, UID: pvc.UID},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: v1.CSIDriverName, VolumeHandle: vol}},
	}}
	r.must(r.cl.Create(r.ctx, pv))
	r.t.Cleanup(func() { r.remove(pv) })
	return pvc
}

// claimEvents checks what `kubectl describe pvc` lists: the events whose
// involved object is the claim: the volume's phase change to the wanted reason
// is there with the Ready condition's message.
func (r *rig) claimEvents(pvc *corev1.PersistentVolumeClaim, typ, reason, msg string) {
	r.t.Helper()
	var list corev1.EventList
	r.eventually("event "+reason+" on claim "+pvc.Name, 30*time.Second, func() string {
		r.must(r.cl.List(r.ctx, &list, client.InNamespace(pvc.Namespace)))
		for _, e := range list.Items {
			if e.InvolvedObject.UID == pvc.UID && e.Reason == reason {
				return ""
			}
		}
		return fmt.Sprintf("%d events in %s, none %s on the claim", len(list.Items), pvc.Namespace, reason)
	})
	var mine []string
	for _, e := range list.Items {
		if e.InvolvedObject.UID != pvc.UID {
			continue
		}
		mine = append(mine, e.Type+" "+e.Reason+": "+e.Message)
		if e.Reason == reason && (e.Type != typ || !strings.HasPrefix(e.Message, msg)) {
			r.t.Errorf("claim event %s: %s %q, want %s starting %q", reason, e.Type, e.Message, typ, msg)
		}
	}
	r.t.Logf("events of claim %s/%s:\n%s", pvc.Namespace, pvc.Name, strings.Join(mine, "\n"))
}

// pluginConfig is a kubeconfig file for the plugin and the context in it that
// reaches the cluster: the file's current context is another one, pointing
// nowhere, so that only --context makes the plugin work.
type pluginConfig struct{ path, context string }

func (r *rig) kubeconfig() pluginConfig {
	b, err := env.KubeConfig("kubectl-meshvol", "system:masters")
	r.must(err)
	cfg, err := clientcmd.Load(b)
	r.must(err)
	real := cfg.CurrentContext
	cfg.Clusters["nowhere"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.Contexts["nowhere"] = &clientcmdapi.Context{Cluster: "nowhere", AuthInfo: cfg.Contexts[real].AuthInfo}
	cfg.CurrentContext = "nowhere"
	path := filepath.Join(r.t.TempDir(), "kubeconfig")
	r.must(clientcmd.WriteToFile(*cfg, path))
	return pluginConfig{path: path, context: real}
}

// plugin runs the plugin's main as `kubectl meshvol ARGS --kubeconfig PATH
// --context NAME` does and returns its output.
func (r *rig) plugin(kc pluginConfig, args ...string) string {
	r.t.Helper()
	var out, errOut bytes.Buffer
	if err := kubectlmeshvol.Run(r.ctx, append(args, "--kubeconfig", kc.path, "--context", kc.context), &out, &errOut); err != nil {
		r.t.Fatalf("kubectl meshvol %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

// line is the first line of out that contains s.
func line(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
