#!/usr/bin/env bash
# Latency of a latency-sensitive VM under bulk load (issue 27, seed 004):
# sockperf TCP ping-pong, 64-byte messages, from vm1 (100 Mbps reservation)
# to the fabric while vm2..vm4 each push 4 iperf3 streams through the same
# 1 Gbps uplink. Variants, in this order in each round:
#   alone      the sluice tree (dynamic), no bulk traffic
#   static     the agent's static tree (rate = reservation, ceil = line)
#   sluice     the agent, dynamic, vm1 with latency: normal
#   sensitive  the agent, dynamic, vm1 with latency: sensitive
#   static/16k, sluice/16k, sensitive/16k: the same with the bulk VMs'
#              GSO capped at 16 KiB (ip link set dev sl-eth0 gso_max_size
#              16384 in their namespaces: the guest setting that sluice's
#              explain recommends beside a latency-sensitive VM)
# Prints per variant and round sockperf's p50/p99/p99.9 RTT (µs) and the
# bulk VMs' received split: the largest deviation from their mean (they
# have equal shares, so equal entitlements).
# Usage: sudo bench/net-latency-load.sh [SECONDS] [ROUNDS]
source "$(dirname "$0")/net-lib.sh"
SECS=${1:-10}
ROUNDS=${2:-3}
pol() { # pol LATENCY: the policy file
	local f=$WORK/nll-$1.yaml
	cat >"$f" <<YAML
cluster: nll
hosts: [{name: h1, uplinks: [{name: up0, speed: 1Gbps}]}]
trafficClasses: {vm: {shares: normal}}
vms:
  - {name: vm1, host: h1, latency: $1, nics: [{name: nic0, reservation: 100Mbps}]}
  - {name: vm2, host: h1, nics: [{name: nic0, shares: normal}]}
  - {name: vm3, host: h1, nics: [{name: nic0, shares: normal}]}
  - {name: vm4, host: h1, nics: [{name: nic0, shares: normal}]}
YAML
	echo "$f"
}
normal=$(pol normal)
sensitive=$(pol sensitive)
labup nll "$normal"
ping_pong() { # prints p50 p99 p99.9
	ip netns exec sl-nll-vm1 sockperf ping-pong --tcp -i 198.18.0.1 -p 11111 -m 64 -t "$SECS" --full-rtt 2>&1 |
		awk '/percentile 50.000/ {a=$NF} /percentile 99.000/ {b=$NF} /percentile 99.900/ {c=$NF} END {printf "%s %s %s\n", a, b, c}'
}
bulk_gso() { # bulk_gso BYTES: the bulk VMs' largest GSO segment
	for i in 2 3 4; do ip -n "sl-nll-vm$i" link set dev sl-eth0 gso_max_size "$1"; done
}
bulk_start() {
	for i in 2 3 4; do
		ip netns exec "sl-nll-vm$i" iperf3 -c 198.18.0.1 -p $((5200 + i)) -P 4 -t $((SECS + 3)) -J >"$WORK/bulk-$i.json" 2>&1 &
	done
	sleep 2 # the flows ramp up before the pings start
}
split() { # the bulk VMs' largest deviation from their mean, in %
	wait
	python3 - "$WORK"/bulk-{2,3,4}.json <<'PY'
import json, sys
r = [json.load(open(f))["end"]["sum_received"]["bits_per_second"] for f in sys.argv[1:]]
m = sum(r) / len(r)
print("%.1f %s" % (100 * max(abs(x / m - 1) for x in r), "/".join("%.0f" % (x / 1e6) for x in r)))
PY
}
run() { # run VARIANT ROUND
	local v=$1 lat split_
	case $v in
	*/16k) bulk_gso 16384 ;;
	*) bulk_gso 65536 ;;
	esac
	case ${v%/16k} in
	alone) agent_start "$normal" true ;;
	static) agent_start "$normal" false ;;
	sluice) agent_start "$normal" true ;;
	sensitive) agent_start "$sensitive" true ;;
	esac
	sleep 3 # the agent's first steps
	if [ "$v" = alone ]; then
		lat=$(ping_pong)
		split_="- -"
	else
		bulk_start
		lat=$(ping_pong)
		split_=$(split)
	fi
	agent_stop
	tree_remove nll
	printf "%-14s %5s %8s %8s %8s %10s %s\n" "$v" "$2" $lat $split_
}
echo "# sockperf ping-pong TCP 64 B from vm1 (R = 100 Mbps), ${SECS}s per run; vm2..vm4 4 iperf3 streams each; 1 Gbps uplink; $(machine); $(date -u +%FT%TZ)"
printf "%-14s %5s %8s %8s %8s %10s %s\n" variant round p50_us p99_us p99.9_us split_err% bulk_Mbps
for r in $(seq 1 "$ROUNDS"); do
	for v in alone static sluice sensitive static/16k sluice/16k sensitive/16k; do run "$v" "$r"; done
done
