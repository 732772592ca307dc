// Package crd holds meshvol's CustomResourceDefinitions as `make generate` writes them
// (controller-gen from pkg/apis; the chart's crds/ is a copy of this directory), embedded
// in the binaries that import it: the controller and the agent compare them with the
// CRDs installed in the cluster before they write anything (pkg/crdschema;
// docs/install.md, "Upgrading").
package crd

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// files are the generated CRDs: every file `make generate` writes here matches the
// pattern, so a new kind's CRD is embedded without a change to this package.
//
//go:embed storage.meshvol.io_*.yaml
var files embed.FS

// Definitions returns the CRDs this tree generated, by name. Each call parses them
// afresh: the caller may change what it gets.
func Definitions() (map[string]*apiextensionsv1.CustomResourceDefinition, error) {
	names, err := fs.Glob(files, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	out := make(map[string]*apiextensionsv1.CustomResourceDefinition, len(names))
	for _, f := range names {
		raw, err := files.ReadFile(f)
		if err != nil {
			return nil, err
		}
		c := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(raw, c); err != nil {
			return nil, fmt.Errorf("config/crd/%s: %w", f, err)
		}
		if c.Name == "" {
			return nil, fmt.Errorf("config/crd/%s: no metadata.name", f)
		}
		out[c.Name] = c
	}
	return out, nil
}
