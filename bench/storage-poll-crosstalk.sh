#!/bin/sh
# Does one VM's traffic slow another's through the gateway? vm1 runs fio
# 4 KiB random reads at queue depth 1 flat out, vm2 a light load (200 IOPS,
# queue depth 1) on the same gateway; the table shows vm2's latency and
# vm1's IOPS for --poll 0 and 50us, with --cpus 1 and 2 (memory-speed
# nbdkit datastore). While a goroutine busy-polls a socket, Go's scheduler
# does not look at the other sockets, so a poller can hide vm2's requests
# (docs/perf/storage.md).
#
#   bench/storage-poll-crosstalk.sh [SECONDS]
#
# SLUICE=BINARY uses that build instead of building this tree. Needs go,
# fio (nbd engine), nbdkit. Listens on 127.0.0.1:10909 (nbdkit) and on a
# Unix socket (the gateway: TCP needs TLS, which fio cannot use here).
set -euf
secs=${1:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
ds=$(mktemp -d /dev/shm/sluice-bench.XXXXXX) # the datastore's volumes, in memory
cleanup() { for p in ${pids:-}; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp" "$ds"; }
trap cleanup EXIT INT TERM
for t in fio nbdkit go; do command -v $t >/dev/null || { echo "storage-poll-crosstalk: $t not found (scripts/deps.sh)" >&2; exit 1; }; done
bin=$tmp/sluice
if [ -n "${SLUICE:-}" ]; then cp "$SLUICE" "$bin"; else (cd "$root" && go build -o "$bin" ./cmd/sluice); fi
cat >"$tmp/p.yaml" <<'YAML'
cluster: bench
hosts:
  - {name: h1, cpu: {cores: 2, mhz: 2000}, memory: 4GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - {name: ds1, sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, size: 1GiB}]}
  - {name: vm2, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, size: 1GiB}]}
YAML
"$bin" datastore create --policy "$tmp/p.yaml" ds1="$ds" >/dev/null
nbdkit -f -i 127.0.0.1 -p 10909 -t 16 file dir="$ds" & pids=$!
for vol in vm1+disk0.img vm2+disk0.img; do
  for i in $(seq 100); do fio --name=probe --ioengine=nbd --uri=nbd://127.0.0.1:10909/$vol --rw=read --bs=4k --size=4k --output-format=terse >/dev/null 2>&1 && break; sleep 0.1; done
  fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:10909/$vol --rw=write --bs=1M --iodepth=16 --size=1G --output-format=terse >/dev/null
done
echo "start: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| --cpus | --poll | vm2 p50 µs | vm2 p99 µs | vm2 max µs | vm1 IOPS |"
echo "|---:|---:|---:|---:|---:|---:|"
for cpus in 1 2; do
for pl in 0 50us; do
  "$bin" gateway --cpus $cpus --poll $pl --host h1 --policy "$tmp/p.yaml" --datastore ds1=nbd://127.0.0.1:10909 --listen unix:"$tmp/gw.sock" --status-file "$tmp/st.json" 2>"$tmp/gw.log" & g=$!
  pids="$pids $g"
  for i in $(seq 100); do fio --name=probe --ioengine=nbd --uri="nbd+unix:///vm1/disk0?socket=$tmp/gw.sock" --rw=read --bs=4k --size=4k --output-format=terse >/dev/null 2>&1 && break; sleep 0.1; done
  fio --name=busy --ioengine=nbd --uri="nbd+unix:///vm1/disk0?socket=$tmp/gw.sock" --rw=randread --bs=4k --iodepth=1 --size=1G --time_based --runtime=$((secs+2)) --output-format=json >"$tmp/busy.json" 2>/dev/null & b=$!
  sleep 1
  fio --name=light --ioengine=nbd --uri="nbd+unix:///vm2/disk0?socket=$tmp/gw.sock" --rw=randread --bs=4k --iodepth=1 --rate_iops=200 --size=1G --time_based --runtime=$secs --output-format=json >"$tmp/light.json" 2>/dev/null
  wait $b
  kill $g; wait $g 2>/dev/null || true
  python3 - "$tmp/light.json" "$tmp/busy.json" $cpus $pl <<'PY'
import json, sys
def load(f):
    s = open(f).read(); return json.loads(s[s.index("{"):])["jobs"][0]["read"]
l, b = load(sys.argv[1]), load(sys.argv[2])
p = l["clat_ns"]["percentile"]
print("| %s | %s | %.1f | %.1f | %.1f | %.0f |" % (sys.argv[3], sys.argv[4], p["50.000000"]/1e3, p["99.000000"]/1e3, l["clat_ns"]["max"]/1e3, b["iops"]))
PY
done
done
echo
echo "end: $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
