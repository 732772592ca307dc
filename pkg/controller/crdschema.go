package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

// The installed ReplicatedVolume CRD must keep a derived reference's fields. helm
// upgrade never updates a chart's crds/, so a cluster upgraded with it alone keeps the
// earlier CRD, whose schema lacks status.datamesh.sharedSecret.derivation and
// keyFingerprint: the apiserver prunes fields its schema lacks, and a derived reference
// would be stored as one to a Secret of the volume's own — every agent would then take
// the cluster key itself for the volume's secret. So the controller derives only while
// the CRD has both fields, and otherwise gives new volumes Secrets of their own
// (docs/install.md, "Upgrading": apply the CRDs before helm upgrade).

// rvCRDName is the ReplicatedVolume CRD's name.
const rvCRDName = "replicatedvolumes.storage.meshvol.io"

// crdRecheck is how long a CRD found lacking the fields (or not read) is believed
// before it is read again: one request a minute at most while it lasts, none once
// the fields are there (a CRD is not expected to lose them again).
const crdRecheck = time.Minute

// crdSchema is what the controller last found of the installed RV CRD.
type crdSchema struct {
	mu      sync.Mutex
	keeps   bool // the CRD keeps derivation and keyFingerprint
	why     string
	checked time.Time
}

// crdKeepsDerivation reports whether the installed ReplicatedVolume CRD keeps a derived
// reference's fields, and if not why, reading the CRD from the apiserver at most once
// per crdRecheck while it does not (and never again once it does): no request per
// volume.
func (c *Controller) crdKeepsDerivation(ctx context.Context) (bool, string) {
	c.crd.mu.Lock()
	defer c.crd.mu.Unlock()
	now := c.opts.Now()
	if c.crd.keeps || !c.crd.checked.IsZero() && now.Sub(c.crd.checked) < crdRecheck {
		return c.crd.keeps, c.crd.why
	}
	c.crd.checked = now
	crd := &unstructured.Unstructured{}
	crd.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"})
	if err := c.api.Get(ctx, types.NamespacedName{Name: rvCRDName}, crd); err != nil {
		c.crd.why = fmt.Sprintf("reading CustomResourceDefinition %s: %s", rvCRDName, apierrors.ReasonForError(err))
		return false, c.crd.why
	}
	c.crd.why = missingDerivationFields(crd.Object)
	c.crd.keeps = c.crd.why == ""
	return c.crd.keeps, c.crd.why
}

// missingDerivationFields says which field of a derived reference the CRD's schema of
// the version the controller writes lacks ("" when it has them all).
func missingDerivationFields(crd map[string]any) string {
	versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
	for _, ver := range versions {
		m, ok := ver.(map[string]any)
		if !ok || m["name"] != v1.SchemeGroupVersion.Version {
			continue
		}
		props, _, _ := unstructured.NestedMap(m, "schema", "openAPIV3Schema", "properties", "status", "properties",
			"datamesh", "properties", "sharedSecret", "properties")
		for _, f := range []string{"derivation", "keyFingerprint"} {
			if _, ok := props[f]; !ok {
				return fmt.Sprintf("CustomResourceDefinition %s (%s) has no status.datamesh.sharedSecret.%s: the apiserver would drop "+
					"a derived reference's fields (apply charts/meshvol/crds/ before helm upgrade: docs/install.md, \"Upgrading\")",
					rvCRDName, v1.SchemeGroupVersion.Version, f)
			}
		}
		return ""
	}
	return fmt.Sprintf("CustomResourceDefinition %s has no version %s", rvCRDName, v1.SchemeGroupVersion.Version)
}
