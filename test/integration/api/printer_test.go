package api

import (
	"encoding/json"
	"fmt"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/internal/testenv"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// column is what kubectl learns about a printer column: its header, type, source and
// whether it shows without -o wide (priority 0) or only with it (priority 1).
type column struct {
	Name, Type, JSONPath string
	Priority             int32
}

// wantColumns are the printer columns of each kind as `kubectl get` should show them.
// They are spelled out here, not read from the Go markers, so that a column dropped or
// renamed by accident fails a test instead of silently changing what operators see.
var wantColumns = map[string][]column{
	"replicatedvolumes": {
		{"Phase", "string", ".status.phase", 0},
		{"Size", "string", ".spec.size", 0},
		{"Layout", "string", ".status.layout", 0},
		{"Members", "string", ".status.readyMembers", 0},
		{"Sync", "string", ".status.syncProgress", 0},
		{"Class", "string", ".spec.replicatedStorageClassName", 1},
		{"Revision", "integer", ".status.datameshRevision", 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	},
	"replicatedvolumereplicas": {
		{"Volume", "string", ".spec.replicatedVolumeName", 0},
		{"Node", "string", ".spec.nodeName", 0},
		{"Type", "string", ".spec.type", 0},
		{"Disk", "string", ".status.diskState", 0},
		{"Role", "string", ".status.role", 0},
		{"Revision", "integer", ".status.datameshRevision", 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	},
	"replicatedvolumeattachments": {
		{"Volume", "string", ".spec.replicatedVolumeName", 0},
		{"Node", "string", ".spec.nodeName", 0},
		{"Phase", "string", ".status.phase", 0},
		{"Device", "string", ".status.devicePath", 0},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	},
	"replicatedstorageclasses": {
		{"Pool", "string", ".spec.storagePool", 0},
		{"FTT", "integer", ".spec.failuresToTolerate", 0},
		{"GMDR", "integer", ".spec.guaranteedMinimumDataRedundancy", 0},
		{"Replication", "string", ".spec.replication", 0},
		{"Topology", "string", ".spec.topology", 0},
		{"Access", "string", ".spec.volumeAccess", 0},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	},
	"replicatedstoragepools": {
		{"Type", "string", ".spec.type", 0},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	},
	"replicatednodemaintenances": {
		{"Node", "string", ".spec.nodeName", 0},
		{"Phase", "string", ".status.phase", 0},
		{"Message", "string", ".status.message", 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	},
}

// TestPrinterColumnsInCRDs reads each installed CRD back from the apiserver and checks
// its additionalPrinterColumns and its short name.
func TestPrinterColumnsInCRDs(t *testing.T) {
	shortNames := map[string]string{
		"replicatedvolumes": "rv", "replicatedvolumereplicas": "rvr", "replicatedvolumeattachments": "rva",
		"replicatedstorageclasses": "rsc", "replicatedstoragepools": "rsp", "replicatednodemaintenances": "rnm",
	}
	for plural, want := range wantColumns {
		t.Run(plural, func(t *testing.T) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(ctx(t), client.ObjectKey{Name: plural + "." + v1.GroupName}, crd); err != nil {
				t.Fatal(err)
			}
			if crd.Spec.Scope != apiextensionsv1.ClusterScoped {
				t.Errorf("scope %s, want Cluster", crd.Spec.Scope)
			}
			if sn := crd.Spec.Names.ShortNames; len(sn) != 1 || sn[0] != shortNames[plural] {
				t.Errorf("short names %v, want [%s]", sn, shortNames[plural])
			}
			if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1alpha1" {
				t.Fatalf("versions %v, want only v1alpha1", crd.Spec.Versions)
			}
			ver := crd.Spec.Versions[0]
			if ver.Subresources == nil || ver.Subresources.Status == nil {
				t.Errorf("no status subresource")
			}
			var got []column
			for _, c := range ver.AdditionalPrinterColumns {
				got = append(got, column{c.Name, c.Type, c.JSONPath, c.Priority})
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("printer columns\n got %v\nwant %v", got, want)
			}
		})
	}
}

// table asks the apiserver for the list of plural as a meta.k8s.io/v1 Table (what
// kubectl get does), restricted to one object by name.
func table(t *testing.T, plural, name string) *metav1.Table {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.GroupVersion = &schema.GroupVersion{Group: v1.GroupName, Version: "v1alpha1"}
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := rc.Get().Resource(plural).
		Param("fieldSelector", "metadata.name="+name).
		SetHeader("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1").
		DoRaw(ctx(t))
	if err != nil {
		t.Fatalf("Table request for %s: %v (%s)", plural, err, raw)
	}
	tbl := &metav1.Table{}
	if err := json.Unmarshal(raw, tbl); err != nil {
		t.Fatal(err)
	}
	if tbl.Kind != "Table" {
		t.Fatalf("asked for a Table, got kind %q", tbl.Kind)
	}
	if len(tbl.Rows) != 1 {
		t.Fatalf("Table of %s named %s has %d rows, want 1", plural, name, len(tbl.Rows))
	}
	return tbl
}

// TestPrinterTable does what `kubectl get -o wide` does and checks the headers and
// cells for objects whose status says what the columns summarise.
func TestPrinterTable(t *testing.T) {
	cases := []struct {
		plural       string
		spec, status string
		// want maps column names to the cell's printed value (Age is only checked to
		// be present: it depends on the clock).
		want map[string]string
	}{
		{
			plural: "replicatedvolumes",
			spec:   rvOK,
			status: `
kind: ReplicatedVolume
metadata: {name: $NAME}
status: {phase: Ready, layout: 3D, readyMembers: 3/3, syncProgress: 100%, datameshRevision: 12}
`,
			want: map[string]string{
				"Phase": "Ready", "Size": "10Gi", "Layout": "3D", "Members": "3/3", "Sync": "100%",
				"Class": "rsc-3d", "Revision": "12",
			},
		},
		{
			plural: "replicatedvolumereplicas",
			spec:   rvrOK,
			status: `
kind: ReplicatedVolumeReplica
metadata: {name: $NAME}
status: {diskState: UpToDate, role: Primary, datameshRevision: 12}
`,
			want: map[string]string{
				"Volume": "pvc-1", "Node": "node-1", "Type": "Diskful", "Disk": "UpToDate", "Role": "Primary", "Revision": "12",
			},
		},
		{
			plural: "replicatedvolumeattachments",
			spec:   rvaOK,
			status: `
kind: ReplicatedVolumeAttachment
metadata: {name: $NAME}
status: {phase: Attached, devicePath: /dev/drbd1001}
`,
			want: map[string]string{"Volume": "pvc-1", "Node": "node-1", "Phase": "Attached", "Device": "/dev/drbd1001"},
		},
		{
			plural: "replicatedstorageclasses",
			spec: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, failuresToTolerate: 1, guaranteedMinimumDataRedundancy: 1, topology: TransZonal, zones: [a, b, c]}
`,
			// Replication is empty for an FTT/GMDR class; the FTT and GMDR cells are
			// numbers, as their integer type promises.
			want: map[string]string{
				"Pool": "pool-a", "FTT": "1", "GMDR": "1", "Replication": "<nil>", "Topology": "TransZonal", "Access": "PreferablyLocal",
			},
		},
		{
			// A legacy class shows its protection in the Replication column, and no
			// FTT or GMDR (they are resolved per volume, not stored on the class).
			plural: "replicatedstorageclasses",
			spec: `
kind: ReplicatedStorageClass
metadata: {name: $NAME}
spec: {storagePool: pool-a, replication: Availability}
`,
			want: map[string]string{
				"Pool": "pool-a", "FTT": "<nil>", "GMDR": "<nil>", "Replication": "Availability", "Topology": "Ignored", "Access": "PreferablyLocal",
			},
		},
		{
			plural: "replicatedstoragepools",
			spec:   rspLVMOK,
			want:   map[string]string{"Type": "LVM"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.plural, func(t *testing.T) {
			name := testenv.Name(t)
			mustApply(t, fromYAML(t, tc.spec, name), managerUser)
			if tc.status != "" {
				mustApplyStatus(t, fromYAML(t, tc.status, name), managerController)
			}
			tbl := table(t, tc.plural, name)

			wantHeaders := []string{"Name"}
			for _, c := range wantColumns[tc.plural] {
				wantHeaders = append(wantHeaders, c.Name)
			}
			var headers []string
			for _, d := range tbl.ColumnDefinitions {
				headers = append(headers, d.Name)
			}
			if fmt.Sprint(headers) != fmt.Sprint(wantHeaders) {
				t.Fatalf("Table headers %v, want %v", headers, wantHeaders)
			}
			row := tbl.Rows[0].Cells
			if len(row) != len(headers) {
				t.Fatalf("row has %d cells for %d columns: %v", len(row), len(headers), row)
			}
			cells := map[string]string{}
			for i, h := range headers {
				cells[h] = fmt.Sprint(row[i])
			}
			if cells["Name"] != name {
				t.Errorf("Name cell %q, want %q", cells["Name"], name)
			}
			if cells["Age"] == "" || cells["Age"] == "<nil>" {
				t.Errorf("Age cell empty")
			}
			for col, want := range tc.want {
				if cells[col] != want {
					t.Errorf("cell %s = %q, want %q (row %v)", col, cells[col], want, cells)
				}
			}
		})
	}
}
