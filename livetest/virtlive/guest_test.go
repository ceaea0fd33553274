package virtlive

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// guestModules are the kernel modules a guest needs for virtio-net and a 9p
// root, in the order shared/lab-vms.md gives; their own dependencies are
// loaded first from modules.dep.
var guestModules = []string{"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
	"virtio_pci", "failover", "net_failover", "virtio_net", "netfs", "fscache", "9pnet", "9pnet_virtio", "9p"}

// guestKernel finds the host's Debian kernel and its modules directory; the
// test fails with the reason when either is missing.
func guestKernel(t *testing.T) (vmlinuz, modDir string) {
	t.Helper()
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	sort.Strings(ks)
	for i := len(ks) - 1; i >= 0; i-- {
		ver := strings.TrimPrefix(filepath.Base(ks[i]), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", ver, "modules.dep")); err == nil {
			return ks[i], filepath.Join("/lib/modules", ver)
		}
	}
	t.Fatalf("no /boot/vmlinuz-* with its /lib/modules/VERSION/modules.dep: install linux-image-amd64 (scripts/deps.sh)")
	return "", ""
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
// filesystem (9p, read-only) with a tmpfs on /tmp, switch to it and say so
// on the serial console, then idle; it powers off after 3 minutes, so that
// a test killed before its cleanup leaves no guest running for long.
const guestInit = `#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /dev /proc /sys /root
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
for m in $($B cat /modules); do $B insmod /$m || echo "sl-virtlive: insmod $m failed"; done
echo "sl-virtlive: modules loaded"
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro hostroot /root || { echo "sl-virtlive: 9p mount failed"; exec $B sh; }
$B mount -t tmpfs tmp /root/tmp
$B mount -t tmpfs run /root/run
$B mount --move /dev /root/dev
$B mount --move /proc /root/proc
exec $B switch_root /root /bin/sh -c 'echo "sl-virtlive: root up, uptime $(cut -d" " -f1 /proc/uptime) s"; sleep 180; exec /bin/busybox poweroff -f'
`

// writeInitramfs writes a newc cpio archive: busybox-static, the modules,
// /init and /dev/console.
func writeInitramfs(path, modDir string) error {
	mods, err := moduleOrder(modDir, guestModules)
	if err != nil {
		return err
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("busybox-static: %w (scripts/deps.sh installs it)", err)
	}
	if !isStatic(bb) {
		return fmt.Errorf("/bin/busybox is not the static build: install busybox-static (scripts/deps.sh)")
	}
	var a cpio
	a.dir("bin")
	a.dir("dev")
	a.node("dev/console", 0o20600, 5, 1)
	a.file("bin/busybox", 0o755, bb)
	a.file("init", 0o755, []byte(guestInit))
	var list []string
	for _, m := range mods {
		b, err := os.ReadFile(filepath.Join(modDir, m))
		if err != nil {
			return err
		}
		a.file(m, 0o644, b)
		list = append(list, m)
	}
	for _, d := range parents(mods) {
		a.dir(d)
	}
	a.file("modules", 0o644, []byte(strings.Join(list, "\n")+"\n"))
	return os.WriteFile(path, a.bytes(), 0o644)
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
