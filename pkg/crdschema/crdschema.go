// Package crdschema checks that the CRDs installed in a cluster keep every field of
// the CRDs a meshvol binary was built with (config/crd, embedded).
//
// helm upgrade never updates a chart's crds/. The apiserver drops every field of a
// custom object that the installed CRD's structural schema does not know from a create
// or an update, without an error (pruning), and refuses a server-side apply that
// carries one. A controller or agent of a newer version on the CRDs of an older one
// would lose fields it writes — a member's DRBD port, a derived shared secret's
// derivation, a replica's backing volume — and act on what it believes it wrote, or
// fail every status write. So both check at start, before they write anything, and
// refuse to run on a CRD that lacks any field of theirs (docs/install.md, "Upgrading";
// docs/controller.md, "Start").
//
// Only the question "would a field be pruned" is asked: descriptions, validation rules,
// defaults, enums and list types may differ.
package crdschema

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/config/crd"
	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
	"github.com/meshvol/meshvol/pkg/version"
)

// Fix is the command that installs this version's CRDs (docs/install.md, "Upgrading").
const Fix = "kubectl apply --server-side --force-conflicts -f charts/meshvol/crds/"

// shown is how many missing fields of one CRD the error lists before "and N more".
const shown = 3

// Name is the CRD name of one of meshvol's kinds by its plural resource name.
func Name(resource string) string { return resource + "." + v1.SchemeGroupVersion.Group }

// Agent names the CRDs of the kinds the node agent writes: its replicas' status and
// finalizers, and its entries of snapshot status.
var Agent = []string{Name("replicatedvolumereplicas"), Name("replicatedvolumesnapshots")}

// All names every CRD this tree generated (the controller writes to each kind's status).
func All() ([]string, error) {
	defs, err := crd.Definitions()
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(defs)), nil
}

// Missing returns the paths of the fields built's schema has and installed's would
// prune, in a stable order: "status.datamesh.members[].port" (a field of a list's
// items), "spec.nodeSelector.*" (a map's values). Below a schema that keeps unknown
// fields (x-kubernetes-preserve-unknown-fields, or additionalProperties: true) nothing
// is pruned; where built keeps unknown fields and installed does not, its path ends in
// ".*".
func Missing(built, installed *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	missing("", built, installed, &out)
	return out
}

func missing(path string, b, i *apiextensionsv1.JSONSchemaProps, out *[]string) {
	if b == nil || keepsUnknown(i) {
		return
	}
	if keepsUnknown(b) {
		*out = append(*out, join(path, "*"))
		return
	}
	for _, n := range slices.Sorted(maps.Keys(b.Properties)) {
		bp := b.Properties[n]
		if ip, ok := properties(i)[n]; ok {
			missing(join(path, n), &bp, &ip, out)
		} else if v := mapValues(i); v != nil {
			// A map that keeps any key: the field is kept as one of its values.
			missing(join(path, n), &bp, v, out)
		} else {
			*out = append(*out, join(path, n))
		}
	}
	if b.Items != nil && b.Items.Schema != nil {
		var ii *apiextensionsv1.JSONSchemaProps
		if i != nil && i.Items != nil {
			ii = i.Items.Schema
		}
		missing(path+"[]", b.Items.Schema, ii, out)
	}
	if v := mapValues(b); v != nil {
		if iv := mapValues(i); iv != nil {
			missing(join(path, "*"), v, iv, out)
		} else {
			*out = append(*out, join(path, "*"))
		}
	}
}

// keepsUnknown: the apiserver prunes nothing of an object below s.
func keepsUnknown(s *apiextensionsv1.JSONSchemaProps) bool {
	if s == nil {
		return false
	}
	if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields {
		return true
	}
	return s.AdditionalProperties != nil && s.AdditionalProperties.Allows && s.AdditionalProperties.Schema == nil
}

func properties(s *apiextensionsv1.JSONSchemaProps) map[string]apiextensionsv1.JSONSchemaProps {
	if s == nil {
		return nil
	}
	return s.Properties
}

// mapValues is the schema of a map's values (additionalProperties), or nil.
func mapValues(s *apiextensionsv1.JSONSchemaProps) *apiextensionsv1.JSONSchemaProps {
	if s == nil || s.AdditionalProperties == nil {
		return nil
	}
	return s.AdditionalProperties.Schema
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// Stale is one installed CRD that would prune fields of this version's.
type Stale struct {
	// Name is the CRD's name; Version the API version compared (this tree's storage
	// version, the one meshvol reads and writes).
	Name, Version string
	// Problem says why, when the CRD could not be compared field by field: it is not
	// installed, or does not serve Version.
	Problem string
	// Missing are the paths of the fields the installed schema lacks (Missing).
	Missing []string
}

// StaleError says which installed CRDs lack which fields, and how to install this
// version's.
type StaleError struct{ CRDs []Stale }

func (e *StaleError) Error() string {
	var parts []string
	for _, s := range e.CRDs {
		what := s.Problem
		if what == "" {
			fields := s.Missing
			more := ""
			if len(fields) > shown {
				fields, more = fields[:shown], fmt.Sprintf(" and %d more", len(s.Missing)-shown)
			}
			what = "lacks " + strings.Join(fields, ", ") + more
		}
		parts = append(parts, fmt.Sprintf("CustomResourceDefinition %s (%s) %s", s.Name, s.Version, what))
	}
	return fmt.Sprintf("the installed CRDs lack fields meshvol %s writes (the apiserver would drop them from its writes, or refuse the writes): %s; "+
		"apply this version's CRDs, which helm upgrade leaves alone, and start again: %s (docs/install.md, \"Upgrading\")",
		version.Get().Version, strings.Join(parts, "; "), Fix)
}

// Check reads each named CRD from the apiserver (a get by name) and compares it with
// this tree's of the same name: a *StaleError when any lacks a field, the read's error
// (wrapped) when one could not be read for another reason than its absence, nil when
// every one keeps every field.
func Check(ctx context.Context, r client.Reader, names []string) error {
	defs, err := crd.Definitions()
	if err != nil {
		return err
	}
	var stale []Stale
	for _, name := range names {
		built, ok := defs[name]
		if !ok {
			return fmt.Errorf("CustomResourceDefinition %s: not one of this tree's (config/crd)", name)
		}
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(apiextensionsv1.SchemeGroupVersion.String())
		u.SetKind("CustomResourceDefinition")
		if err := r.Get(ctx, types.NamespacedName{Name: name}, u); err != nil {
			if apierrors.IsNotFound(err) {
				stale = append(stale, Stale{Name: name, Version: storageVersion(built).Name, Problem: "is not installed"})
				continue
			}
			return fmt.Errorf("reading CustomResourceDefinition %s: %w", name, err)
		}
		installed := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, installed); err != nil {
			return fmt.Errorf("reading CustomResourceDefinition %s: %w", name, err)
		}
		if s := Compare(built, installed); s != nil {
			stale = append(stale, *s)
		}
	}
	if len(stale) > 0 {
		return &StaleError{CRDs: stale}
	}
	return nil
}

// Compare compares an installed CRD with the one built of the same name, for the
// built CRD's storage version (the one meshvol reads and writes): nil when the
// installed CRD serves it and keeps every field of it.
func Compare(built, installed *apiextensionsv1.CustomResourceDefinition) *Stale {
	bv := storageVersion(built)
	s := &Stale{Name: built.Name, Version: bv.Name}
	var iv *apiextensionsv1.CustomResourceDefinitionVersion
	for k := range installed.Spec.Versions {
		if installed.Spec.Versions[k].Name == bv.Name {
			iv = &installed.Spec.Versions[k]
		}
	}
	switch {
	case iv == nil || !iv.Served:
		s.Problem = "does not serve " + bv.Name
	case iv.Schema == nil || iv.Schema.OpenAPIV3Schema == nil:
		// No schema: nothing is pruned (an apiextensions.k8s.io/v1 CRD always has one).
		return nil
	default:
		var b *apiextensionsv1.JSONSchemaProps
		if bv.Schema != nil {
			b = bv.Schema.OpenAPIV3Schema
		}
		if s.Missing = Missing(b, iv.Schema.OpenAPIV3Schema); len(s.Missing) == 0 {
			return nil
		}
	}
	return s
}

// storageVersion is the CRD's version stored in etcd (controller-gen marks the one
// version it generates), or its first.
func storageVersion(c *apiextensionsv1.CustomResourceDefinition) apiextensionsv1.CustomResourceDefinitionVersion {
	for _, v := range c.Spec.Versions {
		if v.Storage {
			return v
		}
	}
	if len(c.Spec.Versions) > 0 {
		return c.Spec.Versions[0]
	}
	return apiextensionsv1.CustomResourceDefinitionVersion{}
}

// IsStale reports whether err is (or wraps) a *StaleError: the CRDs must be applied, a
// retry will not help.
func IsStale(err error) bool {
	var s *StaleError
	return errors.As(err, &s)
}
