#!/usr/bin/env bash
# CPU cost of the sluice tree: CPU seconds per GB sent through one 1 Gbps
# uplink by 1, 10, 25 and 50 VMs (one iperf3 stream each, all at once), with
# the default scheduler of a 1 Gbps NIC (one FIFO at line rate: TBF) and
# with the sluice HTB tree (agent running, dynamic).
#   clients: user+sys CPU of the iperf3 senders (qdisc work done in their
#            context included) per GB received;
#   system:  busy CPU time of the whole machine (from /proc/stat) per GB;
#            includes softirqs, the receivers, the agent, and anything else
#            running on the machine, so it is noisy on a shared machine.
# Usage: sudo bench/net-cpu.sh [SECONDS] [VM COUNTS...]
source "$(dirname "$0")/net-lib.sh"
SECS=${1:-8}
shift || true
COUNTS=${*:-1 10 25 50}
busy() { awk '/^cpu / {print $2+$3+$4+$7+$8}' /proc/stat; }
HZ=$(getconf CLK_TCK)

# run N: prints "GB client_cpu_s system_cpu_s".
run() {
	local n=$1 out=$WORK/run
	rm -rf "$out" && mkdir -p "$out"
	local b0 b1 t
	b0=$(busy)
	t=$( { TIMEFORMAT='%U %S'; time (
		for i in $(seq 1 "$n"); do
			ip netns exec "sl-nbc$n-vm$i" iperf3 -C cubic -c 198.18.0.1 -p $((5200 + i)) -t "$SECS" -J >"$out/$i.json" 2>&1 &
		done
		wait
	); } 2>&1)
	b1=$(busy)
	local gb
	gb=$(cat "$out"/*.json | python3 -c '
import json, sys
dec = json.JSONDecoder(); s = sys.stdin.read(); i = 0; tot = 0
while i < len(s):
    while i < len(s) and s[i].isspace(): i += 1
    if i >= len(s): break
    o, i = dec.raw_decode(s, i)
    tot += o.get("end", {}).get("sum_received", {}).get("bytes", 0)
print(tot / 1e9)')
	echo "$gb $t $(( (b1 - b0) ))"
}

echo "# CPU per GB, ${SECS}s runs, one iperf3 stream per VM, 1 Gbps uplink; $(machine); $(date -u +%FT%TZ)"
printf "%4s %-10s %7s %10s %10s %12s %12s\n" VMs qdisc GB client_s sys_s client_s/GB system_s/GB
for n in $COUNTS; do
	f=$(policy "nbc$n" "$n")
	labup "nbc$n" "$f"
	for mode in fifo sluice; do
		if [ "$mode" = sluice ]; then tree_remove "nbc$n"; agent_start "$f" true; else line_fifo "nbc$n"; fi
		read -r gb u s jif < <(run "$n")
		[ "$mode" = sluice ] && agent_stop
		awk -v n="$n" -v m="$mode" -v gb="$gb" -v u="$u" -v s="$s" -v j="$jif" -v hz="$HZ" 'BEGIN {
			c = u + s; sy = j / hz
			printf "%4d %-10s %7.2f %10.2f %10.2f %12.3f %12.3f\n", n, m, gb, c, sy, c / gb, sy / gb }'
	done
	"$SLUICE" lab down --cluster "nbc$n" --state-dir "$STATE" >/dev/null
done
