package crdschema

import (
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/meshvol/meshvol/config/crd"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// schema parses a schema written in YAML, as a CRD carries it.
func schema(t *testing.T, y string) *apiextensionsv1.JSONSchemaProps {
	t.Helper()
	s := &apiextensionsv1.JSONSchemaProps{}
	if err := yaml.UnmarshalStrict([]byte(y), s); err != nil {
		t.Fatalf("%v:\n%s", err, y)
	}
	return s
}

// The comparison asks only whether a field of the built schema would be pruned by the
// installed one: through nested objects, list items, map values, and not below a
// schema that keeps unknown fields.
func TestMissing(t *testing.T) {
	built := `
type: object
properties:
  spec:
    type: object
    properties:
      size: {type: string}
      labels:
        type: object
        additionalProperties: {type: string}
      volumeGroups:
        type: object
        additionalProperties:
          type: object
          properties:
            name: {type: string}
            thinPool: {type: string}
  status:
    type: object
    properties:
      members:
        type: array
        items:
          type: object
          properties:
            name: {type: string}
            port: {type: integer}
            addresses:
              type: array
              items: {type: string}
      sharedSecret:
        type: object
        properties:
          secretName: {type: string}
          derivation: {type: string}
          keyFingerprint: {type: string}
      extra:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`
	for _, tc := range []struct {
		name, installed string
		want            []string
	}{
		{"the same schema", built, nil},
		{"descriptions, validation and list types differ", `
type: object
description: an earlier one
properties:
  spec:
    type: object
    required: [size]
    properties:
      size: {type: string, pattern: "^[0-9]+$", description: how big}
      labels: {type: object, maxProperties: 3, additionalProperties: {type: string, maxLength: 63}}
      volumeGroups:
        type: object
        additionalProperties:
          type: object
          properties:
            name: {type: string, minLength: 1}
            thinPool: {type: string}
  status:
    type: object
    x-kubernetes-map-type: atomic
    properties:
      members:
        type: array
        maxItems: 9
        x-kubernetes-list-type: map
        x-kubernetes-list-map-keys: [name]
        items:
          type: object
          required: [name]
          properties:
            name: {type: string}
            port: {type: integer, minimum: 1}
            addresses: {type: array, items: {type: string, format: ip}}
            gone: {type: string}
      sharedSecret:
        type: object
        x-kubernetes-validations: [{rule: "true"}]
        properties:
          secretName: {type: string}
          derivation: {type: string, enum: [HMAC-SHA256]}
          keyFingerprint: {type: string}
      extra: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, nil},
		{"a nested field, a list item's field and a map value's field gone", `
type: object
properties:
  spec:
    type: object
    properties:
      size: {type: string}
      labels: {type: object, additionalProperties: {type: string}}
      volumeGroups:
        type: object
        additionalProperties:
          type: object
          properties:
            name: {type: string}
  status:
    type: object
    properties:
      members:
        type: array
        items:
          type: object
          properties:
            name: {type: string}
            addresses: {type: array, items: {type: string}}
      sharedSecret:
        type: object
        properties:
          secretName: {type: string}
      extra: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, []string{"spec.volumeGroups.*.thinPool", "status.members[].port", "status.sharedSecret.derivation", "status.sharedSecret.keyFingerprint"}},
		{"a whole object, a map and unknown fields gone", `
type: object
properties:
  spec:
    type: object
    properties:
      size: {type: string}
      labels: {type: object}
      volumeGroups: {type: object, additionalProperties: {type: object, properties: {name: {type: string}, thinPool: {type: string}}}}
  status:
    type: object
    properties:
      members: {type: array, items: {type: object, properties: {name: {type: string}, port: {type: integer}, addresses: {type: array, items: {type: string}}}}}
      extra: {type: object}
`, []string{"spec.labels.*", "status.extra.*", "status.sharedSecret"}},
		{"a list whose items lost their schema's fields", `
type: object
properties:
  spec: {type: object, properties: {size: {type: string}, labels: {type: object, additionalProperties: {type: string}}, volumeGroups: {type: object, additionalProperties: {type: object, properties: {name: {type: string}, thinPool: {type: string}}}}}}
  status:
    type: object
    properties:
      members: {type: array, items: {type: object}}
      sharedSecret: {type: object, properties: {secretName: {type: string}, derivation: {type: string}, keyFingerprint: {type: string}}}
      extra: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, []string{"status.members[].addresses", "status.members[].name", "status.members[].port"}},
		{"nothing is pruned below x-kubernetes-preserve-unknown-fields", `
type: object
properties:
  spec: {type: object, properties: {size: {type: string}}, x-kubernetes-preserve-unknown-fields: true}
  status: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, nil},
		{"nor below additionalProperties: true", `
type: object
properties:
  spec: {type: object, additionalProperties: true}
  status: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, nil},
		{"an object turned into a map keeps its fields as the map's values, not their maps' keys", `
type: object
properties:
  spec:
    type: object
    additionalProperties:
      type: object
      properties:
        name: {type: string}
  status: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, []string{"spec.labels.*", "spec.volumeGroups.*"}},
	} {
		got := Missing(schema(t, built), schema(t, tc.installed))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: missing %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Every kind of the API group has a CRD in config/crd, embedded: a kind added to
// pkg/apis without `make generate` would go unchecked.
func TestDefinitionsCoverEveryKind(t *testing.T) {
	defs, err := crd.Definitions()
	if err != nil {
		t.Fatal(err)
	}
	s := runtime.NewScheme()
	if err := v1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, def := range defs {
		kinds[def.Spec.Names.Kind] = true
		if def.Spec.Group != v1.SchemeGroupVersion.Group || def.Name != Name(def.Spec.Names.Plural) {
			t.Errorf("CRD %s: group %s, plural %s", def.Name, def.Spec.Group, def.Spec.Names.Plural)
		}
		if v := storageVersion(def); v.Name != v1.SchemeGroupVersion.Version || !v.Served {
			t.Errorf("CRD %s: storage version %s (served %v), want %s served: the version meshvol reads and writes", def.Name, v.Name, v.Served, v1.SchemeGroupVersion.Version)
		}
	}
	for kind := range s.KnownTypes(v1.SchemeGroupVersion) {
		if strings.HasSuffix(kind, "List") || kinds[kind] {
			continue
		}
		if _, list := s.KnownTypes(v1.SchemeGroupVersion)[kind+"List"]; list {
			t.Errorf("kind %s has no CRD in config/crd: run `make generate`", kind)
		}
	}
	for _, n := range Agent {
		if defs[n] == nil {
			t.Errorf("the agent's CRD %s is not one of config/crd's", n)
		}
	}
}

// A CRD compared with itself keeps everything; with a property removed, as a CRD of
// the version before would lack one, the error names the CRD, the field (a few, then
// how many more) and the command that fixes it.
func TestCompareAndTheError(t *testing.T) {
	defs, err := crd.Definitions()
	if err != nil {
		t.Fatal(err)
	}
	for name, def := range defs {
		if s := Compare(def, def.DeepCopy()); s != nil {
			t.Errorf("%s against itself: %+v", name, s)
		}
	}
	rvName := Name("replicatedvolumes")
	built := defs[rvName]
	earlier := built.DeepCopy()
	datamesh := earlier.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"]
	members := datamesh.Properties["members"]
	delete(members.Items.Schema.Properties, "port")
	datamesh.Properties["members"] = members
	earlier.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"] = datamesh
	s := Compare(built, earlier)
	if s == nil || !slices.Equal(s.Missing, []string{"status.datamesh.members[].port"}) {
		t.Fatalf("without members[].port: %+v", s)
	}
	msg := (&StaleError{CRDs: []Stale{*s}}).Error()
	for _, want := range []string{"CustomResourceDefinition " + rvName + " (v1alpha1) lacks status.datamesh.members[].port;", Fix, "docs/install.md"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}

	delete(datamesh.Properties, "sharedSecret")
	delete(datamesh.Properties, "multiattach")
	earlier.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"] = datamesh
	s = Compare(built, earlier)
	if s == nil || len(s.Missing) != 3 {
		t.Fatalf("without members[].port, multiattach, sharedSecret: %+v", s)
	}
	rvr := defs[Name("replicatedvolumereplicas")].DeepCopy()
	delete(rvr.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties, "status")
	sr := Compare(defs[rvr.Name], rvr)
	notServed := built.DeepCopy()
	notServed.Spec.Versions[0].Served = false
	msg = (&StaleError{CRDs: []Stale{*s, *sr, *Compare(built, notServed)}}).Error()
	for _, want := range []string{
		"CustomResourceDefinition " + rvName + " (v1alpha1) lacks status.datamesh.members[].port, status.datamesh.multiattach, status.datamesh.sharedSecret;",
		"CustomResourceDefinition " + rvr.Name + " (v1alpha1) lacks status;",
		"CustomResourceDefinition " + rvName + " (v1alpha1) does not serve v1alpha1;",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	delete(datamesh.Properties, "port")
	earlier.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties["datamesh"] = datamesh
	if msg := (&StaleError{CRDs: []Stale{*Compare(built, earlier)}}).Error(); !strings.Contains(msg, "status.datamesh.multiattach, status.datamesh.port and 1 more;") {
		t.Errorf("four fields missing: %q, want three named and \"and 1 more\"", msg)
	}
}
