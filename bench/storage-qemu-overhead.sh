#!/bin/sh
# Storage gateway overhead with QEMU as the client: fio inside a lab TCG
# guest (4 KiB random reads, direct I/O, libaio) at queue depths 1 and 32,
# on the guest's disk through the gateway (QEMU → Unix socket → sluice
# gateway → TCP → nbdkit) and on a second disk straight to a twin of the
# datastore (QEMU → TCP → nbdkit, same nbdkit arguments), alternating,
# ROUNDS times; the table shows medians (livetest/virtstorage,
# TestQEMUOverhead, build tag qemubench).
#
#   bench/storage-qemu-overhead.sh [SECONDS_PER_RUN] [ROUNDS] [SERVICE_TIME]
#
# SERVICE_TIME (e.g. 1ms) makes the datastore an array of 64 slots of that
# service time; default the policy's default array (8 slots × 5 ms, 1600
# IOPS). Needs root, libvirtd, nbdkit, fio,
# qemu-guest-agent (scripts/deps.sh). Listens on 127.0.0.1:10990.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
SECONDS=${1:-10} ROUNDS=${2:-3} SERVICE_TIME=${3:-} \
	go test -tags qemubench -run '^TestQEMUOverhead$' -count=1 -v -timeout 60m ./livetest/virtstorage >"${TMPDIR:-/tmp}/storage-qemu-overhead.log" 2>&1 || {
	cat "${TMPDIR:-/tmp}/storage-qemu-overhead.log" >&2
	exit 1
}
sed -n '/^fio in a TCG guest/,/^[0-9]/p; /^32 /p' "${TMPDIR:-/tmp}/storage-qemu-overhead.log" | uniq
grep 'round ' "${TMPDIR:-/tmp}/storage-qemu-overhead.log" | sed 's/^ *overhead_bench_test.go:[0-9]*: /  /'
