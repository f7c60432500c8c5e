# The usual targets. CI runs .ci/run.
GO ?= go

.PHONY: all build test short race vet lint fmt bench ci up tidy

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

ci:
	bash .ci/run

up:
	$(GO) run ./cmd/agentfleet up

# go mod tidy fails on a test-only dependency of modernc.org/sqlite that the
# module proxy refuses; -e tolerates it.
tidy:
	$(GO) mod tidy -e
