package api

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
)

// managed returns the managedFields entry of manager (for the main resource when
// subresource is "", for the status subresource when it is "status"), decoded into the
// set of field paths it owns, written as ".status.datameshRevision" and so on.
func managed(t *testing.T, u *unstructured.Unstructured, manager, subresource string) (paths map[string]bool, ok bool) {
	t.Helper()
	for _, e := range u.GetManagedFields() {
		if e.Manager != manager || e.Subresource != subresource || e.Operation != metav1.ManagedFieldsOperationApply {
			continue
		}
		var fields map[string]any
		if err := json.Unmarshal(e.FieldsV1.Raw, &fields); err != nil {
			t.Fatalf("managedFields of %s: %v", manager, err)
		}
		paths = map[string]bool{}
		flatten(fields, "", paths)
		return paths, true
	}
	return nil, false
}

// flatten turns FieldsV1 ({"f:status":{"f:phase":{}}}) into paths (".status.phase").
// Keys of list-map entries ("k:{\"type\":\"Ready\"}") stay in the path as written.
func flatten(m map[string]any, prefix string, out map[string]bool) {
	for k, v := range m {
		if k == "." {
			continue
		}
		p := prefix + "." + strings.TrimPrefix(k, "f:")
		out[p] = true
		if sub, ok := v.(map[string]any); ok {
			flatten(sub, p, out)
		}
	}
}

func ownsUnder(paths map[string]bool, prefix string) bool {
	for p := range paths {
		if p == prefix || strings.HasPrefix(p, prefix+".") {
			return true
		}
	}
	return false
}

// ownsBeneath: some path below prefix, not prefix itself, is owned — what an atomic
// field never shows.
func ownsBeneath(paths map[string]bool, prefix string) bool {
	for p := range paths {
		if strings.HasPrefix(p, prefix+".") {
			return true
		}
	}
	return false
}

// TestStatusIsASubresource proves the two halves of an object are written apart: a
// write to the main resource cannot change status, a write to the status subresource
// cannot change spec, and only spec changes move metadata.generation (which is what
// status.observedGeneration is compared against).
func TestStatusIsASubresource(t *testing.T) {
	name := testenv.Name(t)
	mustApply(t, fromYAML(t, `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d}
`, name), managerCSI)
	mustApplyStatus(t, fromYAML(t, `
kind: ReplicatedVolume
metadata: {name: $NAME}
status: {observedGeneration: 1, phase: Ready, layout: 3D, readyMembers: 3/3, datameshRevision: 3}
`, name), managerController)

	rv := get(t, fromYAML(t, "kind: ReplicatedVolume\nmetadata: {name: $NAME}", name))
	if g := rv.GetGeneration(); g != 1 {
		t.Fatalf("generation after create and a status write = %d, want 1", g)
	}

	// A spec writer that also sends status (as a careless whole-object writer would):
	// the spec change lands, the status part is dropped.
	if err := apply(ctx(t), fromYAML(t, `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 20Gi, replicatedStorageClassName: rsc-3d}
status: {phase: Degraded, datameshRevision: 99}
`, name), managerCSI); err != nil {
		t.Fatal(err)
	}
	rv = get(t, rv)
	if got := field(t, rv, "spec", "size"); got != "20Gi" {
		t.Errorf("spec.size = %v after a spec write, want 20Gi", got)
	}
	if got := field(t, rv, "status", "phase"); got != "Ready" {
		t.Errorf("status.phase = %v after a spec write carrying status, want Ready (untouched)", got)
	}
	if got := field(t, rv, "status", "datameshRevision"); got != int64(3) {
		t.Errorf("status.datameshRevision = %v after a spec write carrying status, want 3 (untouched)", got)
	}
	if g := rv.GetGeneration(); g != 2 {
		t.Errorf("generation after a spec change = %d, want 2", g)
	}

	// A status writer that also sends spec, even a spec the spec rules would refuse
	// (a shrink): the status change lands, spec is neither changed nor validated.
	if err := applyStatus(ctx(t), fromYAML(t, `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 5Gi, replicatedStorageClassName: other}
status: {observedGeneration: 2, phase: Degraded, layout: 3D, readyMembers: 2/3, datameshRevision: 3}
`, name), managerController); err != nil {
		t.Fatal(err)
	}
	rv = get(t, rv)
	if got := field(t, rv, "spec", "size"); got != "20Gi" {
		t.Errorf("spec.size = %v after a status write carrying spec, want 20Gi (untouched)", got)
	}
	if got := field(t, rv, "spec", "replicatedStorageClassName"); got != "rsc-3d" {
		t.Errorf("spec.replicatedStorageClassName = %v after a status write carrying spec, want rsc-3d", got)
	}
	if got := field(t, rv, "status", "phase"); got != "Degraded" {
		t.Errorf("status.phase = %v, want Degraded", got)
	}
	if g := rv.GetGeneration(); g != 2 {
		t.Errorf("generation after a status write = %d, want 2 (status never moves it)", g)
	}

	// Ownership is recorded per half: neither writer owns a field of the other half,
	// so neither can ever conflict with, or remove, the other's fields.
	csi, ok := managed(t, rv, managerCSI, "")
	if !ok {
		t.Fatalf("no managedFields entry for %s on the main resource", managerCSI)
	}
	if ownsUnder(csi, ".status") || !csi[".spec.size"] {
		t.Errorf("%s owns %v; want .spec fields and no .status field", managerCSI, keys(csi))
	}
	ctl, ok := managed(t, rv, managerController, "status")
	if !ok {
		t.Fatalf("no managedFields entry for %s on the status subresource", managerController)
	}
	if ownsUnder(ctl, ".spec") || !ctl[".status"] {
		t.Errorf("%s owns %v; want .status fields and no .spec field", managerController, keys(ctl))
	}
}

// TestRVStatusIsOneField: an RV's status has one writer, the controller, which
// always writes it whole (docs/contract.md): the schema makes it atomic, so the
// apiserver records one owned field, not every member and condition. Another
// manager's status apply is refused as a conflict naming the controller; forced, it
// replaces the whole status, and the controller's next apply in turn conflicts:
// ownership changed hands as a whole, it was never shared by accident.
func TestRVStatusIsOneField(t *testing.T) {
	name := testenv.Name(t)
	rv := rvSpec(t, name)
	mustApply(t, rv, managerCSI)

	mustApplyStatus(t, rvStatus(t, name, 3, "a", "b", "c"), managerController)
	mustApplyStatus(t, rvStatus(t, name, 4, "a", "b", "d"), managerController)
	got := get(t, rv)
	if m := memberNames(t, got); !reflect.DeepEqual(m, []string{name + "-a", name + "-b", name + "-d"}) {
		t.Errorf("members after the controller's second apply = %v, want a, b, d", m)
	}
	ctl, _ := managed(t, got, managerController, "status")
	if !ctl[".status"] || ownsBeneath(ctl, ".status") {
		t.Errorf("%s should own .status as one field; owns %v", managerController, keys(ctl))
	}

	// Another manager's condition: a conflict that names the owner and the field,
	// and changes nothing.
	ready := fromYAML(t, `
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  conditions:
  - {type: Ready, status: "False", reason: Degraded, message: "from another manager", lastTransitionTime: "2025-03-14T15:10:00Z"}
`, name)
	err := applyStatus(ctx(t), ready, managerHealth)
	if !apierrors.IsConflict(err) {
		t.Fatalf("applying a condition as %s: want a conflict, got %v", managerHealth, err)
	}
	for _, want := range []string{`with "meshvol-controller" with subresource "status"`, ".status"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("conflict message %q does not contain %q", err.Error(), want)
		}
	}
	if r := field(t, get(t, rv), "status", "datameshRevision"); r != int64(4) {
		t.Errorf("datameshRevision after a refused apply = %v, want 4", r)
	}

	// Forced, the status is taken whole: the datamesh goes with it.
	if err := applyStatus(ctx(t), ready, managerHealth, client.ForceOwnership); err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	got = get(t, rv)
	if c := conditions(t, got); c["Ready"] != "False/Degraded" || c["Formed"] != "" {
		t.Errorf("conditions after a forced apply = %v, want Ready alone", c)
	}
	if _, found, _ := unstructured.NestedMap(got.Object, "status", "datamesh"); found {
		t.Errorf("datamesh after another manager's forced apply: still there, want the status replaced whole")
	}
	if ctl, _ := managed(t, got, managerController, "status"); len(ctl) > 0 {
		t.Errorf("%s still owns %v after a forced takeover", managerController, keys(ctl))
	}
	err = applyStatus(ctx(t), rvStatus(t, name, 5, "a", "b", "d"), managerController)
	if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), `with "meshvol-health"`) {
		t.Errorf("the former owner's apply: want a conflict with %s, got %v", managerHealth, err)
	}
}

// TestStatusManagersShareRVR: the node agent writes what DRBD reports (disk state,
// role, revision, peers, its DRBDConfigured condition); the controller adds a condition
// of its own to the same status. When the agent is gone, the controller may mark the
// agent's condition stale only by forcing, which is a deliberate, visible takeover.
func TestStatusManagersShareRVR(t *testing.T) {
	name := testenv.Name(t)
	rvr := fromYAML(t, rvrOK, name)
	mustApply(t, rvr, managerController)

	agent := func(disk, role string, revision int) *unstructured.Unstructured {
		return fromYAML(t, fmt.Sprintf(`
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status:
  diskState: %s
  role: %s
  datameshRevision: %d
  quorum: true
  peers: [{name: pvc-1-1, connectionState: Connected, replicationState: Established, peerDiskState: UpToDate}]
  conditions:
  - {type: DRBDConfigured, status: "True", reason: Configured, message: "DRBD runs revision %d", lastTransitionTime: "2025-03-14T15:09:26Z"}
`, disk, role, revision, revision), name)
	}
	mustApplyStatus(t, agent("UpToDate", "Secondary", 3), managerAgent)
	mustApplyStatus(t, fromYAML(t, `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status:
  conditions:
  - {type: Scheduled, status: "True", reason: Placed, message: "placed on node-1 in pool-a", lastTransitionTime: "2025-03-14T15:09:00Z"}
`, name), managerController)

	// The agent reports a new disk state; the controller's condition survives.
	mustApplyStatus(t, agent("Outdated", "Primary", 4), managerAgent)
	got := get(t, rvr)
	if d := field(t, got, "status", "diskState"); d != "Outdated" {
		t.Errorf("diskState = %v, want Outdated", d)
	}
	if c := conditions(t, got); c["Scheduled"] != "True/Placed" || c["DRBDConfigured"] != "True/Configured" {
		t.Errorf("conditions = %v, want the controller's Scheduled and the agent's DRBDConfigured", c)
	}
	// The peers, which only the agent writes and always whole, are one field to the
	// apiserver (atomic), not one per peer and per peer's field.
	if ag, _ := managed(t, got, managerAgent, "status"); !ag[".status.peers"] || ownsBeneath(ag, ".status.peers") {
		t.Errorf("%s should own .status.peers as one field; owns %v", managerAgent, keys(ag))
	}

	// The controller rewrites its own condition; the agent's fields stay.
	mustApplyStatus(t, fromYAML(t, `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status:
  conditions:
  - {type: Scheduled, status: "True", reason: Placed, message: "placed on node-1 in pool-a", lastTransitionTime: "2025-03-14T15:09:00Z"}
`, name), managerController)
	got = get(t, rvr)
	if d, r := field(t, got, "status", "diskState"), field(t, got, "status", "datameshRevision"); d != "Outdated" || r != int64(4) {
		t.Errorf("agent fields after the controller's apply: diskState %v revision %v, want Outdated 4", d, r)
	}

	// The agent's lease expired: the controller wants DRBDConfigured to say so. That
	// condition is the agent's; without force the apiserver refuses and names it.
	stale := fromYAML(t, `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status:
  conditions:
  - {type: Scheduled, status: "True", reason: Placed, message: "placed on node-1 in pool-a", lastTransitionTime: "2025-03-14T15:09:00Z"}
  - {type: DRBDConfigured, status: Unknown, reason: AgentNotReady, message: "the agent on node-1 has not renewed its lease for 40s", lastTransitionTime: "2025-03-14T15:20:00Z"}
`, name)
	err := applyStatus(ctx(t), stale, managerController)
	if !apierrors.IsConflict(err) {
		t.Fatalf("controller applying the agent's condition: want a conflict, got %v", err)
	}
	for _, want := range []string{`with "meshvol-agent" with subresource "status"`, `.status.conditions[type="DRBDConfigured"]`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("conflict message %q does not contain %q", err.Error(), want)
		}
	}
	if err := applyStatus(ctx(t), stale, managerController, client.ForceOwnership); err != nil {
		t.Fatalf("forced apply: %v", err)
	}
	got = get(t, rvr)
	if c := conditions(t, got); c["DRBDConfigured"] != "Unknown/AgentNotReady" {
		t.Errorf("DRBDConfigured after the forced apply = %v, want Unknown/AgentNotReady", c["DRBDConfigured"])
	}
	if d := field(t, got, "status", "diskState"); d != "Outdated" {
		t.Errorf("diskState after the controller's forced condition = %v, want the agent's Outdated", d)
	}
}

// rvSpec is an RV as the CSI service creates it: a 10Gi volume of class rsc-3d.
func rvSpec(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	return fromYAML(t, `
kind: ReplicatedVolume
metadata: {name: $NAME}
spec: {size: 10Gi, replicatedStorageClassName: rsc-3d}
`, name)
}

// rvStatus is an RV status as the controller applies it: revision, the datamesh of the
// members named (replicas <name>-<m> on nodes node-<m>), the layout and a condition.
func rvStatus(t *testing.T, name string, revision int, members ...string) *unstructured.Unstructured {
	t.Helper()
	var ms []string
	for i, m := range members {
		ms = append(ms, fmt.Sprintf("{name: %s-%s, type: Diskful, nodeName: node-%s, nodeID: %d}", name, m, m, i))
	}
	return fromYAML(t, fmt.Sprintf(`
kind: ReplicatedVolume
metadata: {name: $NAME}
status:
  datameshRevision: %d
  datamesh: {members: [%s], quorum: 2, quorumMinimumRedundancy: 2}
  layout: %dD
  readyMembers: %d/%d
  conditions:
  - {type: Formed, status: "True", reason: Formed, message: datamesh formed, lastTransitionTime: "2025-03-14T15:09:26Z"}
`, revision, strings.Join(ms, ", "), len(members), len(members), len(members)), name)
}

func memberNames(t *testing.T, u *unstructured.Unstructured) []string {
	t.Helper()
	var names []string
	for _, m := range field(t, u, "status", "datamesh", "members").([]any) {
		names = append(names, m.(map[string]any)["name"].(string))
	}
	return names
}

// conditions maps a status's condition types to "status/reason".
func conditions(t *testing.T, u *unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, c := range field(t, u, "status", "conditions").([]any) {
		m := c.(map[string]any)
		out[m["type"].(string)] = fmt.Sprintf("%s/%s", m["status"], m["reason"])
	}
	return out
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
