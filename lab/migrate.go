package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"sluice/policy"
	"sluice/virt"
)

// A QEMU guest of the lab migrates live between lab hosts with libvirt,
// as on real hosts. libvirt refuses to migrate a domain to the libvirtd
// it runs under (same host UUID), so each destination host gets its own
// libvirtd (started on the first migration to it): a second libvirtd of
// the machine in the host's network namespace and in a mount namespace of
// its own, where its configuration (/etc/libvirt, with its own
// host_uuid), sockets (/run/libvirt), state (/var/lib/libvirt), cache and
// logs are bind mounts of HostLibvirtDir. Its socket is then
// HostLibvirtDir/run/libvirt-sock; the machine's libvirtd reaches it as
// HostLibvirtURI. The migration is peer to peer; the source's QEMU sends
// the guest's memory to the destination's over a Unix socket in
// HostLibvirtDir (both see it; no TCP port between the namespaces). The
// guest's XML on the destination
// puts each vNIC on the destination host's bridge of its uplink
// (<interface type='bridge'>, the tap named HostDev): the destination's
// libvirtd creates the tap in the host's namespace and plugs it before
// the guest runs there, the source's tap goes with the source's QEMU.
//
// QEMU refuses to migrate a guest that has the host's root mounted over
// 9p, so a guest that migrates boots without it (Options.Migratable):
// its initramfs (WriteMigratableInitramfs) carries busybox, the host's
// iperf3, ip and dash with their libraries, and runs GuestScript from
// there.
// Such a guest serves iperf3 but has no fio, sockperf or guest agent.

// MigratableTools are the host programs a migratable guest carries (with
// the shared libraries ldd lists for them).
var MigratableTools = []string{"iperf3", "ip", "dash"}

// migInit is a migratable guest's /init: the initramfs is its root. The
// host's dash runs GuestScript (busybox's sh would run its own applets,
// such as its ip, before the host programs on PATH).
const migInit = `#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /dev /proc /sys /tmp /run /sbin /usr/bin /usr/sbin
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B --install -s
for m in $($B cat /modules); do $B insmod /$m || echo "sl-guest: insmod $m failed"; done
export PATH=/opt/sl/bin:/bin:/sbin:/usr/bin:/usr/sbin
exec /opt/sl/bin/dash /sl-guest.sh
`

// WriteMigratableInitramfs writes the initramfs of a guest that migrates:
// busybox-static, the modules of modDir, the host's MigratableTools in
// /opt/sl/bin with their shared libraries at their host paths, /init
// (no 9p root) and GuestScript.
func WriteMigratableInitramfs(path, modDir string) error {
	a, files, err := baseInitramfs(modDir, migInit)
	if err != nil {
		return err
	}
	libs := map[string]bool{}
	for _, tool := range MigratableTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			return fmt.Errorf("a migratable guest carries the host's %s: %w", tool, err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		a.file("opt/sl/bin/"+tool, 0o755, b)
		files = append(files, "opt/sl/bin/"+tool)
		ls, err := sharedLibs(p)
		if err != nil {
			return err
		}
		for _, l := range ls {
			libs[l] = true
		}
	}
	for l := range libs {
		b, err := os.ReadFile(l) // follows the symlink: the file under the link's name
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(l, "/")
		a.file(rel, 0o755, b)
		files = append(files, rel)
	}
	for _, d := range parents(files) {
		a.dir(d)
	}
	return os.WriteFile(path, a.bytes(), 0o644)
}

// sharedLibs lists the absolute paths of the shared libraries (and the
// program interpreter) that ldd says bin loads.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// migratableInitrd writes the cluster's migratable initramfs and returns
// its path.
func migratableInitrd(stateDir, cluster, modDir string) (string, error) {
	p := filepath.Join(stateDirOr(stateDir), "lab-"+cluster+"-initrd-mig")
	if err := WriteMigratableInitramfs(p, modDir); err != nil {
		return "", fmt.Errorf("lab: migratable guest initramfs: %w", err)
	}
	return p, nil
}

// HostLibvirtDir is where the lab host's own libvirtd of cluster keeps
// its configuration, sockets, state and logs.
func HostLibvirtDir(cluster, host string) string {
	return filepath.Join(DefaultStateDir, "lab-"+cluster+"-libvirt-"+host)
}

// HostLibvirtURI is the URI of the lab host's own libvirtd.
func HostLibvirtURI(cluster, host string) string {
	return "qemu+unix:///system?socket=" + filepath.Join(HostLibvirtDir(cluster, host), "run", "libvirt-sock")
}

// systemURI is the machine's libvirtd, where the lab starts its guests.
var systemURI = "qemu+unix:///system?socket=" + virt.DefaultSocket

// hostLibvirtdTimeout bounds the start of a host's libvirtd (measured:
// about 1 s).
const hostLibvirtdTimeout = 30 * time.Second

// hostQemuConf is the QEMU driver's configuration of a host's libvirtd:
// as the machine's (../shared/lab-vms.md), with the guests' output in
// files (no virtlogd of its own).
const hostQemuConf = `user = "root"
group = "root"
security_driver = "none"
namespaces = [ ]
stdio_handler = "file"
`

// bindDirs are the directories of libvirtd a host's libvirtd has of its
// own (bind mounts of the same names under HostLibvirtDir).
var bindDirs = []struct{ sub, at string }{
	{"etc", "/etc/libvirt"}, {"run", "/run/libvirt"}, {"lib", "/var/lib/libvirt"},
	{"cache", "/var/cache/libvirt"}, {"log", "/var/log/libvirt"},
}

// StartHostLibvirtd starts the own libvirtd of lab host host (in its
// namespace) unless it runs, and returns its URI.
func (pl *Plan) StartHostLibvirtd(host string) (string, error) {
	h := pl.Host(host)
	if h == nil {
		return "", fmt.Errorf("lab: no host %q", host)
	}
	uri := HostLibvirtURI(pl.Cluster, host)
	if c, err := virt.DialURI(uri); err == nil {
		c.Close()
		return uri, nil
	}
	if _, err := exec.LookPath("libvirtd"); err != nil {
		return "", fmt.Errorf("lab: a guest's migration needs libvirtd: %w (scripts/deps.sh installs it)", err)
	}
	dir := HostLibvirtDir(pl.Cluster, host)
	script := ""
	for _, b := range bindDirs {
		if err := os.MkdirAll(filepath.Join(dir, b.sub), 0o755); err != nil {
			return "", err
		}
		script += fmt.Sprintf("mount --bind %s %s && ", filepath.Join(dir, b.sub), b.at)
	}
	uuid, err := os.ReadFile("/proc/sys/kernel/random/uuid")
	if err != nil {
		return "", err
	}
	conf := filepath.Join(dir, "etc", "libvirtd.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("host_uuid = %q\n", strings.TrimSpace(string(uuid)))), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "qemu.conf"), []byte(hostQemuConf), 0o644); err != nil {
		return "", err
	}
	logf, err := os.OpenFile(filepath.Join(dir, "libvirtd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	defer logf.Close()
	pidFile := filepath.Join(dir, "libvirtd.pid")
	script += "exec libvirtd --config " + conf + " --pid-file " + pidFile
	cmd := exec.Command("nsenter", "--net="+filepath.Join(netnsDir, h.Name), "--",
		"unshare", "--mount", "--propagation", "private", "sh", "-c", script)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("lab: start libvirtd of host %s: %w", host, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(hostLibvirtdTimeout)
	for {
		c, err := virt.DialURI(uri)
		if err == nil {
			c.Close()
			return uri, nil
		}
		select {
		case werr := <-exited:
			return "", fmt.Errorf("lab: libvirtd of host %s exited (%v); its log: %s", host, werr, filepath.Join(dir, "libvirtd.log"))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("lab: libvirtd of host %s does not answer after %v: %v (log %s)", host, hostLibvirtdTimeout, err, filepath.Join(dir, "libvirtd.log"))
		}
	}
}

// guestURI returns the URI of the libvirtd that runs vm's domain: the
// own libvirtd of the host its tap is on, else the machine's.
func (pl *Plan) guestURI(name, host string) (string, error) {
	for _, uri := range []string{HostLibvirtURI(pl.Cluster, host), systemURI} {
		c, err := virt.DialURI(uri)
		if err != nil {
			continue
		}
		a, err := c.Active(name)
		c.Close()
		if err == nil && a {
			return uri, nil
		}
	}
	return "", fmt.Errorf("lab: domain %s runs neither under the libvirtd of host %s nor under the machine's", name, host)
}

var ifaceRE = regexp.MustCompile(`(?s)<interface type='[a-z]+'>.*?</interface>`)
var macRE = regexp.MustCompile(`<mac address='([0-9a-fA-F:]+)'/>`)
var sourceTargetRE = regexp.MustCompile(`(?m)^\s*<(source|target) [^>]*/>\n`)

// destXML is the domain XML x (libvirt's migratable XML) with the vNICs
// of v on the bridges of host to: each <interface> whose MAC is a vNIC's
// becomes type='bridge' on that bridge with the tap named HostDev.
func (pl *Plan) destXML(x string, v *VMPlan, to *HostPlan) (string, error) {
	seen := 0
	out := ifaceRE.ReplaceAllStringFunc(x, func(block string) string {
		m := macRE.FindStringSubmatch(block)
		if m == nil {
			return block
		}
		for _, n := range v.NICs {
			if !strings.EqualFold(n.MAC, m[1]) {
				continue
			}
			br := to.Uplinks[0].Bridge
			for _, u := range to.Uplinks {
				if u.Name == n.Uplink {
					br = u.Bridge
				}
			}
			seen++
			b := sourceTargetRE.ReplaceAllString(block, "")
			b = b[strings.Index(b, ">")+1:]
			return fmt.Sprintf("<interface type='bridge'>\n      <source bridge='%s'/>\n      <target dev='%s'/>", br, n.HostDev) + b
		}
		return block
	})
	if seen != len(v.NICs) {
		return "", fmt.Errorf("lab: the XML of %s has %d of its %d vNICs (by MAC)", v.Name, seen, len(v.NICs))
	}
	return out, nil
}

// MigrationTimeout bounds one live migration of a lab guest.
const MigrationTimeout = 2 * time.Minute

// MigrateGuest migrates the QEMU guest vm live to host to (from the host
// whose namespace has its tap now), starting to's libvirtd when needed.
// A guest already on to is left alone (zero statistics).
func (pl *Plan) MigrateGuest(ctx context.Context, vm, to string) (virt.MigrationStats, error) {
	v := pl.VM(vm)
	if v == nil {
		return virt.MigrationStats{}, fmt.Errorf("lab: no VM %q", vm)
	}
	if v.Kind != policy.LabQemu {
		return virt.MigrationStats{}, fmt.Errorf("lab: %s is a namespace VM: it moves by re-plugging (Move)", vm)
	}
	dst := pl.Host(to)
	if dst == nil || len(dst.Uplinks) == 0 {
		return virt.MigrationStats{}, fmt.Errorf("lab: migrate %s to %q: no such host with an uplink", vm, to)
	}
	from, err := pl.WhereIs(vm)
	if err != nil {
		return virt.MigrationStats{}, err
	}
	if from == "" {
		return virt.MigrationStats{}, fmt.Errorf("lab: the tap of %s is on no host of cluster %s (is the lab up?)", vm, pl.Cluster)
	}
	if from == to {
		return virt.MigrationStats{}, nil
	}
	srcURI, err := pl.guestURI(v.Name, from)
	if err != nil {
		return virt.MigrationStats{}, err
	}
	dstURI, err := pl.StartHostLibvirtd(to)
	if err != nil {
		return virt.MigrationStats{}, err
	}
	src, err := virt.DialURI(srcURI)
	if err != nil {
		return virt.MigrationStats{}, fmt.Errorf("lab: %w", err)
	}
	defer src.Close()
	d, err := src.Client().DomainLookupByName(v.Name)
	if err != nil {
		return virt.MigrationStats{}, fmt.Errorf("lab: DomainLookupByName %s: %w", v.Name, err)
	}
	x, err := src.Client().DomainGetXMLDesc(d, libvirt.DomainXMLMigratable)
	if err != nil {
		return virt.MigrationStats{}, fmt.Errorf("lab: DomainGetXMLDesc %s: %w", v.Name, err)
	}
	if !strings.Contains(x, "-initrd-mig</initrd>") {
		return virt.MigrationStats{}, fmt.Errorf("lab: guest %s has the host's root mounted over 9p, which QEMU does not migrate: bring it up with lab.Options.Migratable[%q]", vm, vm)
	}
	dx, err := pl.destXML(x, v, dst)
	if err != nil {
		return virt.MigrationStats{}, err
	}
	st, err := src.Migrate(ctx, v.Name, virt.Migration{DestURI: dstURI, DestXML: dx, AutoConverge: true,
		MigrateURI: "unix://" + filepath.Join(HostLibvirtDir(pl.Cluster, to), "migrate.sock")})
	if err != nil {
		return st, fmt.Errorf("lab: %w", err)
	}
	return st, nil
}

// stopHostLibvirtds destroys the cluster's domains under its hosts' own
// libvirtds, stops those libvirtds and removes their directories.
func stopHostLibvirtds(cluster string) error {
	dirs, _ := filepath.Glob(filepath.Join(DefaultStateDir, "lab-"+cluster+"-libvirt-*"))
	var errs []error
	for _, dir := range dirs {
		sock := filepath.Join(dir, "run", "libvirt-sock")
		if c, err := virt.Dial(sock); err == nil {
			l := c.Client()
			doms, _, _ := l.ConnectListAllDomains(1, 0)
			for _, d := range doms {
				if !strings.HasPrefix(d.Name, NamespacePrefix(cluster)) {
					continue
				}
				if a, _ := l.DomainIsActive(d); a == 1 {
					if err := l.DomainDestroy(d); err != nil && !isNoDomain(err) {
						errs = append(errs, fmt.Errorf("destroy %s (%s): %w", d.Name, dir, err))
					}
				}
				if err := l.DomainUndefineFlags(d, 0); err != nil && !isNoDomain(err) {
					errs = append(errs, fmt.Errorf("undefine %s (%s): %w", d.Name, dir, err))
				}
			}
			c.Close()
		}
		// QEMUs left by a libvirtd that died, then the libvirtd.
		var pids []int
		qpids, _ := filepath.Glob(filepath.Join(dir, "run", "qemu", "*.pid"))
		for _, f := range append(qpids, filepath.Join(dir, "libvirtd.pid")) {
			if b, err := os.ReadFile(f); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
					pids = append(pids, pid)
				}
			}
		}
		killAll(pids, 5*time.Second)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("lab: hosts' libvirtds: %w", errors.Join(errs...))
	}
	return nil
}

// hostLibvirtdActive tells whether a host's own libvirtd of any cluster
// runs the named domain.
func hostLibvirtdActive(name string) bool {
	socks, _ := filepath.Glob(filepath.Join(DefaultStateDir, "lab-*-libvirt-*", "run", "libvirt-sock"))
	for _, s := range socks {
		c, err := virt.Dial(s)
		if err != nil {
			continue
		}
		a, err := c.Active(name)
		c.Close()
		if err == nil && a {
			return true
		}
	}
	return false
}
