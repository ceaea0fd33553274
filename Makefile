# sluice: the two commands of a fresh machine are `make demo` and `make test`.
GO      ?= go
BIN     := bin/sluice
GOFLAGS ?=

.PHONY: all build demo test deps unit live fuzz bench reproduce clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/sluice

deps:
	./scripts/deps.sh

# The main job on the embedded default.
demo: build
	./scripts/demo.sh

# Everything needed, then all tests (unit, fuzz corpora, live lab tests).
test: deps build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 18m ./...

bench:
	./bench/run.sh

clean:
	rm -rf bin out
