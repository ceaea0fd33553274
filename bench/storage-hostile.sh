#!/usr/bin/env bash
# A hostile VM against the gateway's other VMs (issue 24), before and after
# a change: builds package storage's test binary at BEFORE and at AFTER
# (with the work tree's storage/hostile_test.go and internal/nbdattack
# copied into both, so that both run the same test), runs TestLiveHostileVM from each alternately
# ROUNDS times, and prints per attack vm2's IOPS as a share of vm2's IOPS
# alone measured in the same run: each round's share and the median. Only
# shares from the same run are compared; the machine is shared and noisy.
#
#   bench/storage-hostile.sh [BEFORE] [AFTER] [ROUNDS]
#   bench/storage-hostile.sh 7616670 . 3        (the defaults)
#
# A revision is a commit, a branch, or "." for the work tree as it is.
# Needs fio (scripts/deps.sh). About 30 s per run.
set -euo pipefail
before=${1:-7616670} after=${2:-.} rounds=${3:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$root/bench/rev-lib.sh"
build() { # rev name
	local src
	src=$(rev_src "$1" "$2")
	if [ "$src" != "$root" ]; then
		cp "$root/storage/hostile_test.go" "$src/storage/"
		mkdir -p "$src/internal/nbdattack"
		cp "$root/internal/nbdattack/"*.go "$src/internal/nbdattack/"
	fi
	(cd "$src" && go test -c -o "$tmp/$2.test" ./storage)
}
build "$before" before
build "$after" after
for r in $(seq "$rounds"); do
	for v in before after; do
		(cd "$root/storage" && "$tmp/$v.test" -test.run '^TestLiveHostileVM$' -test.v -test.count 1 2>&1 || true) |
			sed -n 's/.*vm1 \(.*\): vm2 kept a median \([0-9]*\)% of its IOPS alone (rounds.*/\1|\2/p' |
			awk -F'|' -v v=$v -v r=$r '{ print v "|" r "|" $1 "|" $2 }'
	done
done >"$tmp/runs"
awk -F'|' -f "$root/bench/hostile-table.awk" "$tmp/runs" | { IFS= read -r h; echo "$h"; sort; }
