#!/usr/bin/env bash
# make reproduce-live (root): the live reproductions of the seed
# experiments, then scripts/reproduce.sh, which puts each one beside the
# simulator's rows in out/report.md:
#   netioc-fig2      livetest/ctllive  TestFig2DRSLive   (Fig. 2 with DRS, 1/10 scale)
#   netioc-exp1      livetest/netlive  TestExp1          (12 VMs, NFS and vMotion)
#   netioc-exp3      bench/net-cpu.sh, bench/net-latency.sh: sluice's CPU per
#                    GB and TCP_RR latency, HTB tree vs one FIFO at line rate;
#                    out/live/netioc-exp3.json judges the report's live rows
#   sioc-test3       livetest/virtstorage TestGuestSIOCTest3 (QEMU guests, fio)
#   cpu-limit-sweep  livetest/cpulive  TestSeed003Live   (writes its own section)
# Every result goes to out/live/ (NAME.md, the test's log NAME.log), with
# the machine, the time and how long it took. A step that fails is
# reported as failed and the others still run; exit 1 when one failed.
#
# Usage: sudo scripts/reproduce-live.sh [NAME ...]   (default: all five)
# EXP3_SECS (8) and EXP3_VMS ("1 10 25 50 100") set the CPU runs,
# EXP3_LAT_SECS (10) the latency runs.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
	echo "reproduce-live: needs root (network namespaces, cgroups, QEMU guests)" >&2
	exit 2
fi
OUT=out/live
mkdir -p "$OUT"
[ $# -gt 0 ] || set -- netioc-fig2 netioc-exp1 netioc-exp3 sioc-test3 cpu-limit-sweep
status=0
host=$(uname -n)
machine="$(nproc) CPUs, kernel $(uname -r)"

# section NAME TITLE TEST PKG VERDICT SECONDS LOG: out/live/NAME.md from a
# go test -v log: the verdict and the test's own log lines (its measures).
section() {
	local name=$1 title=$2 test=$3 pkg=$4 verdict=$5 secs=$6 log=$7
	{
		echo "### $name, live: $title"
		echo
		echo "\`$test\` ($pkg) on $host ($machine), $(date -u '+%Y-%m-%d %H:%M UTC'), $secs s: **$verdict**. Its measures, as the test logged them:"
		echo
		echo '```'
		grep -E '^\s+[A-Za-z0-9_]+\.go:[0-9]+:|^\s{8}' "$log" | sed 's/^    //' | head -200
		echo '```'
		echo
	} >"$OUT/$name.md"
}

# gotest NAME TITLE TEST PKG [OWN]: run one live test; OWN: the test writes
# out/live/NAME.md itself (add only the verdict).
gotest() {
	local name=$1 title=$2 test=$3 pkg=$4 own=${5:-}
	local log=$OUT/$name.log t0 verdict
	t0=$(date +%s)
	[ -n "$own" ] && rm -f "$OUT/$name.md"
	if go test -count=1 -v -timeout 40m -run "^$test\$" "$pkg" >"$log" 2>&1; then verdict=PASS; else verdict=FAIL; status=1; fi
	grep -q -- "--- SKIP: $test" "$log" && verdict="SKIPPED ($(grep -m1 -A1 -- "--- SKIP: $test" "$log" | tail -1 | sed 's/^ *//'))"
	local secs=$(($(date +%s) - t0))
	echo "$name: $test $verdict ($secs s; log $log)"
	if [ -n "$own" ] && [ -f "$OUT/$name.md" ]; then
		printf '\n`%s` (%s): **%s** in %s s.\n\n' "$test" "$pkg" "$verdict" "$secs" >>"$OUT/$name.md"
	else
		section "$name" "$title" "$test" "$pkg" "$verdict" "$secs" "$log"
	fi
}

# exp3: the live figures of netioc-exp3's kind: live rows.
exp3() {
	local t0 cpu=$OUT/netioc-exp3-cpu.txt lat=$OUT/netioc-exp3-latency.txt
	t0=$(date +%s)
	# shellcheck disable=SC2086
	if ! bench/net-cpu.sh "${EXP3_SECS:-8}" ${EXP3_VMS:-1 10 25 50 100} >"$cpu" 2>&1; then
		echo "netioc-exp3: bench/net-cpu.sh failed (see $cpu)"
		status=1
	fi
	if ! bench/net-latency.sh "${EXP3_LAT_SECS:-10}" >"$lat" 2>&1; then
		echo "netioc-exp3: bench/net-latency.sh failed (see $lat)"
		status=1
	fi
	local secs=$(($(date +%s) - t0))
	local src="bench/net-cpu.sh, bench/net-latency.sh on $host ($machine), $(date -u '+%Y-%m-%d %H:%M UTC')"
	exp3JSON "$cpu" "$lat" "$src" >"$OUT/netioc-exp3.json"
	{
		echo "### netioc-exp3, live: sluice's own CPU and latency cost"
		echo
		echo "$src, $secs s; the rows above marked \"live\" are judged on these figures."
		echo
		echo '```'
		cat "$cpu" "$lat"
		echo '```'
		echo
	} >"$OUT/netioc-exp3.md"
	echo "netioc-exp3: live figures in $OUT/netioc-exp3.json ($secs s)"
}

# exp3JSON CPU LATENCY SOURCE: the live figures file (sim.LiveFigures) from
# the two benches' tables: per VM count sluice's client CPU per GB over
# the FIFO's, and sluice's TCP_RR p50 minus the FIFO's.
exp3JSON() {
	awk -v src="$3" '
		FNR == 1 { file++ }
		file == 1 && $2 == "fifo" && $1 ~ /^[0-9]+$/ { fifo[$1] = $6 }
		file == 1 && $2 == "sluice" && $1 ~ /^[0-9]+$/ { tree[$1] = $6 }
		file == 2 && $1 == "fifo-1gbit" { f50 = $2 }
		file == 2 && $1 == "sluice-htb" { s50 = $2 }
		END {
			gsub(/"/, "\\\"", src)
			printf "{\"source\": \"%s\", \"figures\": {", src
			sep = ""
			for (n in tree) {
				if (fifo[n] > 0) {
					name = (n == 1) ? "1 VM" : n " VMs"
					printf "%s\n  \"sluice CPU tree/FIFO ≤ NetIOC'"'"'s, %s\": {\"value\": %.4f, \"unit\": \"ratio\"}", sep, name, tree[n] / fifo[n]
					sep = ","
				}
			}
			if (f50 != "" && s50 != "")
				printf "%s\n  \"sluice TCP_RR latency tree − FIFO ≤ NetIOC'"'"'s\": {\"value\": %.2f, \"unit\": \"us\"}", sep, s50 - f50
			print "\n}}"
		}' "$1" "$2"
}

t0=$(date +%s)
for name in "$@"; do
	case $name in
	netioc-fig2) gotest netioc-fig2 "Fig. 2 end to end with DRS (1/10 scale)" TestFig2DRSLive ./livetest/ctllive ;;
	netioc-exp1) gotest netioc-exp1 "Exp. 1, 12 VMs with NFS and vMotion flows" TestExp1 ./livetest/netlive ;;
	netioc-exp3) exp3 ;;
	sioc-test3) gotest sioc-test3 "SIOC Test 3 with QEMU guests (fio)" TestGuestSIOCTest3 ./livetest/virtstorage ;;
	cpu-limit-sweep) gotest cpu-limit-sweep "seed 003 on a QEMU guest" TestSeed003Live ./livetest/cpulive own ;;
	*)
		echo "reproduce-live: unknown $name (netioc-fig2, netioc-exp1, netioc-exp3, sioc-test3, cpu-limit-sweep)" >&2
		exit 2
		;;
	esac
done
echo "live reproductions: $(($(date +%s) - t0)) s"
./scripts/reproduce.sh >/dev/null
echo "report: out/report.md (live sections beside the simulated ones)"
exit $status
