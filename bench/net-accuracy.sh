#!/usr/bin/env bash
# Accuracy of the split, static HTB vs dynamic enforcement: runs the live
# Fig. 2 step a, limit/shares/idle and Exp. 1 tests and prints their
# measured-vs-entitled tables (the tests assert the dynamic numbers).
# Usage: sudo bench/net-accuracy.sh
set -euo pipefail
cd "$(dirname "$0")/.."
echo "# $(nproc) CPUs, kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
go test -count=1 -v -run 'TestFig2StepA|TestLimitSharesIdle|TestExp1' ./livetest/netlive/ 2>&1 |
	grep -v 'stats at the end' | sed -n '/usable rate\|Fig. 2\|port \|nic0 \|ratios\|limited\|lowest\|h1\/nfs\|h1\/vmotion\|--- \|^ok\|FAIL/p'
