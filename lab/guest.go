package lab

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// A real guest of the lab (or of a live test) boots the host's own kernel
// with a small initramfs built here: busybox-static, the virtio-net and 9p
// modules, and an /init that mounts the host's filesystem read-only over 9p
// as its root (tmpfs on /tmp and /run) and hands over to GuestScript. No
// disk image is built or downloaded; the guest runs the host's programs
// (iperf3, sockperf, fio). See ../shared/lab-vms.md for what was measured.

// GuestModules are the kernel modules a guest needs for virtio-net, a 9p
// root, the guest agent's virtio-serial port and virtio-blk disks (a VM's
// disks, attached over NBD from its host's gateway); their own
// dependencies are loaded first, from modules.dep.
var GuestModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
	"virtio_pci", "failover", "net_failover", "virtio_net", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p",
	"virtio_console", "virtio_blk"}

// GuestRootTag is the 9p mount tag of the host's root filesystem.
const GuestRootTag = "hostroot"

// GuestAgentPort is the name of the guest agent's virtio-serial port.
const GuestAgentPort = "org.qemu.guest_agent.0"

// HostKernel finds the newest /boot/vmlinuz-* whose modules directory
// (/lib/modules/VERSION with modules.dep) exists.
func HostKernel() (vmlinuz, modDir string, err error) {
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Strings(ks)
	for i := len(ks) - 1; i >= 0; i-- {
		ver := strings.TrimPrefix(filepath.Base(ks[i]), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", ver, "modules.dep")); err == nil {
			return ks[i], filepath.Join("/lib/modules", ver), nil
		}
	}
	return "", "", fmt.Errorf("no /boot/vmlinuz-* with its /lib/modules/VERSION/modules.dep: install linux-image-amd64 (scripts/deps.sh)")
}

// GuestKernel returns the kernel a guest boots: the uncompressed PVH copy
// (pvhKernel, in KernelCacheDir) of HostKernel's vmlinuz where one can
// be made, else the vmlinuz itself.
func GuestKernel() (kernel, modDir string, err error) {
	kernel, modDir, err = HostKernel()
	if err != nil {
		return "", "", err
	}
	if pvh, err := pvhKernel(kernel, KernelCacheDir); err == nil {
		kernel = pvh
	}
	return kernel, modDir, nil
}

// moduleOrder returns the .ko paths (relative to modDir) to load for want,
// each after its dependencies.
func moduleOrder(modDir string, want []string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{} // path → dependency paths
	byName := map[string]string{} // module name → path
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		p, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		deps[p] = strings.Fields(rest)
		name := strings.TrimSuffix(filepath.Base(p), ".ko")
		byName[strings.ReplaceAll(name, "-", "_")] = p
	}
	var out []string
	seen := map[string]bool{}
	var add func(p string)
	add = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		d := deps[p]
		for i := len(d) - 1; i >= 0; i-- { // modules.dep lists the nearest last
			add(d[i])
		}
		out = append(out, p)
	}
	for _, m := range want {
		p, ok := byName[m]
		if !ok {
			return nil, fmt.Errorf("module %s not in %s/modules.dep (compressed or built in?)", m, modDir)
		}
		add(p)
	}
	return out, nil
}

// guestInit is the guest's /init: load the modules, mount the host's
// filesystem (9p, read-only) with tmpfs on /tmp and /run, and switch to
// it, running /tmp/sl-guest.sh (GuestScript) with the host's /bin/sh.
const guestInit = `#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /dev /proc /sys /root
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
for m in $($B cat /modules); do $B insmod /$m || echo "sl-guest: insmod $m failed"; done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro ` + GuestRootTag + ` /root || { echo "sl-guest: 9p mount failed"; $B poweroff -f; }
$B mount -t tmpfs tmp /root/tmp
$B mount -t tmpfs run /root/run
$B mount -t sysfs sys /root/sys
$B cp /sl-guest.sh /root/tmp/sl-guest.sh
$B mount --move /dev /root/dev
$B mount --move /proc /root/proc
exec $B switch_root /root /bin/sh /tmp/sl-guest.sh
`

// GuestScript runs as the guest's init on the host's root. It reads its
// settings from the kernel command line:
//
//	sl.net=DEV,[IPv4/LEN],[IPv6/LEN]  one per vNIC, in order (eth0, eth1, …)
//	sl.iperf=PORT                   an iperf3 server (IPv4 and IPv6) on PORT
//	sl.ttl=SECONDS                  power off after that long (0: never)
//
// It starts the host's qemu-guest-agent on the virtio-serial port named
// GuestAgentPort (GuestExec runs commands through it) and says "sl-guest:
// ready" on the console once its servers listen and the agent runs.
const GuestScript = `#!/bin/sh
echo "sl-guest: root up, uptime $(cut -d' ' -f1 /proc/uptime) s"
ip link set lo up
ttl=0 iperf=
for a in $(cat /proc/cmdline); do
  case "$a" in
  sl.net=*)
    old=$IFS; IFS=,; set -- ${a#sl.net=}; IFS=$old
    ip link set "$1" up
    [ -n "$2" ] && ip addr add "$2" dev "$1"
    [ -n "$3" ] && ip -6 addr add "$3" dev "$1" nodad
    ;;
  sl.iperf=*)
    iperf3 -s -p "${a#sl.iperf=}" >/dev/null 2>&1 &
    iperf=1
    ;;
  sl.ttl=*)
    ttl=${a#sl.ttl=}
    ;;
  esac
done
for p in /sys/class/virtio-ports/*; do
  if [ "$(cat "$p/name" 2>/dev/null)" = "` + GuestAgentPort + `" ]; then
    mkdir -p /run/qemu-ga
    qemu-ga -m virtio-serial -p "/dev/${p##*/}" -t /run/qemu-ga -f /run/qemu-ga/pid >/dev/null 2>&1 &
  fi
done
i=0
[ -n "$iperf" ] || i=50 # no server to wait for (a guest with disks only)
while [ $i -lt 50 ] && ! grep -q ' 0A ' /proc/net/tcp6 /proc/net/tcp 2>/dev/null; do sleep 0.1; i=$((i+1)); done
echo "sl-guest: ready, uptime $(cut -d' ' -f1 /proc/uptime) s"
if [ "$ttl" -gt 0 ]; then sleep "$ttl"; else while :; do sleep 3600; done; fi
echo "sl-guest: ttl reached, powering off"
exec /bin/busybox poweroff -f
`

// WriteInitramfs writes the guest's initramfs (a newc cpio archive):
// busybox-static, the modules of modDir, /init and GuestScript.
func WriteInitramfs(path, modDir string) error {
	a, files, err := baseInitramfs(modDir, guestInit)
	if err != nil {
		return err
	}
	for _, d := range parents(files) {
		a.dir(d)
	}
	return os.WriteFile(path, a.bytes(), 0o644)
}

// baseInitramfs is what every guest's initramfs holds: busybox-static,
// /init, GuestScript, the modules of modDir (in load order, listed in
// /modules). It returns the archive and the paths of the files under
// directories that the caller still has to add (parents).
func baseInitramfs(modDir, init string) (*cpio, []string, error) {
	mods, err := moduleOrder(modDir, GuestModules)
	if err != nil {
		return nil, nil, err
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return nil, nil, fmt.Errorf("busybox-static: %w (scripts/deps.sh installs it)", err)
	}
	if !isStatic(bb) {
		return nil, nil, fmt.Errorf("/bin/busybox is not the static build: install busybox-static (scripts/deps.sh)")
	}
	a := &cpio{}
	a.dir("bin")
	a.dir("dev")
	a.node("dev/console", 0o20600, 5, 1)
	a.file("bin/busybox", 0o755, bb)
	a.file("init", 0o755, []byte(init))
	a.file("sl-guest.sh", 0o755, []byte(GuestScript))
	for _, m := range mods {
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return nil, nil, err
		}
		a.file(m, 0o644, b)
	}
	a.file("modules", 0o644, []byte(strings.Join(mods, "\n")+"\n"))
	return a, mods, nil
}

// isStatic tells whether an ELF executable has no program interpreter.
func isStatic(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

func parents(paths []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		for d := filepath.Dir(p); d != "." && !seen[d]; d = filepath.Dir(d) {
			seen[d] = true
			out = append(out, d)
		}
	}
	sort.Strings(out) // parents before children
	return out
}

// cpio is a newc ("070701") archive under construction.
type cpio struct {
	head, body bytes.Buffer
	ino        int
}

func (c *cpio) entry(w *bytes.Buffer, name string, mode, rmaj, rmin int, data []byte) {
	c.ino++
	fmt.Fprintf(w, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	w.WriteString(name + "\x00")
	pad(w)
	w.Write(data)
	pad(w)
}

func pad(w *bytes.Buffer) {
	for w.Len()%4 != 0 {
		w.WriteByte(0)
	}
}

func (c *cpio) dir(name string) { c.entry(&c.head, name, 0o40755, 0, 0, nil) }
func (c *cpio) node(name string, mode, maj, min int) {
	c.entry(&c.head, name, mode, maj, min, nil)
}
func (c *cpio) file(name string, perm int, data []byte) {
	c.entry(&c.body, name, 0o100000|perm, 0, 0, data)
}

// bytes returns the archive: directories and nodes, files, the trailer.
func (c *cpio) bytes() []byte {
	var out bytes.Buffer
	out.Write(c.head.Bytes())
	out.Write(c.body.Bytes())
	c.entry(&out, "TRAILER!!!", 0, 0, 0, nil)
	return out.Bytes()
}
