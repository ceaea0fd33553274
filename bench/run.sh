#!/usr/bin/env bash
# make bench: every benchmark of sluice, one after the other.
#  1. Go benchmarks of the pure core and the simulator (go test -bench), with
#     benchstat-style output in out/bench/go.txt;
#  2. the live overhead scripts (root: network namespaces, iperf3, sockperf,
#     fio, nbdkit), each printing a table.
# The machine is shared and noisy: compare ratios measured in one run, and
# read docs/performance.md for the latest results and how they were taken.
#
#   bench/run.sh [go|live|all]      (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
mkdir -p out/bench
status=0
if [ "$what" = go ] || [ "$what" = all ]; then
	echo "== Go benchmarks (out/bench/go.txt)"
	go test -run '^$' -bench . -benchmem -benchtime=200ms \
		./alloc ./entitle ./hclock ./mclock ./placement ./policy ./storage 2>&1 | tee out/bench/go.txt || status=1
	echo "== simulator (one run each)"
	go test -run '^$' -bench . -benchtime=1x ./sim 2>&1 | tee -a out/bench/go.txt || status=1
fi
if [ "$what" = live ] || [ "$what" = all ]; then
	for s in bench/*.sh; do
		case $s in bench/run.sh | bench/*-lib.sh) continue ;; esac
		echo "== $s"
		"$s" || status=1
	done
fi
exit $status
