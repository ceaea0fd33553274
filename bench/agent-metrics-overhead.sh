#!/usr/bin/env bash
# CPU of the live agent with its metrics off and on (issue 25): a lab host
# with VMS vNICs on one 1 Gbps uplink (default 30), the agent binary
# (dynamic, 100 ms steps) run ROUNDS times each way, alternately:
#   off: --metrics-listen ""
#   on:  --metrics-listen 127.0.0.1:PORT and a scrape of /metrics every
#        SCRAPE seconds (default 1: ten times Prometheus's usual 10 s)
# For SECS seconds after a 2-s warm-up it reads the agent's CPU time, the
# sum of its threads' /proc/PID/task/*/schedstat (ns), and prints per run
# the CPU in ms per second, then the medians and their ratio.
# Usage: sudo bench/agent-metrics-overhead.sh [SECS] [ROUNDS] [VMS] [SCRAPE]
source "$(dirname "$0")/net-lib.sh"
SECS=${1:-20}
ROUNDS=${2:-3}
VMS=${3:-30}
SCRAPE=${4:-1}
C=nmo
F=$(policy $C "$VMS")
labup $C "$F"
PORT=$((19000 + $$ % 1000))

cpu_ns() { # cpu_ns PID: CPU time of the process's threads, ns
	cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%d\n", s}'
}

# one MODE: prints the agent's CPU in ms per second over SECS.
one() {
	local mode=$1 listen="" scraper=
	[ "$mode" = on ] && listen=127.0.0.1:$PORT
	"$SLUICE" agent --host h1 --policy "$F" --state-dir "$STATE" --metrics-listen "$listen" 2>>"$WORK/agent.log" &
	AGENT_PID=$!
	for _ in $(seq 1 200); do [ -f "$STATE/agent-$C-h1.json" ] && break; sleep 0.05; done
	if [ "$mode" = on ]; then
		(while kill -0 "$AGENT_PID" 2>/dev/null; do curl -s -o /dev/null "http://$listen/metrics"; sleep "$SCRAPE"; done) &
		scraper=$!
	fi
	sleep 2
	local c0 t0 c1 t1
	c0=$(cpu_ns "$AGENT_PID"); t0=$(date +%s%N)
	sleep "$SECS"
	c1=$(cpu_ns "$AGENT_PID"); t1=$(date +%s%N)
	[ -n "$scraper" ] && kill "$scraper" 2>/dev/null && wait "$scraper" 2>/dev/null || true
	if [ "$mode" = on ]; then
		curl -s "http://$listen/metrics" | grep -c '^sluice_agent_' >"$WORK/series"
	fi
	agent_stop
	awk -v c=$((c1 - c0)) -v t=$((t1 - t0)) 'BEGIN {printf "%.3f\n", c / 1e6 / (t / 1e9)}'
}

echo "machine: $(machine)"
echo "agent: $VMS vNICs, 100 ms steps; on = metrics served and scraped every ${SCRAPE}s; ${SECS}s per run, $ROUNDS rounds"
offs=() ons=()
for r in $(seq 1 "$ROUNDS"); do
	a=$(one off); b=$(one on)
	offs+=("$a"); ons+=("$b")
	echo "round $r: off $a ms/s, on $b ms/s"
done
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
mo=$(med "${offs[@]}"); mn=$(med "${ons[@]}")
echo "series per scrape: $(cat "$WORK/series")"
awk -v o="$mo" -v n="$mn" 'BEGIN {printf "median: off %.3f ms/s (%.3f%% of a core), on %.3f ms/s (%.3f%%); on/off %.3f, difference %+.4f%% of a core\n", o, o / 10, n, n / 10, n / o, (n - o) / 10}'
