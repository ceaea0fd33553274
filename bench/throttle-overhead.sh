#!/bin/sh
# The throttle driver's overhead with QEMU as the client: fio inside a lab
# TCG guest (4 KiB random reads, direct I/O, libaio) at queue depths 1 and
# 32, on a disk of a throttle-driver datastore with no sluice (no
# throttle), with QEMU's throttle alone (set once, no driver running) and
# with the throttle driver running (a throttle QEMU applies, above what
# the disk does), and on a disk of a gateway datastore (QEMU →
# sluice gateway → nbdkit); both datastores the same emulated array (64
# slots × SERVICE_TIME). The four alternate, ROUNDS times; the table shows
# medians of fio's IOPS, p50 and p99 (livetest/throttlelive,
# TestThrottleOverhead, build tag qemubench).
#
#   bench/throttle-overhead.sh [SECONDS_PER_RUN] [ROUNDS] [SERVICE_TIME]
#
# PERDISK=1 adds "per-disk": the driver reading the counters as before
# 4e50f67 (two virDomainBlockStatsFlags calls per disk a period), to
# compare with "throttle" in one run.
#
# Defaults: 10 s, 1 round, 1ms. Needs root, libvirtd, nbdkit, fio,
# qemu-img, qemu-guest-agent (scripts/deps.sh).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log="${TMPDIR:-/tmp}/throttle-overhead.log"
SECONDS=${1:-10} ROUNDS=${2:-1} SERVICE_TIME=${3:-1ms} \
	go test -tags qemubench -run '^TestThrottleOverhead$' -count=1 -v -timeout 60m ./livetest/throttlelive >"$log" 2>&1 || {
	cat "$log" >&2
	exit 1
}
sed -n '/^fio in a TCG guest/,/^32  *gateway/p' "$log"
grep 'round ' "$log" | sed 's/^ *overhead_bench_test.go:[0-9]*: /  /'
