#!/bin/sh
# Storage gateway overhead: fio 4 KiB random reads, uncongested datastore
# (nbdkit memory plugin, no delay), straight to nbdkit vs through
# `sluice gateway`, at queue depth 1 and 32. As a reference for what any
# NBD proxy costs on the machine (one more loopback hop), the same through
# nbdkit's own nbd plugin (a C proxy on libnbd). Runs alternate ROUNDS
# times; the table shows medians.
#
#   bench/storage-overhead.sh [SECONDS_PER_RUN] [ROUNDS] [SERVICE_TIME]
#
# SERVICE_TIME (e.g. 1ms) adds nbdkit's delay filter with 64 threads: a
# device that is fast but not free, so that the datastore, not the CPU of a
# small test machine, bounds the direct run.
#
# The gateway runs with one P by default (`sluice gateway --cpus 1`: fewer
# thread wake-ups; docs/perf/storage.md); GATEWAY_CPUS=0 measures it with Go's
# default GOMAXPROCS instead.
#
# Needs: go, fio (with the nbd engine), nbdkit. Listens on 127.0.0.1:10909-10911.
set -eu
secs=${1:-10}
rounds=${2:-3}
delay=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
cleanup() { for p in ${gw:-} ${nk:-} ${px:-}; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT INT TERM
for t in fio nbdkit go; do command -v $t >/dev/null || { echo "storage-overhead: $t not found (scripts/deps.sh)" >&2; exit 1; }; done
(cd "$root" && go build -o "$tmp/sluice" ./cmd/sluice)
cat >"$tmp/p.yaml" <<'YAML'
cluster: bench
hosts:
  - {name: h1, cpu: {cores: 2, mhz: 2000}, memory: 4GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - {name: ds1, sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, size: 1GiB}]}
YAML
if [ -n "$delay" ]; then
  nbdkit -f -i 127.0.0.1 -p 10909 -t 64 --filter=delay memory size=2G rdelay="$delay" wdelay="$delay" & nk=$!
else
  nbdkit -f -i 127.0.0.1 -p 10909 -t 16 memory size=2G & nk=$!
fi
# The gateway dials the datastore at start: wait until nbdkit listens.
for i in $(seq 100); do
  fio --name=probe --ioengine=nbd --uri=nbd://127.0.0.1:10909/ --rw=read --bs=4k --size=4k --output-format=terse >/dev/null 2>&1 && break
  sleep 0.1
done
nbdkit -f -i 127.0.0.1 -p 10911 nbd uri=nbd://127.0.0.1:10909 & px=$!
"$tmp/sluice" gateway --cpus "${GATEWAY_CPUS:-1}" --host h1 --policy "$tmp/p.yaml" --datastore ds1=nbd://127.0.0.1:10909 \
  --listen 127.0.0.1:10910 --status-file "$tmp/status.json" 2>"$tmp/gw.log" & gw=$!
for i in $(seq 100); do
  fio --name=probe --ioengine=nbd --uri=nbd://127.0.0.1:10910/vm1/disk0 --rw=read --bs=4k --size=4k --output-format=terse >/dev/null 2>&1 && break
  sleep 0.1
done
# Prefill so reads hit allocated pages in both paths.
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:10910/vm1/disk0 --rw=write --bs=1M --size=1G --output-format=terse >/dev/null
run() { # uri qd -> "iops p50_us"
  fio --name=r --ioengine=nbd --uri="$1" --rw=randread --bs=4k --iodepth="$2" --size=1G \
      --time_based --runtime="$secs" --ramp_time=1 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; s=sys.stdin.read(); j=json.loads(s[s.index("{"):])["jobs"][0]["read"]; print("%.0f %.1f" % (j["iops"], j["clat_ns"]["percentile"]["50.000000"]/1000))'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "| qd | direct IOPS | gateway IOPS | gateway/direct | direct p50 µs | gateway p50 µs | added p50 µs | nbdkit-proxy IOPS | proxy/direct | proxy added p50 µs |"
echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for qd in 1 32; do
  : >"$tmp/d"; : >"$tmp/g"; : >"$tmp/x"
  for r in $(seq "$rounds"); do
    run "nbd://127.0.0.1:10909/" "$qd" >>"$tmp/d"
    run "nbd://127.0.0.1:10910/vm1/disk0" "$qd" >>"$tmp/g"
    run "nbd://127.0.0.1:10911/" "$qd" >>"$tmp/x"
  done
  di=$(cut -d' ' -f1 "$tmp/d" | median); dp=$(cut -d' ' -f2 "$tmp/d" | median)
  gi=$(cut -d' ' -f1 "$tmp/g" | median); gp=$(cut -d' ' -f2 "$tmp/g" | median)
  xi=$(cut -d' ' -f1 "$tmp/x" | median); xp=$(cut -d' ' -f2 "$tmp/x" | median)
  awk -v qd="$qd" -v di="$di" -v gi="$gi" -v dp="$dp" -v gp="$gp" -v xi="$xi" -v xp="$xp" \
    'BEGIN { printf "| %d | %d | %d | %.0f%% | %.1f | %.1f | %.1f | %d | %.0f%% | %.1f |\n", qd, di, gi, 100*gi/di, dp, gp, gp-dp, xi, 100*xi/di, xp-dp }'
done
