// Package packaging checks what a platform team installs: the Helm chart
// charts/meshvol and the plain manifests in deploy/, rendered by the real helm
// binary (bin/k8s/helm, built from its Go module by hack/build-k8s.sh) and
// checked by the real kube-apiserver of internal/testenv.
//
//   - helm lint is clean for every value set the tests use;
//   - every object the chart renders, for the default values and for the other
//     value sets below, is accepted by a server-side dry-run apply;
//   - a bad values file is refused by values.schema.json with the field named;
//   - the RBAC each component gets is exactly the table in docs/install.md,
//     asked of the apiserver with SubjectAccessReviews;
//   - deploy/meshvol.yaml is what the chart renders with default values.
package packaging
