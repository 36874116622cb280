# outbox-operator Makefile. The manifests under config/ follow kubebuilder's kustomize layout
# (PROJECT declares that plugin alone); the Go code keeps the design's layout (api/, controllers/,
# cmd/), written by hand: controller-gen makes the CRDs and RBAC from it (make manifests).

# Image URLs used by docker-build, deploy and the e2e test.
IMG ?= localhost/outbox-operator:dev
RELAY_IMG ?= $(IMG)

# Everything built or downloaded for tests lives outside the clone.
OUTBOX_CACHE ?= $(HOME)/.cache/outbox-operator
export OUTBOX_CACHE

# The Kubernetes version of the control plane for envtest and the e2e cluster, derived from go.mod.
ENVTEST_K8S_VERSION ?= $(shell go list -m -f '{{.Version}}' k8s.io/api | sed 's/^v0\./1./')
ENVTEST_ASSETS_DIR ?= $(OUTBOX_CACHE)/envtest-$(ENVTEST_K8S_VERSION)
KUBEBUILDER_ASSETS ?= $(ENVTEST_ASSETS_DIR)
export KUBEBUILDER_ASSETS

GO ?= go
# The version stamped into kubectl-outbox and its release archives.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The platforms make plugin-release builds kubectl-outbox for.
PLUGIN_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
CONTROLLER_GEN ?= $(GO) tool controller-gen
GOLANGCI_LINT_VERSION ?= v2.15.0
# kube-api-linter: a golangci-lint build with the linter in it (the module has no releases).
KAL_VERSION ?= v0.0.0-20260716143926-092fe0c72997
KUSTOMIZE_VERSION ?= v5.8.0
LOCALBIN ?= $(shell pwd)/bin
KUSTOMIZE ?= $(LOCALBIN)/kustomize
GOTEST_FLAGS ?= -count=1 -timeout 30m
# Packages tested with the race detector (make test): those where it is affordable in CI. The relay
# package's tests (5 minutes of Kafka and PostgreSQL under load) and the end-to-end test run
# without it; make test-race runs every package with it.
RACE_PKGS ?= ./api/... ./cmd/... ./controllers/... ./inbox/... ./internal/... ./outbox/... ./outboxdb/... ./plugin/...
# The PostgreSQL version matrix (hack/pg-versions.sh pins the servers; make setup fetches them):
# make test-pg runs the guarantee tests below, under both tracking modes, on every supported major
# but the default (15, on which make test runs everything); make test runs them on PG_TEST_VERSIONS.
PG_MATRIX_VERSIONS ?= 13 14 16 17 18
PG_TEST_VERSIONS ?= 13 14 16 17 18
PG_MATRIX_FLAGS ?=
PG_MATRIX_PKGS ?= ./outboxdb/ ./relay/
# Order with 4 shards, crash (at-least-once and exactly-once), fencing, resharding under load (and under exactly-once), snapshot bounds, day-boundary
# retention, migrations (from an empty database and from the previous release), wake-ups,
# failover, the version check ($$ is make's $). PG_MATRIX_FLAGS adds go test flags: make test
# passes -short, with which TestCrash kills 8 times rather than 22 and TestFailoverAsync runs only
# its guarantee (--wait-for-standbys), to keep CI within its budget.
PG_MATRIX_RUN ?= ^(TestOrderFourShards|TestCrash|TestExactlyOnceCrash|TestExactlyOnceReshard|TestPostgresRestart|TestFencing|TestReshardFencing|TestZombie|TestReshardUnderLoad|TestSnapshotBounds.*|TestLongTransaction|TestLargeTransactionOpenAtSnapshot|TestRetentionAcrossMidnight|TestDropOnlyFullySentPartitionsOlderThanRetention|TestApply.*|TestConcurrentApply|TestUpgradeFromPreviousRelease|TestWakeOnDemand|TestWakeClaimWatchesWritersInProgress|TestWakeUpAfterPromotion|TestFailover.*|TestCheckServerVersion|TestChecksDropAndReturn)$$

# Setting SHELL to bash allows bash commands to be executed by recipes.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate the CRD, RBAC and copy them into the Helm chart.
	$(CONTROLLER_GEN) rbac:roleName=manager-role crd paths="./api/..." paths="./controllers/..." output:crd:artifacts:config=config/crd/bases
	@if [ -d charts/outbox-operator ]; then hack/sync-chart.sh; fi

.PHONY: generate
generate: ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt.
	$(GO) fmt ./...

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: lint
lint: $(LOCALBIN)/golangci-lint ## Check that go.mod is tidy and run golangci-lint (.golangci.yml).
	$(GO) mod tidy -diff
	$(LOCALBIN)/golangci-lint run ./...

.PHONY: lint-api
lint-api: $(LOCALBIN)/golangci-lint-kube-api-linter ## Check the API types' conventions with kube-api-linter (.golangci-kal.yml).
	$(LOCALBIN)/golangci-lint-kube-api-linter run -c .golangci-kal.yml ./api/...

.PHONY: verify-gen
verify-gen: generate manifests ## Regenerate code and manifests; fail if anything changed.
	@if [ -n "$$(git status --porcelain -- api config charts)" ]; then \
		git status --porcelain -- api config charts; git --no-pager diff -- api config charts | head -100; \
		echo "generated files are out of date: run make generate manifests and commit"; exit 1; fi

##@ Test

.PHONY: setup
setup: ## Install what this machine lacks and build the test components (PostgreSQL, Kafka, envtest).
	hack/setup.sh

.PHONY: test
test: ## Run unit and integration tests (real PostgreSQL, Apache Kafka, envtest) and, alongside on the same broker, the guarantee tests on PG_TEST_VERSIONS.
	hack/test.sh --exec $(MAKE) --no-print-directory -j2 test-packages test-pg \
		PG_MATRIX_VERSIONS="$(PG_TEST_VERSIONS)" PG_MATRIX_FLAGS=-short

.PHONY: test-packages
test-packages: ## Run every package's tests on the default PostgreSQL: RACE_PKGS with the race detector, the others without.
	hack/test.sh $(GOTEST_FLAGS) -race $$($(GO) list $(RACE_PKGS))
	hack/test.sh $(GOTEST_FLAGS) $$($(GO) list ./... | grep -v -e /test/e2e $(foreach p,$(shell $(GO) list $(RACE_PKGS)),-e '^$(p)$$'))

.PHONY: test-pg
test-pg: ## Run the guarantee tests (PG_MATRIX_RUN) on each PostgreSQL major of PG_MATRIX_VERSIONS.
	@failed=; for v in $(PG_MATRIX_VERSIONS); do \
		echo "test-pg: PostgreSQL $$v ($$(hack/pg-versions.sh bindir $$v))"; \
		start=$$(date +%s); \
		if OUTBOX_PG_VERSION=$$v hack/test.sh $(GOTEST_FLAGS) $(PG_MATRIX_FLAGS) -run '$(PG_MATRIX_RUN)' $(PG_MATRIX_PKGS) 2>&1 | sed -u "s/^/[PostgreSQL $$v] /"; then \
			echo "test-pg: PostgreSQL $$v passed in $$(($$(date +%s) - start))s"; \
		else failed="$$failed $$v"; echo "test-pg: PostgreSQL $$v FAILED after $$(($$(date +%s) - start))s"; fi; \
	done; \
	if [ -n "$$failed" ]; then echo "test-pg: failed on PostgreSQL$$failed"; exit 1; fi

.PHONY: test-race
test-race: ## Run every unit and integration test with the race detector.
	hack/test.sh $(GOTEST_FLAGS) -race $$($(GO) list ./... | grep -v -e /test/e2e)

.PHONY: test-e2e
test-e2e: ## Run the end-to-end test on a real single-node Kubernetes cluster.
	@if [ -d test/e2e ]; then hack/e2e.sh; else echo "test-e2e: no end-to-end test yet"; fi

.PHONY: test-all
test-all: setup verify-gen vet lint lint-api test test-e2e ## What CI runs: set up, check generated files, vet, lint, all tests.

.PHONY: bench
bench: ## Run the benchmarks against the real broker and write docs/benchmarks.md.
	@if [ -d test/bench ]; then hack/bench.sh; else echo "bench: no benchmarks yet"; fi

##@ Build

.PHONY: build
build: generate fmt vet ## Build the manager, relay and kubectl-outbox binaries into bin/.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(LOCALBIN)/manager ./cmd/manager
	CGO_ENABLED=0 $(GO) build -trimpath -o $(LOCALBIN)/relay ./cmd/relay
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(LOCALBIN)/kubectl-outbox ./cmd/kubectl-outbox

.PHONY: plugin-release
plugin-release: ## Write the kubectl plugin's release archives and their SHA-256 sums into dist/ (PLUGIN_PLATFORMS).
	VERSION=$(VERSION) PLUGIN_PLATFORMS="$(PLUGIN_PLATFORMS)" GO=$(GO) hack/plugin-release.sh

.PHONY: run
run: manifests generate fmt vet ## Run the operator from your host against the current kubeconfig.
	$(GO) run ./cmd/manager --leader-elect=false

.PHONY: demo
demo: ## Set up the machine and run the local demo on embedded defaults.
	hack/demo.sh up

.PHONY: demo-down
demo-down: ## Stop everything the demo started.
	hack/demo.sh down

.PHONY: docker-build
docker-build: ## Build the image with a Docker engine.
	docker build -t $(IMG) .

.PHONY: docker-push
docker-push: ## Push the image.
	docker push $(IMG)

.PHONY: build-installer
build-installer: manifests generate $(KUSTOMIZE) ## Write dist/install.yaml: CRDs and the operator.
	mkdir -p dist
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default > dist/install.yaml

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the cluster of the current kubeconfig.
	kubectl apply --server-side -f config/crd/bases

.PHONY: uninstall
uninstall: manifests ## Uninstall the CRDs.
	kubectl delete --ignore-not-found -f config/crd/bases

.PHONY: deploy
deploy: manifests $(KUSTOMIZE) ## Deploy the operator with kustomize into the cluster of the current kubeconfig.
	cd config/manager && $(KUSTOMIZE) edit set image controller=$(IMG)
	$(KUSTOMIZE) build config/default | kubectl apply --server-side -f -

.PHONY: undeploy
undeploy: $(KUSTOMIZE) ## Remove the operator deployed with kustomize.
	$(KUSTOMIZE) build config/default | kubectl delete --ignore-not-found -f -

##@ Tools

$(LOCALBIN)/golangci-lint:
	GOBIN=$(LOCALBIN) $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

$(LOCALBIN)/golangci-lint-kube-api-linter:
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/kube-api-linter/cmd/golangci-lint-kube-api-linter@$(KAL_VERSION)

$(LOCALBIN)/kustomize:
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
