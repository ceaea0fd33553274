#!/usr/bin/env bash
# Installs what sluice's tests and demo need, when it is missing: the Debian
# packages of the live lab (iproute2, iperf3, sockperf, fio, nbdkit, etcd;
# tmux for sluice top's test, dpkg-deb for the package's, chromium for the web
# console's test, ethtool as the oracle of package nicinfo's test),
# libvirt and QEMU for real guests (shared/lab-vms.md: the packages, the
# users, groups and directories libvirtd needs, its qemu.conf, and the
# daemons started when none runs: there is no systemd here), and the Go
# modules. Safe to run again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pair in ip:iproute2 iperf3:iperf3 sockperf:sockperf fio:fio nbdkit:nbdkit \
            etcd:etcd-server etcdctl:etcd-client nbdinfo:libnbd-bin tc:iproute2 \
            tmux:tmux curl:curl dpkg-deb:dpkg chromium:chromium ethtool:ethtool; do
	bin=${pair%%:*} pkg=${pair#*:}
	command -v "$bin" >/dev/null 2>&1 || need+=("$pkg")
done
# Real guests (livetest/virtlive): QEMU under libvirtd, booting Debian's
# kernel from an initramfs made of busybox-static and the kernel's modules;
# the guests run the host's qemu-guest-agent, through which the lab runs
# commands inside them (lab.GuestExec); qemu-img (qemu-utils) makes the
# throttle driver tests' qcow2 disks.
for pkg in qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients \
           linux-image-amd64 busybox-static qemu-guest-agent qemu-utils; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ "$(id -u)" != 0 ]; then
	if [ ${#need[@]} -gt 0 ]; then
		echo "deps: missing ${need[*]} and not root: install them first" >&2
		exit 1
	fi
	go mod download
	exit 0
fi
if [ ${#need[@]} -gt 0 ]; then
	echo "deps: installing ${need[*]}"
	apt-get update -qq >/dev/null || apt-get update
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# libvirtd: what the -daemon-system package (and systemd) would have made.
for g in kvm libvirt libvirt-qemu; do
	getent group "$g" >/dev/null || groupadd --system "$g"
done
getent passwd libvirt-qemu >/dev/null ||
	useradd --system -g libvirt-qemu -G kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/cache/libvirt/qemu /var/run/libvirt
# Guests run as root without a security driver or mount namespaces: this
# machine is itself a container-like guest (shared/lab-vms.md).
conf=/etc/libvirt/qemu.conf
touch "$conf"
setconf() { # key value: replace an uncommented setting or append it
	if grep -Eq "^[[:space:]]*$1[[:space:]]*=" "$conf"; then
		sed -i -E "s|^[[:space:]]*$1[[:space:]]*=.*|$1 = $2|" "$conf"
	else
		echo "$1 = $2" >>"$conf"
	fi
}
setconf user '"root"'
setconf group '"root"'
setconf security_driver '"none"'
setconf namespaces '[ ]'
pgrep -x virtlogd >/dev/null || virtlogd -d
if ! pgrep -x libvirtd >/dev/null; then
	libvirtd -d
	for _ in $(seq 50); do
		[ -S /var/run/libvirt/libvirt-sock ] && break
		sleep 0.2
	done
fi
[ -S /var/run/libvirt/libvirt-sock ] || { echo "deps: libvirtd started but /var/run/libvirt/libvirt-sock is missing" >&2; exit 1; }
go mod download
