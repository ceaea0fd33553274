#!/usr/bin/env bash
# The controller's memory under oversized requests (docs/controller.md,
# Security): the real `sluice controller` on a temporary data directory
# (embedded etcd on 127.0.0.1) gets N concurrent POST /v1/policy of MB
# megabytes each (default 16 × 50 MB), each client on its own connection,
# first declared by Content-Length, then chunked. Prints, per round, the
# answers and the controller's RSS at rest and at its peak (VmHWM). No
# root, no lab.
#
#   bench/controller-bodies.sh
#   BEFORE=REV bench/controller-bodies.sh     # also REV's sluice, same load
#   N=32 MB=100 bench/controller-bodies.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export SLUICE_BODIES=${N:-16} SLUICE_BODY_MB=${MB:-50}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/sluice-now" ./cmd/sluice
bins=("$tmp/sluice-now")
if [ -n "${BEFORE:-}" ]; then
	# An export of REV's tree (not a worktree: the repository is left alone).
	mkdir "$tmp/before"
	git archive "$BEFORE" | tar -x -C "$tmp/before"
	(cd "$tmp/before" && go build -o "$tmp/sluice-before" ./cmd/sluice)
	bins=("$tmp/sluice-before" "$tmp/sluice-now")
fi
echo "# $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ), $(git rev-parse --short HEAD)"
status=0
for b in "${bins[@]}"; do
	echo "== $(basename "$b")${BEFORE:+ (before: $BEFORE)}"
	SLUICE_BIN=$b go test -run '^$' -bench 'LargeBodies$' -benchtime=1x -timeout 10m ./controller 2>&1 |
		grep -E '^(\||controller under|FAIL|---)' || status=1
done
exit $status
