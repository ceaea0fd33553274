# sluice: the two commands of a fresh machine are `make demo` and `make test`.
GO      ?= go
BIN     := bin/sluice
SHELL   := /bin/bash

.PHONY: all build demo test deps fuzz bench reproduce reproduce-live clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/sluice

deps:
	./scripts/deps.sh

# The main job on the embedded default: the seed reproductions, then the examples.
demo: build
	./scripts/demo.sh

# Everything needed, then all tests: unit tests, fuzz corpora, live lab tests
# (root, network namespaces). scripts/testreport
# prints go test's usual lines, then each package's time, the slowest
# tests and the tests that measured again (docs/testing.md).
#
# The packages that measure real traffic, I/O or CPU, or time I/O
# (livetest/..., storage/...) run one at a time; the others, which only
# compute, two at a time before them.
LIVE_PKGS := ./livetest/... ./storage/...
test: deps build
	$(GO) vet ./...
	$(GO) build -o bin/testreport ./scripts/testreport
	set -o pipefail; { \
		$(GO) test -count=1 -p 2 -timeout 10m -json $$($(GO) list ./... | grep -v -e /livetest/ -e /storage); s1=$$?; \
		$(GO) test -count=1 -p 1 -timeout 18m -json $(LIVE_PKGS); s2=$$?; \
		exit $$((s1 | s2)); } | bin/testreport

# Every seed experiment in the simulator; writes out/report.md.
reproduce: build
	./scripts/reproduce.sh

# The live reproductions (root: lab namespaces, QEMU guests): Fig. 2 with
# DRS, Exp. 1, Exp. 3's costs, SIOC Test 3 with guests, seed 003's sweep;
# their results go to out/live/ and beside the simulator's rows in
# out/report.md (scripts/reproduce-live.sh). Load-sensitive: run it on a
# quiet machine.
reproduce-live: build
	./scripts/reproduce-live.sh

# Fuzz each parser and protocol for FUZZTIME (default 10m) each.
FUZZTIME ?= 10m
fuzz:
	$(GO) test -run '^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./policy
	$(GO) test -run '^$$' -fuzz=FuzzServer -fuzztime=$(FUZZTIME) ./storage/nbd
	$(GO) test -run '^$$' -fuzz=FuzzScheduler -fuzztime=$(FUZZTIME) ./mclock
	$(GO) test -run '^$$' -fuzz=FuzzParseScenario -fuzztime=$(FUZZTIME) ./sim
	$(GO) test -run '^$$' -fuzz=FuzzReadJSON -fuzztime=$(FUZZTIME) ./internal/inputfile
	$(GO) test -run '^$$' -fuzz=FuzzParseChange -fuzztime=$(FUZZTIME) ./placement
	$(GO) test -run '^$$' -fuzz=FuzzAPI -fuzztime=$(FUZZTIME) ./controller

bench: build
	./bench/run.sh

clean:
	rm -rf bin out
