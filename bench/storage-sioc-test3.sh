#!/bin/sh
# SIOC Test 3 analog (seed 002) with the issue's 60 s phases: two storage
# gateways (h1: vm1, vm2; h2: vm3, vm4), disk shares 1000/1000/1000/2000,
# one nbdkit datastore of 1600 IOPS shared by both (rate filter), threshold
# 12 ms, control period 1 s; phases: all active / vm4 idle / all active.
# `go test` runs the same test with 20 s phases; this runs it with PHASE.
# Prints every period (windows, datastore latency, per-VM IOPS) and the
# checks (windows 2:3 ± 15%, latency 12 ms ± 25%, IOPS split 1:1:1:2,
# others rise within 3 periods when vm4 idles, phase-1 split back in phase 3).
#
#   bench/storage-sioc-test3.sh [PHASE]     (default 60s; needs fio and nbdkit)
set -eu
phase=${1:-60s}
cd "$(dirname "$0")/.."
SLUICE_SIOC_PHASE=$phase go test -count=1 -timeout 30m -run 'TestLiveSIOCTest3$' -v ./storage/
