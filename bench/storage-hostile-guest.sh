#!/usr/bin/env bash
# A hostile VM against a QEMU guest on the same gateway (issue 24), with the
# gateway of two revisions: builds `sluice` at BEFORE and at AFTER and runs
# TestGuestHostileVM (livetest/virtstorage, build tag hostileguest: the
# work tree's test and lab) with each as the lab's gateway
# (SLUICE_GATEWAY_BIN), alternately ROUNDS times. It prints per attack the
# median share of vm2's IOPS alone that each run measured (three rounds of
# attacked and alone runs side by side) and the median of the runs.
#
#   bench/storage-hostile-guest.sh [BEFORE] [AFTER] [ROUNDS]
#   bench/storage-hostile-guest.sh 7616670 . 1       (the defaults)
#
# A revision is a commit, a branch, or "." for the work tree as it is.
# Root, libvirtd, fio, taskset and chrt (scripts/deps.sh); 2 CPUs or more.
# About 4 minutes per run.
set -euo pipefail
before=${1:-7616670} after=${2:-.} rounds=${3:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$root/bench/rev-lib.sh"
build() { # rev name
	local src
	src=$(rev_src "$1" "$2")
	(cd "$src" && go build -o "$tmp/$2" ./cmd/sluice)
}
build "$before" before
build "$after" after
(cd "$root" && go test -c -tags hostileguest -o "$tmp/virtstorage.test" ./livetest/virtstorage)
for r in $(seq "$rounds"); do
	for v in before after; do
		log=$tmp/$v-$r.log
		(cd "$root/livetest/virtstorage" && SLUICE_GATEWAY_BIN=$tmp/$v "$tmp/virtstorage.test" \
			-test.run '^TestGuestHostileVM$' -test.v -test.count 1 -test.timeout 15m >"$log" 2>&1 || true)
		sed -n 's/.*_test\.go:[0-9]*: \(.*\): vm2 kept a median \([0-9]*\)% of its IOPS alone (rounds.*/\1|\2/p' "$log" |
			awk -F'|' -v v=$v -v r=$r '{ print v "|" r "|" $1 "|" $2 }'
		if grep -q 'kept a median' "$log"; then
			# A run that measured and failed (a gateway before the rules
			# fails on purpose) kept its lab's logs: not needed.
			sed -n 's/.*logs kept in \(\/tmp\/sl-[^ ]*\).*/\1/p' "$log" | xargs -r rm -rf
		else
			echo "$v, run $r measured nothing; its log ends:" >&2
			tail -15 "$log" >&2
		fi
	done
done >"$tmp/runs"
awk -F'|' -f "$root/bench/hostile-table.awk" "$tmp/runs" | { IFS= read -r h; echo "$h"; sort; }
