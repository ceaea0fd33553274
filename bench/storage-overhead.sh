#!/bin/sh
# Storage gateway overhead: fio 4 KiB random reads, uncongested datastore
# (nbdkit file plugin on a tmpfs directory of volumes, no delay), straight to nbdkit vs through
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
# GATEWAY_POLLS="0 50us" runs one gateway per --poll value, interleaved with
# the others in every round (before/after in the same run); an entry
# LABEL=BINARY runs another build of sluice (SLUICE=BINARY replaces the
# build of this tree) (e.g. before=/tmp/sluice-old)
# with its default flags, shown as gw-poll-LABEL; PROXY=0 leaves
# out the nbdkit proxy. This tree's build serves TCP only with TLS
# (docs/storage.md, "TLS"), which fio cannot use here: it runs on a Unix
# socket, shown as gw-unix-poll-VALUE. For other builds (LABEL=BINARY),
# GATEWAY_UNIX=1 also runs, per --poll value, a
# gateway listening on a Unix socket (`--listen unix:PATH`, fio's
# nbd+unix URI), shown as gw-unix-poll-VALUE beside the TCP one: the VM's
# leg without the TCP/IP stack, as for a VM on the gateway's host (the
# datastore leg stays TCP, and direct stays fio → nbdkit over TCP). CPU µs/IO: utime+stime of the process
# (/proc/PID/stat) over the fio run, ramp included, per I/O.
#
# HALTPOLL_NS=N sets the guest's idle polling for the run (a KVM guest with
# the cpuidle-haltpoll driver, as the development VM: its
# /sys/module/haltpoll/parameters/guest_halt_poll_ns, root) and restores it
# at exit: an idle vCPU polls up to N ns before it halts, so waking a
# sleeping process costs about what it costs on a host with shallow C-states
# instead of a VM exit and an IPI (docs/perf/storage.md, "wake-ups").
#
# Needs: go, fio (with the nbd engine), nbdkit. Listens on 127.0.0.1:10909,
# 10911 and 10920-, and on Unix sockets in a temporary directory.
set -euf # no globbing: URIs hold "?"
secs=${1:-10}
rounds=${2:-3}
delay=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
ds=$(mktemp -d /dev/shm/sluice-bench.XXXXXX) # the datastore's volumes, in memory
hp=/sys/module/haltpoll/parameters/guest_halt_poll_ns
cleanup() {
  for p in ${gw:-} ${nk:-} ${px:-}; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$tmp" "$ds"
  [ -z "${hp0:-}" ] || echo "$hp0" >"$hp"
}
trap cleanup EXIT INT TERM
if [ -n "${HALTPOLL_NS:-}" ]; then
  [ -w "$hp" ] || { echo "storage-overhead: HALTPOLL_NS needs the cpuidle-haltpoll driver and root ($hp)" >&2; exit 1; }
  hp0=$(cat "$hp"); echo "$HALTPOLL_NS" >"$hp"
fi
for t in fio nbdkit go; do command -v $t >/dev/null || { echo "storage-overhead: $t not found (scripts/deps.sh)" >&2; exit 1; }; done
if [ -n "${SLUICE:-}" ]; then cp "$SLUICE" "$tmp/sluice"; else (cd "$root" && go build -o "$tmp/sluice" ./cmd/sluice); fi
cat >"$tmp/p.yaml" <<'YAML'
cluster: bench
hosts:
  - {name: h1, cpu: {cores: 2, mhz: 2000}, memory: 4GiB, uplinks: [{name: vmnic0, speed: 10Gbps}]}
datastores:
  - {name: ds1, sioc: {enabled: true, congestionThreshold: 30ms, controlPeriod: 1s}}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 1}, memory: 1GiB, disks: [{name: disk0, datastore: ds1, size: 1GiB}]}
YAML
# The datastore: vm1's volume (and the stats volume) in a tmpfs directory,
# one export per file.
"$tmp/sluice" datastore create --policy "$tmp/p.yaml" ds1="$ds" >/dev/null
vol=vm1+disk0.img
if [ -n "$delay" ]; then
  nbdkit -f -i 127.0.0.1 -p 10909 -t 64 --filter=delay file dir="$ds" rdelay="$delay" wdelay="$delay" & nk=$!
else
  nbdkit -f -i 127.0.0.1 -p 10909 -t 16 file dir="$ds" & nk=$!
fi
# The gateway dials the datastore at start: wait until nbdkit listens.
for i in $(seq 100); do
  fio --name=probe --ioengine=nbd --uri=nbd://127.0.0.1:10909/$vol --rw=read --bs=4k --size=4k --output-format=terse >/dev/null 2>&1 && break
  sleep 0.1
done
# Prefill the whole volume so reads hit allocated pages in every path.
fio --name=fill --ioengine=nbd --uri=nbd://127.0.0.1:10909/$vol --rw=write --bs=1M --iodepth=16 --size=1G --output-format=terse >/dev/null
[ "${PROXY:-1}" = 0 ] || { nbdkit -f -i 127.0.0.1 -p 10911 nbd uri=nbd://127.0.0.1:10909/$vol & px=$!; }
# One gateway per value of GATEWAY_POLLS (its --poll), on ports 10920, 10921, …;
# "default" runs it with its default --poll.
polls=${GATEWAY_POLLS:-default}
i=0; gws=""; targets="direct:nbd://127.0.0.1:10909/$vol"
for pl in $polls; do
  port=$((10920 + i))
  bin="$tmp/sluice"; pf=""
  case $pl in
  *=*) bin=${pl#*=}; pl=${pl%%=*} ;; # LABEL=BINARY: another build, its defaults
  default) ;;
  *) pf="--poll $pl" ;;
  esac
  # shellcheck disable=SC2086
  listens="tcp"
  [ "${GATEWAY_UNIX:-0}" = 1 ] && listens="tcp unix"
  # This tree's gateway serves TCP only with TLS, and fio's nbd engine
  # (libnbd) takes client certificates only from /etc/pki/libnbd when root
  # (not ?tls-certificates=): its runs here are over the Unix socket.
  [ "$bin" = "$tmp/sluice" ] && listens="unix" && pf="$pf --socket-dir none" # one gateway per value: no per-VM sockets (they would collide)
  for ln in $listens; do
    if [ "$ln" = unix ]; then
      name=gw-unix-poll-$pl; la="unix:$tmp/gw$i.sock"; uri="nbd+unix:///vm1/disk0?socket=$tmp/gw$i.sock"
    else
      name=gw-poll-$pl; la="127.0.0.1:$port"; uri="nbd://127.0.0.1:$port/vm1/disk0"
    fi
    # shellcheck disable=SC2086
    "$bin" gateway --cpus "${GATEWAY_CPUS:-1}" $pf --host h1 --policy "$tmp/p.yaml" --datastore ds1=nbd://127.0.0.1:10909 \
      --listen "$la" --status-file "$tmp/status$i.json" 2>"$tmp/gw$i.log" & pid=$!
    gws="$gws $pid"; gw="${gw:-} $pid"
    echo "$pid" >"$tmp/pid.$name"
    targets="$targets $name:$uri"
    for j in $(seq 100); do
      fio --name=probe --ioengine=nbd --uri="$uri" --rw=read --bs=4k --size=4k --output-format=terse >/dev/null 2>&1 && break
      sleep 0.1
    done
    i=$((i + 1))
  done
done
[ "${PROXY:-1}" = 0 ] || targets="$targets nbdkit-proxy:nbd://127.0.0.1:10911/"
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # clock ticks of utime+stime
hz=$(getconf CLK_TCK)
run() { # name uri qd -> "iops p50_us gw_cpu_us_per_io nbdkit_cpu_us_per_io"
  gp=""; [ -f "$tmp/pid.$1" ] && gp=$(cat "$tmp/pid.$1")
  g0=0; [ -n "$gp" ] && g0=$(cpu "$gp"); n0=$(cpu "$nk")
  fio --name=r --ioengine=nbd --uri="$2" --rw=randread --bs=4k --iodepth="$3" --size=1G \
      --time_based --runtime="$secs" --ramp_time=1 --output-format=json 2>/dev/null >"$tmp/out.json"
  g1=0; [ -n "$gp" ] && g1=$(cpu "$gp"); n1=$(cpu "$nk")
  python3 - "$tmp/out.json" "$secs" "$hz" "$g0" "$g1" "$n0" "$n1" <<'PY'
import json, sys
s = open(sys.argv[1]).read()
j = json.loads(s[s.index("{"):])["jobs"][0]["read"]
secs, hz = float(sys.argv[2]) + 1, float(sys.argv[3])  # ramp included in the CPU window
g0, g1, n0, n1 = (float(x) for x in sys.argv[4:8])
ios = j["iops"] * secs
print("%.0f %.1f %.2f %.2f" % (j["iops"], j["clat_ns"]["percentile"]["50.000000"] / 1000,
      (g1 - g0) / hz * 1e6 / ios, (n1 - n0) / hz * 1e6 / ios))
PY
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
stamp() { echo "$1 $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)${HALTPOLL_NS:+, guest_halt_poll_ns $HALTPOLL_NS}"; }
stamp "start:"
echo
echo "| qd | path | IOPS | of direct | p50 µs | added p50 µs | gateway CPU µs/IO | nbdkit CPU µs/IO |"
echo "|---:|---|---:|---:|---:|---:|---:|---:|"
for qd in 1 32; do
  for t in $targets; do : >"$tmp/res.${t%%:*}"; done
  for r in $(seq "$rounds"); do
    for t in $targets; do run "${t%%:*}" "${t#*:}" "$qd" >>"$tmp/res.${t%%:*}"; done
  done
  di=$(cut -d' ' -f1 "$tmp/res.direct" | median); dp=$(cut -d' ' -f2 "$tmp/res.direct" | median)
  for t in $targets; do
    f="$tmp/res.${t%%:*}"
    awk -v qd="$qd" -v name="${t%%:*}" -v di="$di" -v dp="$dp" -v i="$(cut -d' ' -f1 "$f" | median)" \
      -v p="$(cut -d' ' -f2 "$f" | median)" -v gc="$(cut -d' ' -f3 "$f" | median)" -v nc="$(cut -d' ' -f4 "$f" | median)" \
      'BEGIN { printf "| %d | %s | %d | %.0f%% | %.1f | %.1f | %s | %.2f |\n", qd, name, i, 100*i/di, p, p-dp, (name ~ /^gw/ ? sprintf("%.2f", gc) : "-"), nc }'
  done
done
echo
stamp "end:"
