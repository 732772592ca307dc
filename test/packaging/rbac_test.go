package packaging

import (
	"fmt"
	"strings"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/crdschema"
)

// access is one row of the RBAC matrix: may subject do verb on resource (in
// namespace, "" for cluster-wide or cluster-scoped)?
type access struct {
	verb, group, resource, subresource, namespace string
	allowed                                       bool
	// name is the object's name, for a rule that names its objects ("" for any).
	name string
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.group != "" {
		r += "." + a.group
	}
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	if a.name != "" {
		r += " " + a.name
	}
	return fmt.Sprintf("%s %s %s", a.verb, r, where)
}

const (
	meshvolGroup = "storage.meshvol.io"
	other        = "default" // a namespace that is not the release's
)

func allow(verb, group, resource, sub, ns string) access {
	return access{verb: verb, group: group, resource: resource, subresource: sub, namespace: ns, allowed: true}
}
func deny(verb, group, resource, sub, ns string) access {
	return access{verb: verb, group: group, resource: resource, subresource: sub, namespace: ns}
}

// named is a for the object called name.
func named(a access, name string) access {
	a.name = name
	return a
}

// rbacMatrix is the table in docs/install.md ("What each component may do"). Keep
// them the same.
var rbacMatrix = map[string][]access{
	"meshvol-node": {
		allow("watch", meshvolGroup, "replicatedvolumes", "", ""),
		allow("list", meshvolGroup, "replicatedstoragepools", "", ""),
		allow("watch", meshvolGroup, "replicatedvolumereplicas", "", ""),
		allow("patch", meshvolGroup, "replicatedvolumereplicas", "status", ""),
		allow("patch", meshvolGroup, "replicatedvolumereplicas", "", ""),  // its finalizer, after teardown
		allow("update", meshvolGroup, "replicatedvolumereplicas", "", ""), // the same, when it is the last one
		allow("get", "", "secrets", "", namespace),
		allow("update", "coordination.k8s.io", "leases", "", namespace),
		allow("get", "", "nodes", "", ""),
		deny("update", meshvolGroup, "replicatedvolumes", "", ""),
		deny("patch", meshvolGroup, "replicatedvolumes", "", ""),
		deny("patch", meshvolGroup, "replicatedvolumes", "status", ""),
		deny("patch", meshvolGroup, "replicatedvolumeattachments", "status", ""),
		deny("create", meshvolGroup, "replicatedvolumereplicas", "", ""),
		deny("delete", meshvolGroup, "replicatedvolumereplicas", "", ""),
		deny("delete", meshvolGroup, "replicatedvolumes", "", ""),
		deny("delete", "", "secrets", "", namespace),
		deny("list", "", "secrets", "", namespace),
		deny("get", "", "secrets", "", other),
		deny("list", "", "secrets", "", ""),
		deny("delete", "", "pods", "", ""),
		deny("patch", "", "nodes", "", ""),
		// The CRDs of the kinds it writes, by name only (whether each keeps every field:
		// TestRBACMatrix checks each), no other.
		named(allow("get", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), "replicatedvolumereplicas.storage.meshvol.io"),
		named(deny("get", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), "replicatedvolumes.storage.meshvol.io"),
		deny("list", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
		named(deny("update", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), "replicatedvolumereplicas.storage.meshvol.io"),
	},
	"meshvol-controller": {
		allow("patch", meshvolGroup, "replicatedvolumes", "status", ""),
		allow("create", meshvolGroup, "replicatedvolumes", "", ""), // the CSI controller service
		allow("create", meshvolGroup, "replicatedvolumereplicas", "", ""),
		allow("delete", meshvolGroup, "replicatedvolumereplicas", "", ""),
		deny("deletecollection", meshvolGroup, "replicatedvolumereplicas", "", ""), // a deleted volume's replicas go by name
		allow("patch", meshvolGroup, "replicatedvolumereplicas", "status", ""),     // AgentReady only, by SSA
		allow("create", meshvolGroup, "replicatedvolumeattachments", "", ""),
		allow("patch", meshvolGroup, "replicatedstoragepools", "status", ""),
		allow("create", "", "secrets", "", namespace),
		allow("delete", "", "secrets", "", namespace),
		allow("watch", "coordination.k8s.io", "leases", "", namespace),
		allow("create", "", "persistentvolumes", "", ""),                    // external-provisioner
		allow("patch", "storage.k8s.io", "volumeattachments", "status", ""), // external-attacher
		allow("patch", "", "persistentvolumeclaims", "status", ""),          // external-resizer
		allow("create", "storage.k8s.io", "csistoragecapacities", "", namespace),
		deny("get", "", "secrets", "", other),
		deny("list", "", "secrets", "", ""),
		deny("create", "", "secrets", "", other),
		allow("list", "", "pods", "", ""),                              // a lost node's (controller.deleteLostPods)
		allow("delete", "", "pods", "", other),                         // the same
		allow("delete", "storage.k8s.io", "volumeattachments", "", ""), // the same
		deny("get", "", "pods", "", other),
		deny("create", "", "pods", "", namespace),
		deny("update", "", "pods", "", other),
		allow("patch", "", "nodes", "", ""), // the taints of a lost node (controller.deleteLostPods)
		deny("update", meshvolGroup, "replicatedstorageclasses", "", ""),
		deny("delete", meshvolGroup, "replicatedstoragepools", "", ""),
		allow("watch", meshvolGroup, "replicatednodemaintenances", "", ""),
		allow("patch", meshvolGroup, "replicatednodemaintenances", "status", ""),
		deny("create", meshvolGroup, "replicatednodemaintenances", "", ""), // a person's (kubectl meshvol drain)
		deny("patch", meshvolGroup, "replicatednodemaintenances", "", ""),
		deny("create", "coordination.k8s.io", "leases", "", other),
		deny("create", "storage.k8s.io", "csistoragecapacities", "", other),
		// meshvol's CRDs, by name only (whether each keeps every field: TestRBACMatrix
		// checks every one), no other.
		named(allow("get", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), "replicatedvolumes.storage.meshvol.io"),
		named(deny("get", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), "volumesnapshots.snapshot.storage.k8s.io"),
		deny("list", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
		named(deny("update", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), "replicatedvolumes.storage.meshvol.io"),
	},
}

// TestRBACMatrix creates the chart's ServiceAccounts and roles for real, then asks the
// apiserver, row by row, whether each component may do what the table says.
func TestRBACMatrix(t *testing.T) {
	ensureNamespace(t)
	applyRBAC(t, render(t, ""))
	for sa, rows := range rbacMatrix {
		for _, a := range rows {
			t.Run(sa+": "+a.String(), func(t *testing.T) {
				if got := may(t, sa, a); got != a.allowed {
					t.Errorf("system:serviceaccount:%s:%s %s: allowed=%v, want %v", namespace, sa, a, got, a.allowed)
				}
			})
		}
	}

	// Each reads every CRD its start checks (crdschema): the chart names them one by one.
	all, err := crdschema.All()
	if err != nil {
		t.Fatal(err)
	}
	for sa, names := range map[string][]string{"meshvol-controller": all, "meshvol-node": crdschema.Agent} {
		for _, n := range names {
			if a := named(allow("get", "apiextensions.k8s.io", "customresourcedefinitions", "", ""), n); !may(t, sa, a) {
				t.Errorf("%s may not %s: its start reads it", sa, a)
			}
		}
	}

	// With the out-of-service taint alone the controller may patch Nodes.
	applyRBAC(t, render(t, "controller:\n  taintLostNodes: true\n  deleteLostPods: false\n"))
	if !may(t, "meshvol-controller", allow("patch", "", "nodes", "", "")) {
		t.Error("controller.taintLostNodes=true: the controller may not patch nodes")
	}

	// Without controller.deleteLostPods (nor taintLostNodes) the controller may neither
	// list nor delete Pods, nor delete VolumeAttachments, nor patch Nodes.
	applyRBAC(t, render(t, "controller:\n  deleteLostPods: false\n"))
	for _, a := range []access{
		deny("patch", "", "nodes", "", ""),
		deny("list", "", "pods", "", ""), deny("delete", "", "pods", "", other),
		deny("delete", "storage.k8s.io", "volumeattachments", "", ""),
	} {
		if may(t, "meshvol-controller", a) {
			t.Errorf("controller.deleteLostPods=false: the controller may %s", a)
		}
	}
	applyRBAC(t, render(t, ""))
}

func applyRBAC(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	n := 0
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
		default:
			continue
		}
		if o.GetNamespace() == "" && namespaced(o.GetKind()) {
			o.SetNamespace(namespace)
		}
		if err := env.Client.Patch(ctx(t), o, client.Apply, client.FieldOwner("helm"), client.ForceOwnership); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		n++
	}
	if n < 10 {
		t.Fatalf("only %d RBAC objects rendered", n)
	}
}

func may(t *testing.T, sa string, a access) bool {
	t.Helper()
	user := "system:serviceaccount:" + namespace + ":" + sa
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: a.namespace, Verb: a.verb, Group: a.group,
			Resource: a.resource, Subresource: a.subresource, Name: a.name,
		},
	}}
	if err := env.Client.Create(ctx(t), sar); err != nil {
		t.Fatal(err)
	}
	if sar.Status.EvaluationError != "" && !strings.Contains(sar.Status.EvaluationError, "not found") {
		t.Logf("evaluation: %s", sar.Status.EvaluationError)
	}
	return sar.Status.Allowed
}
