# Shared helpers of the bench/net-*.sh scripts (sourced, not run).
# Needs root, iproute2, iperf3, sockperf, nbdkit and Go.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=$(mktemp -d /tmp/sluice-netbench.XXXXXX)
SLUICE=$WORK/sluice
(cd "$ROOT" && go build -o "$SLUICE" ./cmd/sluice)
STATE=$WORK/state
mkdir -p "$STATE"
CLUSTERS=()
AGENT_PID=

cleanup() {
	[ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null || true
	for c in "${CLUSTERS[@]}"; do "$SLUICE" lab down --cluster "$c" --state-dir "$STATE" >/dev/null || true; done
	rm -rf "$WORK"
}
trap cleanup EXIT

# policy CLUSTER NVMS: one host, one 1 Gbps uplink, NVMS VMs with equal shares.
policy() {
	local c=$1 n=$2 f=$WORK/$1.yaml
	{
		echo "cluster: $c"
		echo "hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]"
		echo "trafficClasses: {vm: {shares: normal}}"
		echo "vms:"
		for i in $(seq 1 "$n"); do echo "  - {name: vm$i, host: h1, nics: [{name: nic0, shares: normal}]}"; done
	} >"$f"
	echo "$f"
}

labup() { # labup CLUSTER FILE
	CLUSTERS+=("$1")
	"$SLUICE" lab down --cluster "$1" --state-dir "$STATE" >/dev/null || true
	"$SLUICE" lab up "$2" --state-dir "$STATE" >/dev/null
}

agent_start() { # agent_start FILE DYNAMIC
	"$SLUICE" agent --host h1 --policy "$1" --dynamic="$2" --state-dir "$STATE" 2>>"$WORK/agent.log" &
	AGENT_PID=$!
	for _ in $(seq 1 100); do [ -f "$STATE"/agent-*-h1.json ] 2>/dev/null && break; sleep 0.05; done
}

agent_stop() {
	[ -n "$AGENT_PID" ] && kill "$AGENT_PID" && wait "$AGENT_PID" 2>/dev/null || true
	AGENT_PID=
	rm -f "$STATE"/agent-*.json
}

# line_fifo CLUSTER: the baseline "default scheduler" of a 1 Gbps NIC: one
# FIFO drained at the line rate (TBF; the lab's veths have no rate of their
# own), instead of the sluice tree.
line_fifo() {
	ip netns exec "sl-$1-h1" tc qdisc del dev sl-up0 root 2>/dev/null || true
	ip netns exec "sl-$1-h1" tc qdisc replace dev sl-up0 root tbf rate 1gbit burst 256k latency 50ms
}

# tree_remove CLUSTER: back to the veth's default qdisc (noqueue).
tree_remove() { ip netns exec "sl-$1-h1" tc qdisc del dev sl-up0 root 2>/dev/null || true; }

machine() { echo "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"; }
