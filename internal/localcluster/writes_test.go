package localcluster

import "testing"

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/storage.meshvol.io/v1alpha1/replicatedvolumereplicas/v-n1/status":        "replicatedvolumereplicas/status",
		"/apis/storage.meshvol.io/v1alpha1/replicatedvolumes":                           "replicatedvolumes",
		"/apis/coordination.k8s.io/v1/namespaces/meshvol-system/leases/meshvol-node-n1": "leases",
		"/api/v1/namespaces/meshvol-system/events":                                      "events",
		"/api/v1/namespaces/meshvol-system/secrets/drbd-v":                              "secrets",
		"/apis/storage.meshvol.io/v1alpha1/replicatedvolumeattachments/v-n1":            "replicatedvolumeattachments",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", path, got, want)
		}
	}
	var w Writes
	before := w.Snapshot()
	w.add("agent PATCH x")
	w.add("agent PATCH x")
	if d, n := w.Since(before); n != 2 || d["agent PATCH x"] != 2 {
		t.Fatalf("Since: %v %d", d, n)
	}
}
