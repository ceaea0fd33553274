#!/usr/bin/env bash
# The controller at scale (docs/perf/controller.md): the real `sluice
# controller` on its embedded etcd (fsync on), HOSTS simulated agents
# (default 1,000; each its own TLS connection and long poll) and a policy
# of VMS VMs (default 30,000), one vNIC each. Prints a table: the agents
# registering, `sluice ctl apply` of the whole policy, every agent's watch
# having its host's desired state, `sluice ctl set` of one vNIC to its
# agent (controller.Follower) computing the new rates, memory (RSS). No root.
#
#   bench/controller.sh                       # 1,000 hosts, 30,000 VMs
#   HOSTS=100 VMS=3000 bench/controller.sh
#   BEFORE=REV bench/controller.sh            # also REV's sluice, same benchmark, alternately
#   ROUNDS=2 ...                              # runs of each (default 1)
#
# Then the in-process benchmarks (no HTTP): one set, one registration,
# the Follower applying a host's desired state, and every host's desired state rendered
# host by host (the rendering before) and in one pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export SLUICE_SCALE_HOSTS=${HOSTS:-1000} SLUICE_SCALE_VMS=${VMS:-30000}
rounds=${ROUNDS:-1}
tmp=$(mktemp -d)
trap 'cd "$root"; [ -d "$tmp/wt" ] && git worktree remove --force "$tmp/wt" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
go build -o "$tmp/sluice-now" ./cmd/sluice
bins=("$tmp/sluice-now")
if [ -n "${BEFORE:-}" ]; then
	git worktree add -q --detach "$tmp/wt" "$BEFORE"
	(cd "$tmp/wt" && go build -o "$tmp/sluice-before" ./cmd/sluice)
	bins=("$tmp/sluice-before" "$tmp/sluice-now")
fi
echo "# $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ), $(git rev-parse --short HEAD)"
status=0
for r in $(seq "$rounds"); do
	for b in "${bins[@]}"; do
		echo "== round $r: $(basename "$b")${BEFORE:+ (before: $BEFORE)}"
		SLUICE_BIN=$b go test -run '^$' -bench 'Scale$' -benchtime=1x -timeout 60m ./controller 2>&1 |
			grep -v -E '^(goos|goarch|pkg|cpu|PASS|ok|embedded etcd)' || status=1
	done
done
echo "== in process"
go test -run '^$' -bench 'InProcess|FollowerDesired|RenderDesired' -benchtime=3x -benchmem ./controller 2>&1 |
	grep -E '^Benchmark' || status=1
exit $status
