#!/usr/bin/env bash
# Installs what sluice's tests and demo need, when it is missing: the Debian
# packages of the live lab (iproute2, iperf3, sockperf, fio, nbdkit, etcd) and
# the Go modules. Safe to run again.
set -euo pipefail
need=()
for pair in ip:iproute2 iperf3:iperf3 sockperf:sockperf fio:fio nbdkit:nbdkit \
            etcd:etcd-server etcdctl:etcd-client nbdinfo:libnbd-bin tc:iproute2; do
	bin=${pair%%:*} pkg=${pair#*:}
	command -v "$bin" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "deps: missing ${need[*]} and not root: install them first" >&2
		exit 1
	fi
	echo "deps: installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >/dev/null || apt-get update
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
go mod download
