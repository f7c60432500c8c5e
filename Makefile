# The usual targets. CI runs .ci/run.
GO ?= go

.PHONY: all build test short race vet lint fmt bench ci up tidy check-observability screenshots image compose-up compose-down compose-test compose-smoke

all: vet test

# The binaries, in ./bin (add it to PATH, or use `go install ./cmd/...`).
build:
	$(GO) build -o bin/ ./cmd/agentfleet ./cmd/fleetctl

test:
	$(GO) test ./...

# The quick loop: -short skips the multi-process and other slow tests.
short:
	$(GO) test -short ./...

race:
	$(GO) test -race -count=1 ./...

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The fleet against the raw JetStream floor (docs/benchmarks.md); pass
# flags with BENCH="--scenario all".
BENCH ?=
bench: build
	./bin/agentfleet bench $(BENCH)

# The alert rules and Prometheus configuration of deploy/observability,
# checked by promtool (check rules, check config, and the rule unit tests
# in alerts_test.yml). promtool is built from its Go module into
# build/tools on first use (PROMTOOL names another binary).
PROMETHEUS_VERSION ?= v0.316.0
PROMTOOL ?= $(CURDIR)/build/tools/promtool

$(CURDIR)/build/tools/promtool:
	GOBIN=$(CURDIR)/build/tools $(GO) install github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_VERSION)

check-observability: $(PROMTOOL)
	$(PROMTOOL) check rules deploy/observability/alerts.yml
	$(PROMTOOL) check config --syntax-only deploy/observability/prometheus.yml
	$(PROMTOOL) test rules deploy/observability/alerts_test.yml

ci:
	bash .ci/run

up:
	$(GO) run ./cmd/agentfleet up

# The console's screenshots in docs/ (docs/console.md), taken by its browser
# tests in headless Chromium.
screenshots:
	CONSOLE_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run TestConsoleInBrowser ./ingress/console/

# go mod tidy fails on a test-only dependency of modernc.org/sqlite that the
# module proxy refuses; -e tolerates it.
tidy:
	$(GO) mod tidy -e

# --- The compose cluster (compose.yaml; README "Run a cluster") ---
# The image is FROM scratch around static binaries built here, so no image
# registry is needed. IMAGE_ARCH is the engine's architecture (GOARCH
# spelling); CA_CERTS the CA bundle copied into the image.
IMAGE ?= agentfleet:dev
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
CA_CERTS ?= /etc/ssl/certs/ca-certificates.crt
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMPOSE ?= deploy/compose/compose

image:
	rm -rf build/image
	mkdir -p build/image/data build/image/tmp
	chmod 1777 build/image/tmp
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -tags timetzdata \
		-ldflags "-s -w -X main.version=$(VERSION)" -o build/image/agentfleet ./cmd/agentfleet
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -tags timetzdata \
		-ldflags "-s -w" -o build/image/fleetctl ./cmd/fleetctl
	cp $(CA_CERTS) build/image/ca-certificates.crt
	cp deploy/docker/passwd deploy/docker/group build/image/
	docker build -q -f Dockerfile -t $(IMAGE) build/image

# Builds the binaries and the image, starts the stack, waits until every
# service is healthy.
compose-up: image
	AGENTFLEET_IMAGE=$(IMAGE) $(COMPOSE) up -d
	deploy/compose/wait-healthy

# Stops the stack and removes its containers, network and volumes.
compose-down:
	$(COMPOSE) down -v --remove-orphans

# The cluster tests (test/compose): each run brings up its own stack under
# a unique project name (prefixed with $COMPOSE_PROJECT_NAME when set) and
# removes it afterwards (the image is built here
# once, so the tests do not build it again: COMPOSE_SKIP_IMAGE=1).
# COMPOSE_LOG_DIR=dir keeps every service's whole log under dir/<project>.
# COMPOSE_MESSAGES sets the chaos run's size (default 2000; docs/benchmarks.md uses 10000),
# COMPOSE_LANES and COMPOSE_RATE (messages a second, default 10) its shape.
compose-test: image
	COMPOSE_SKIP_IMAGE=1 AGENTFLEET_IMAGE=$(IMAGE) $(GO) test -tags compose -count=1 -timeout 60m -v ./test/compose/

# The cluster smoke test alone (what CI runs): stack up, a reply through
# each ingress, fleetctl lists the workers.
compose-smoke: image
	COMPOSE_SKIP_IMAGE=1 AGENTFLEET_IMAGE=$(IMAGE) $(GO) test -tags compose -count=1 -timeout 20m -v -run 'TestCluster/smoke$$' ./test/compose/
