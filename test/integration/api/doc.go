// Package api holds the integration tests that prove meshvol's storage.meshvol.io/v1alpha1
// API on a real kube-apiserver and etcd (internal/testenv, built by hack/build-k8s.sh).
//
// A unit test of the Go types proves little about the API: the rules users meet live in
// the generated CRDs (OpenAPI bounds, enums, CEL rules, defaults, list semantics for
// server-side apply, printer columns), and only the apiserver evaluates them. So every
// test here talks to a running apiserver, and most write the objects as YAML, the way a
// user or a field manager's apply configuration would:
//
//   - roundtrip_test.go: every kind, every field, spec and status, survives the trip.
//   - validation_test.go: each rule refuses a bad object with its own message, and the
//     legal updates next to each immutability rule are still allowed.
//   - defaults_test.go: the apiserver fills in the documented defaults.
//   - ownership_test.go: status is a subresource, and field managers sharing a status
//     keep their own fields under server-side apply.
//   - printer_test.go: the printer columns kubectl shows are served.
//   - examples_test.go: deploy/examples are accepted and deploy/examples/bad refused.
//
// The package has no non-test code; this file only carries the documentation.
package api
