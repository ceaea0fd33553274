#!/usr/bin/env bash
# One HTB lock on a 25–100 GbE uplink (issue 27): the simulator model of
# sim/txlock, and the measurement that calibrates it.
#
#   bench/htb-lock.sh [model] [SECONDS]      the table from the model
#                                            (form × link × CPUs → rate,
#                                            split error, CPU per Gbit/s);
#                                            SECONDS simulated per cell
#                                            (default 0.5, the first 0.25
#                                            not counted); no root
#   bench/htb-lock.sh calibrate [SECS] [ROUNDS]
#                                            root: per-packet CPU of a UDP
#                                            send through an IFB (a sink:
#                                            it drops what it did not get
#                                            from mirred) in namespace
#                                            sl-txcal, root qdisc noqueue
#                                            vs a sluice-shaped HTB, one
#                                            sender (CPU 1) and two
#                                            (CPUs 0 and 1), MTU and 64 KB
#                                            UDP GSO; defaults 2 s, 5 rounds
#
# The calibration needs root, iproute2 and gcc (the sender is C, built
# from the text below into a temporary directory). It checks whether the
# kernel has fq and says so. Everything it creates carries the sl- prefix
# and is removed on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODE=${1:-model}
case $MODE in
model | calibrate) shift || true ;;
*) MODE=model ;;
esac

if [ "$MODE" = model ]; then
	cd "$ROOT"
	exec go run ./sim/txlock/txlockbench -seconds "${1:-0.5}"
fi

SECS=${1:-2}
ROUNDS=${2:-5}
NS=sl-txcal
DEV=sl-txifb
WORK=$(mktemp -d /tmp/sl-txcal.XXXXXX)
cleanup() {
	ip netns del "$NS" 2>/dev/null || true
	rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/send.c" <<'EOF'
// send DSTIP PORT LEN GSO SECONDS PRIO: UDP sends for SECONDS; prints the
// skbs sent and this thread's CPU time (user+sys) per skb.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
static long long ns(clockid_t c) { struct timespec t; clock_gettime(c, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
	if (argc < 7) return 2;
	int len = atoi(argv[3]), gso = atoi(argv[4]), prio = (int)strtol(argv[6], 0, 0);
	double secs = atof(argv[5]);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	inet_pton(AF_INET, argv[1], &a.sin_addr);
	if (connect(fd, (void *)&a, sizeof a)) { perror("connect"); return 1; }
	if (gso > 0 && setsockopt(fd, SOL_UDP, UDP_SEGMENT, &gso, sizeof gso)) { perror("UDP_SEGMENT"); return 1; }
	if (prio && setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof prio)) { perror("SO_PRIORITY"); return 1; }
	int sb = 4 << 20;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sb, sizeof sb);
	char *buf = calloc(1, len);
	long long t0 = ns(CLOCK_MONOTONIC), c0 = ns(CLOCK_THREAD_CPUTIME_ID), end = t0 + (long long)(secs * 1e9);
	long long n = 0, err = 0;
	for (;;) {
		for (int i = 0; i < 256; i++) { if (send(fd, buf, len, 0) < 0) err++; else n++; }
		if (ns(CLOCK_MONOTONIC) >= end) break;
	}
	long long t1 = ns(CLOCK_MONOTONIC), c1 = ns(CLOCK_THREAD_CPUTIME_ID);
	printf("%lld %lld %lld %lld\n", n, err, t1 - t0, c1 - c0);
	return 0;
}
EOF
gcc -O2 -o "$WORK/send" "$WORK/send.c"

ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
ip -n "$NS" link add "$DEV" type ifb
ip -n "$NS" link set lo up
ip -n "$NS" link set "$DEV" up
ip -n "$NS" addr add 10.251.0.1/24 dev "$DEV"

if tc -n "$NS" qdisc replace dev "$DEV" root fq 2>"$WORK/fq.err"; then
	echo "# fq: present in this kernel"
else
	echo "# fq: absent in this kernel ($(uname -r)): $(tr -d '\n' <"$WORK/fq.err"); fq's cost is not measured here"
fi

# The shape of sluice's tree (docs/agent.md "The tree on each uplink"):
# root 1:1 at the line rate, the vm class 1:11, 32 leaves 1:100…; the
# sender's socket priority names its leaf, as sluice's eBPF program sets
# skb->priority. Rates so high that nothing is ever throttled: what is
# measured is HTB's per-packet work, not shaping (the run prints the
# root's drops and overlimits, which must stay 0).
qd_noqueue() { tc -n "$NS" qdisc replace dev "$DEV" root noqueue; }
qd_htb() {
	tc -n "$NS" qdisc del dev "$DEV" root 2>/dev/null || true
	tc -n "$NS" qdisc add dev "$DEV" root handle 1: htb default 10
	tc -n "$NS" class add dev "$DEV" parent 1: classid 1:1 htb rate 1000gbit ceil 1000gbit quantum 67050 burst 1m cburst 1m
	tc -n "$NS" class add dev "$DEV" parent 1:1 classid 1:10 htb rate 10gbit ceil 1000gbit quantum 67050 burst 1m cburst 1m
	tc -n "$NS" class add dev "$DEV" parent 1:1 classid 1:11 htb rate 1000gbit ceil 1000gbit quantum 67050 burst 1m cburst 1m
	for k in $(seq 0 31); do
		tc -n "$NS" class add dev "$DEV" parent 1:11 classid "1:$(printf %x $((0x100 + k)))" \
			htb rate 1000gbit ceil 1000gbit quantum 67050 burst 1m cburst 1m
	done
}

busy() { awk '/^cpu / {print $2+$3+$4+$7+$8; exit}' /proc/stat; }
softirq() { awk '/^cpu / {print $8; exit}' /proc/stat; }
HZ=$(getconf CLK_TCK)

# run QDISC LEN GSO CPUS...: one sender per CPU listed, at once; prints
# per sender "skbs cpu_ns/skb", then the total skbs/s and the machine's
# softirq share of the run.
run() {
	local qd=$1 len=$2 gso=$3
	shift 3
	"qd_$qd"
	local i=0 s0 s1 b0 b1
	s0=$(softirq)
	b0=$(busy)
	for c in "$@"; do
		ip netns exec "$NS" taskset -c "$c" "$WORK/send" 10.251.0.2 9 "$len" "$gso" "$SECS" $((0x10100 + i)) >"$WORK/out.$c" &
		i=$((i + 1))
	done
	wait
	local drops
	drops=$(tc -n "$NS" -s qdisc show dev "$DEV" | awk '/dropped/ {gsub(/[,)]/, ""); d = $7 "/" $9; exit} END {print d ? d : "0/0"}')
	s1=$(softirq)
	b1=$(busy)
	for c in "$@"; do cat "$WORK/out.$c"; done | awk -v qd="$qd" -v len="$len" -v n=$# \
		-v drops="$drops" -v si=$((s1 - s0)) -v bz=$((b1 - b0)) -v hz="$HZ" -v secs="$SECS" '
		{ skb += $1; err += $2; cpu += $4; wall = $3; per = per sprintf(" %.0f", $4 / $1) }
		END { printf "%-8s %6d %d  %8.0f  %7.0f %s   softirq %.1f%% of busy, %d send errors, root dropped/overlimits %s\n",
			qd, len, n, skb / (wall / 1e9), cpu / skb, per, bz ? 100 * si / bz : 0, err, drops }'
}

echo "# per-skb CPU (ns, sender threads' user+sys) through $DEV, ${SECS}s runs, $ROUNDS rounds; $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ)"
echo "# qdisc     len senders  skb/s    ns/skb  per-sender"
for r in $(seq 1 "$ROUNDS"); do
	echo "# round $r"
	for len in 1472 64000; do
		gso=0
		[ "$len" -gt 1472 ] && gso=1472
		for qd in noqueue htb; do run "$qd" "$len" "$gso" 1; done
		for qd in noqueue htb; do run "$qd" "$len" "$gso" 0 1; done
	done
done
