# The usual targets. CI runs .ci/run.
GO ?= go

.PHONY: all build test race vet lint fmt bench ci up tidy

all: vet test

build:
	$(GO) build ./...

test:
	$(GO) test ./...

race:
	$(GO) test -race -count=1 ./...

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

lint: vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s ./test/bench/...

ci:
	bash .ci/run

up:
	$(GO) run ./cmd/agentfleet up

# go mod tidy fails on a test-only dependency of modernc.org/sqlite that the
# module proxy refuses; -e tolerates it.
tidy:
	$(GO) mod tidy -e
