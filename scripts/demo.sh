#!/usr/bin/env bash
# make demo: the main job on the embedded default.
#  1. validate the example policies;
#  2. NetIOC Fig. 2 by hand: entitlements, the explanation, and the placement
#     decisions as vm2 and vm3 get their reservations;
#  3. every seed experiment in the simulator (scripts/reproduce.sh), which
#     writes out/report.md with "seed vs sluice" tables and plots.
set -uo pipefail
cd "$(dirname "$0")/.."
S=bin/sluice
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "validate the example policies"
for f in examples/*.yaml; do $S validate "$f" || exit 1; done

step "NetIOC Fig. 2 step a: entitlements on host h1 (sluice alloc)"
$S alloc examples/netioc-fig2.yaml || exit 1

step "why vm2/nic0 gets what it gets (sluice explain)"
$S explain examples/netioc-fig2.yaml vm2/nic0 || exit 1

step "steps b and c: vm2 reserves 4.5 Gbps, then vm3 3 Gbps (sluice place)"
$S place examples/netioc-fig2.yaml \
	--change vm2/nic0.reservation=4.5Gbps --change vm3/nic0.reservation=3Gbps || exit 1

step "every seed experiment in the simulator (make reproduce)"
# Some seed targets are missed, for the reasons docs/sim.md gives ("Known
# differences"), so reproduce.sh's own status is not the verdict; the
# committed baseline is: every expectation met before must still be met
# (TestSeedBaseline, also part of make test).
./scripts/reproduce.sh
step "report: out/report.md"
met=$(grep -c '^| ✅' out/report.md || true)
missed=$(grep -c '^| ❌' out/report.md || true)
live=$(grep -c '^| ⏳' out/report.md || true)
echo "seed expectations: $met met, $missed not met, $live live ones not measured here (make reproduce-live; see out/report.md and docs/sim.md)"
base=$(grep -vc '^#' scenarios/seeds/baseline.txt || true)
if go test -count=1 -run '^TestSeedBaseline$' ./sim >/tmp/sluice-demo-baseline.txt 2>&1; then
	echo "baseline: all $base expectations of scenarios/seeds/baseline.txt still met"
else
	grep 'no longer met' /tmp/sluice-demo-baseline.txt
	echo "baseline: an expectation of scenarios/seeds/baseline.txt is no longer met" >&2
	exit 1
fi
