#!/usr/bin/env bash
# Latency overhead of the sluice tree: sockperf TCP ping-pong, 64-byte
# messages, from a VM through its idle host uplink to the fabric, with the
# veth's default qdisc (noqueue), with the default scheduler of a 1 Gbps NIC
# (one FIFO at line rate: TBF) and with the sluice HTB tree (agent running,
# dynamic). Prints p50 and p99 round-trip latency in microseconds.
# Usage: sudo bench/net-latency.sh [SECONDS]
source "$(dirname "$0")/net-lib.sh"
SECS=${1:-10}
f=$(policy nbl 1)
labup nbl "$f"
run() {
	ip netns exec sl-nbl-vm1 sockperf ping-pong --tcp -i 198.18.0.1 -p 11111 -m 64 -t "$SECS" --full-rtt 2>&1 |
		awk '/percentile 50.000/ {p50=$NF} /percentile 99.000/ {p99=$NF} END {printf "%s %s\n", p50, p99}'
}
read -r d50 d99 < <(run)
line_fifo nbl
read -r f50 f99 < <(run)
tree_remove nbl
agent_start "$f" true
read -r s50 s99 < <(run)
agent_stop
echo "# sockperf ping-pong TCP 64 B, ${SECS}s each, RTT in usec; $(machine); $(date -u +%FT%TZ)"
printf "%-16s %8s %8s\n" qdisc p50_us p99_us
printf "%-16s %8s %8s\n" noqueue "$d50" "$d99"
printf "%-16s %8s %8s\n" fifo-1gbit "$f50" "$f99"
printf "%-16s %8s %8s\n" sluice-htb "$s50" "$s99"
