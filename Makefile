# meshvol — build, test and check. `make help` lists the targets.
#
# Every target uses the Go toolchain installed on the machine (GOTOOLCHAIN=local):
# nothing here downloads a toolchain. Tools are pinned and run with `go run
# module@version`, so the module proxy is the only thing they need.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

export GOTOOLCHAIN := local

GO            ?= go
MODULE        := github.com/meshvol/meshvol
VERSION       ?= $(shell git describe --tags --dirty 2>/dev/null || echo dev)
COMMIT        ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS       := -X $(MODULE)/pkg/version.Version=$(VERSION) $(if $(COMMIT),-X $(MODULE)/pkg/version.Commit=$(COMMIT))

# Per test binary; the model checker and the integration packages are the slow ones.
TEST_TIMEOUT  ?= 20m
# Arguments for `make test`, e.g. `make test TEST_PKGS=./internal/testenv/...`.
TEST_PKGS     ?= ./...
# Fuzz: each target runs for FUZZTIME. Empty FUZZ_TARGETS means every
# `func FuzzX` in a _test.go file; otherwise a list of PKG:FuzzName, e.g.
# FUZZ_TARGETS="./pkg/drbd:FuzzParseEvent ./pkg/drbd:FuzzParseShowJSON".
FUZZTIME      ?= 30s
FUZZ_TARGETS  ?=
BENCH_COUNT   ?= 5
# `make soak`: the fault campaign (test/soak, docs/soak.md), SEEDS seeds of
# DURATION each from SEED on; each seed's controller and agent log goes to
# _output/soak/. `make test` runs one short seed of it.
SEEDS         ?= 10
DURATION      ?= 2m
SEED          ?= 1
# The model checker's test lives beside the engine, in its own package.
MODELCHECK_PKG ?= ./pkg/datamesh/modelcheck/

# staticcheck 2026.2.2: the module proxy serves its semver tag v0.8.2 (it refuses
# the calendar-version tag 2025.1.1 with 403).
STATICCHECK   := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
# v0.18.0 is the controller-tools release built against k8s.io/* v0.33, the
# API version go.mod pins.
CONTROLLER_GEN := $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.18.0

# Go files of this module: not the wrapper modules under bin/.
GO_FILES = $(shell find . -name '*.go' -not -path './bin/*' -not -path './.git/*' -not -path './_output/*')

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/meshvol from ./cmd/meshvol and the kubectl plugin bin/kubectl-meshvol
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/meshvol ./cmd/meshvol
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/kubectl-meshvol ./cmd/kubectl-meshvol

.PHONY: sandbox
sandbox: deps build k8s image sandbox-bin ## Run a real Kubernetes cluster on this machine, `helm install` meshvol's chart and image on it, a demonstration, up until Ctrl-C (root; SANDBOX_ARGS="-demo=false ...")
	bin/meshvol-sandbox $(SANDBOX_ARGS)

.PHONY: sandbox-bin
sandbox-bin: ## Build bin/meshvol-sandbox and the static programs it puts on the nodes (the pause program, the drbd-utils stand-ins)
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/meshvol-sandbox ./cmd/meshvol-sandbox
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/meshvol-pause ./internal/kubecluster/pause
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/drbdsim-utils ./internal/drbdsimd/drbdutils

.PHONY: k8s
k8s: ## Build the real control plane and CSI sidecars into bin/k8s (hack/build-k8s.sh; no-op when up to date)
	hack/build-k8s.sh

.PHONY: promtool
promtool: ## Build bin/promtool, Prometheus' rule checker, for test/monitoring (hack/build-promtool.sh; no-op when up to date; cold: see docs/benchmarks.md)
	hack/build-promtool.sh

.PHONY: deps
deps: ## Install the Debian packages the tests need, when missing (hack/install-deps.sh; root, or it prints the apt-get line)
	hack/install-deps.sh

.PHONY: test
test: deps k8s image promtool ## Run every test (unit, integration on the real apiserver, e2e on the chart-installed image); full log in _output/test.log
	TEST_TIMEOUT=$(TEST_TIMEOUT) hack/test.sh $(TEST_PKGS)

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@echo "gofmt -l"
	@out=$$(gofmt -l $(GO_FILES)); if [[ -n "$$out" ]]; then echo "gofmt: these files need formatting:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags vmtest ./test/vm/...
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags vmtest ./test/vm/...

.PHONY: generate
generate: ## Regenerate deepcopy code and the CRDs in config/crd from pkg/apis
	$(CONTROLLER_GEN) object paths=./pkg/apis/...
	@# Remove what the previous run wrote so a CRD whose type is gone does not linger.
	rm -f config/crd/storage.meshvol.io_*.yaml
	$(CONTROLLER_GEN) crd paths=./pkg/apis/... output:crd:artifacts:config=config/crd
	@# The chart installs the same CRDs (Helm's crds/ directory: created, never templated).
	rm -f charts/meshvol/crds/storage.meshvol.io_*.yaml
	cp config/crd/storage.meshvol.io_*.yaml charts/meshvol/crds/

.PHONY: manifests
manifests: k8s ## Render deploy/meshvol.yaml from charts/meshvol with default values (bin/k8s/helm)
	hack/render-manifests.sh

.PHONY: verify
verify: k8s ## Fail if `make generate` or `make manifests` changes any generated file; then lint
	hack/verify-generated.sh
	$(MAKE) --no-print-directory lint

.PHONY: sanity
sanity: build k8s image ## Run the real bin/k8s/csi-sanity, layouts 1D, 2D+1TB, 3D: against `meshvol controller --csi-endpoint` and a node service on an in-process cluster, then against the chart-installed driver's pods in a sandbox (root; logs in _output/sanity)
	$(GO) run ./hack/sanity $(SANITY_ARGS)
	$(GO) run ./hack/sanity -installed $(SANITY_ARGS)

.PHONY: e2e-crash-2d1tb
e2e-crash-2d1tb: deps k8s image ## The e2e node crash on the default 2D+1TB class, which needs the sandbox's three nodes to itself (root; about 2 min)
	$(GO) test ./test/e2e -run 'TestNodeCrash$$' -count=1 -timeout $(TEST_TIMEOUT) -v -args -crash-class=meshvol-2d-1tb

# Kubernetes' own e2e.test, from test/conformance (a module of its own, so this one
# does not inherit Kubernetes' dependency graph), at the version bin/k8s runs; with it
# ginkgo's CLI (parallel runs) and agnhost (a test image's program) from the same go.mod.
K8S_E2E_VERSION ?= v1.33.13
.PHONY: conformance-build
conformance-build: ## Build Kubernetes' e2e.test (External Storage suite), ginkgo and agnhost into bin/conformance and list the specs test/conformance/testdriver.yaml selects (dry run; about 9 min cold, seconds warm)
	cd test/conformance && GOTOOLCHAIN=local $(GO) test -c -o ../../bin/conformance/e2e.test \
		-ldflags "-X k8s.io/component-base/version.gitVersion=$(K8S_E2E_VERSION)" .
	cd test/conformance && GOTOOLCHAIN=local $(GO) build -o ../../bin/conformance/ginkgo github.com/onsi/ginkgo/v2/ginkgo
	cd test/conformance && CGO_ENABLED=0 GOTOOLCHAIN=local $(GO) build -trimpath -ldflags '-s -w' \
		-o ../../bin/conformance/agnhost k8s.io/kubernetes/test/images/agnhost
	bin/conformance/e2e.test --ginkgo.dry-run --ginkgo.no-color --ginkgo.focus='External.Storage' \
		--storage.testdriver=$(CURDIR)/test/conformance/testdriver.yaml 2>&1 | grep -E 'Driver loaded from path|^Ran [0-9]+ of'

.PHONY: conformance
conformance: deps build k8s image sandbox-bin conformance-build ## Kubernetes' External Storage suite against the chart-installed driver in a sandbox: parallel, [Serial], and volumes+provisioning on 3D; counts, failures and skip reasons in _output/conformance/results.md (root; hack/conformance.sh, docs/conformance.md)
	$(GO) run ./hack/conformance-images -rootfs bin/image/rootfs -agnhost bin/conformance/agnhost -out bin/conformance/images
	hack/conformance.sh

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 30s); FUZZ_TARGETS="pkg:FuzzX ..." to choose
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh $(FUZZ_TARGETS)

# The deep model check in five parts, one per group of starting layouts and node maintenance, so that
# `make -j5 modelcheck` runs them side by side (docs/modelcheck.md "Bounds and figures").
MODELCHECK_DEEP := $(GO) test $(MODELCHECK_PKG) -modelcheck.depth=deep -timeout 2h -v -run

.PHONY: modelcheck modelcheck-1d-2d modelcheck-2d1tb modelcheck-3d modelcheck-large modelcheck-maintenance
modelcheck: modelcheck-1d-2d modelcheck-2d1tb modelcheck-3d modelcheck-large modelcheck-maintenance ## Deep model check of the datamesh engine, returns 1 (five parts; make -j5 runs them in parallel)
modelcheck-1d-2d: ## Deep model check, part: 1D and 2D (with the attach pass)
	$(MODELCHECK_DEEP) 'TestModelCheck/layouts/^(1D|2D)$$/'
modelcheck-2d1tb: ## Deep model check, part: 2D+1TB (with the attach pass)
	$(MODELCHECK_DEEP) 'TestModelCheck/layouts/^2D\+1TB$$/'
modelcheck-3d: ## Deep model check, part: 3D (with the attach pass)
	$(MODELCHECK_DEEP) 'TestModelCheck/layouts/^3D$$/'
modelcheck-large: ## Deep model check, part: 4D+1TB and 5D
	$(MODELCHECK_DEEP) 'TestModelCheck/layouts/^(4D\+1TB|5D)$$/'
modelcheck-maintenance: ## Deep model check, part: node maintenance (ExtraFTT) under faults, every request spent on it
	$(MODELCHECK_DEEP) 'TestMaintenanceUnderFaults'

.PHONY: soak
soak: deps k8s ## Fault campaign on the in-process cluster: SEEDS seeds × DURATION from SEED (root; docs/soak.md; logs in _output/soak)
	mkdir -p _output/soak
	$(GO) test ./test/soak/ -run TestSoak -count=1 -v -timeout 0 -args -soak.seeds=$(SEEDS) -soak.seed=$(SEED) -soak.duration=$(DURATION) -soak.logdir=$(CURDIR)/_output/soak 2>&1 | tee _output/soak/soak.log

.PHONY: bench
bench: k8s ## Benchmarks of ./pkg/..., -count=5 (BENCH_COUNT) for benchstat
	$(GO) test -run '^$$' -bench . -benchmem -count=$(BENCH_COUNT) ./pkg/...

.PHONY: bench-failover
bench-failover: deps k8s image ## Failover on the installed sandbox: 10 crashes and 5 partitions of a writer pod's node, step by step, no acknowledged write lost; writes docs/failover-bench.md and .svg (root; about 30 min; BENCH_FAILOVER_ARGS="-crashes 2 ...")
	nice -n 10 $(GO) run ./hack/benchfailover $(BENCH_FAILOVER_ARGS)

# `make bench-scale`: N volumes created at once, per class (docs/scale.md).
SCALE_N       ?= 100,500,1000,2000
SCALE_CLASSES ?= 1D,3D
SCALE_LABEL   ?= current
SCALE_ARGS    ?=

.PHONY: bench-scale
bench-scale: k8s build ## Scale benchmark: SCALE_N volumes at once per class in SCALE_CLASSES, the controller as its own process; results and plots in docs/scale/ (root; docs/scale.md)
	$(GO) build -o _output/bin/bench-scale ./test/bench/scale
	nice -n 10 _output/bin/bench-scale -meshvol bin/meshvol -n $(SCALE_N) -classes $(SCALE_CLASSES) -label '$(SCALE_LABEL)' -out docs/scale -logs _output/bench-scale $(SCALE_ARGS)

.PHONY: image
image: ## Build the image as an OCI archive without a container engine: bin/image/meshvol.oci.tar (root; debootstrap, minutes cold)
	hack/image.sh

.PHONY: clean
clean: ## Remove bin/meshvol and test output (keeps bin/k8s, which takes minutes to rebuild)
	rm -rf bin/meshvol _output

.PHONY: distclean
distclean: clean ## Also remove bin/k8s and its wrapper build modules
	rm -rf bin

.PHONY: test-lvm-vm
test-lvm-vm: ## pkg/storage/lvm against real lvm2 in a qemu VM (test/vm/README.md; minutes, not in `make test`)
	hack/vm-test-lvm.sh

.PHONY: test-drbd-vm
test-drbd-vm: ## pkg/drbd (contract suite and real-DRBD checks) on DRBD 9.2.18 in three qemu VMs; needs DRBD_SRC (test/vm/README.md; not in `make test`)
	DRBD_SRC=$(DRBD_SRC) hack/vm-test-drbd.sh
