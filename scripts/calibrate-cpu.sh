#!/bin/sh
# Calibrate the simulator's CPU model (seed 003's cost of sending) to this
# machine: run the live sweep (livetest/cpulive TestSeed003Live, root,
# about a minute), which fits the model to its own points and writes the
# scenario out/live/cpu-limit-sweep-lab.yaml, then make that scenario the
# simulator's calibration, scenarios/calibration/cpu-limit-sweep-lab.yaml
# (review and commit it with the run's figures in docs/perf/cpu.md).
# The live test never judges against this file: it is an input of the
# simulator only.
set -eu
cd "$(dirname "$0")/.."
go test -count=1 -v -run '^TestSeed003Live$' ./livetest/cpulive/
cp out/live/cpu-limit-sweep-lab.yaml scenarios/calibration/cpu-limit-sweep-lab.yaml
echo "calibration: scenarios/calibration/cpu-limit-sweep-lab.yaml (from out/live/cpu-limit-sweep-lab.yaml)"
go run ./cmd/sluice sim scenarios/calibration/cpu-limit-sweep-lab.yaml -o out/cpu-limit-sweep-lab -q
