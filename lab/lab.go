package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sluice/agent"
	"sluice/policy"
	"sluice/storage"
	"sluice/throttle/dirstats"
)

// DefaultStateDir is where state files, logs and agent statistics live.
const DefaultStateDir = "/run/sluice"

// netnsDir is where `ip netns` keeps named namespaces.
const netnsDir = "/run/netns"

// State is what a lab consists of, written to the state file before each
// thing is created, so that Down can remove it after a crash.
type State struct {
	Cluster string `json:"cluster"`
	Policy  string `json:"policy"`
	// Layout is the policy the lab was built from: an agent that follows
	// a controller (which sends each host only its part of the policy)
	// finds the lab's devices by it (PlanOf).
	Layout     *policy.Policy `json:"layout,omitempty"`
	Namespaces []Namespace    `json:"namespaces"`
	Processes  []Process      `json:"processes"`
	// Cgroups are the VMs' CPU cgroups (VMCgroup), relative to the root
	// of the cgroup hierarchy; Down finds them by prefix too.
	Cgroups []string `json:"cgroups,omitempty"`
	// Domains are the libvirt domains of the lab's QEMU guests; Down
	// finds them by prefix too.
	Domains  []string `json:"domains,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

// Process returns the process recorded under name (the last one, if a
// restart recorded it again).
func (s *State) Process(name string) (Process, bool) {
	var found Process
	ok := false
	for _, pr := range s.Processes {
		if pr.Name == name {
			found, ok = pr, true
		}
	}
	return found, ok
}

// Process is a process the lab started in one of its namespaces.
type Process struct {
	Name      string   `json:"name"` // e.g. "iperf3:5201", "nbdkit:ds1", "gateway:h1"
	Namespace string   `json:"namespace"`
	PID       int      `json:"pid"`
	Args      []string `json:"args"`
	Log       string   `json:"log,omitempty"`
}

// Options configure Up.
type Options struct {
	StateDir   string // DefaultStateDir when empty
	PolicyFile string // passed to gateways
	// Gateway is the path of a sluice binary that has the `gateway`
	// subcommand; empty means no gateways are started (with a warning).
	Gateway string
	// GatewayArgs are more arguments for every gateway (a test's TLS
	// listener, for one).
	GatewayArgs []string
	Log         io.Writer // progress and warnings; nil discards
	// GuestTTL, when positive, makes each QEMU guest power itself off
	// after that long (tests set it, so that a killed test leaves no
	// guest running for long).
	GuestTTL time.Duration
	// KVM runs the guests with KVM (<domain type='kvm'>, host CPU)
	// instead of TCG; TCG is the default because nested KVM does not run
	// stock guests on the project's machines (../shared/lab-vms.md).
	KVM bool
	// GuestIPv6Only names VMs whose guests get no IPv4 address: they send
	// IPv6 only (tests of classification at the vNIC).
	GuestIPv6Only map[string]bool
	// Migratable names VMs whose guests can migrate live (lab/migrate.go):
	// they boot from their initramfs alone, without the host's root.
	Migratable map[string]bool
	// FirmwareBoot boots the guests' compressed vmlinuz through the
	// firmware's Linux loader instead of its uncompressed PVH copy
	// (GuestKernel): about 4 s more per TCG guest. livetest/cpulive's
	// CPU-limit sweep uses it (docs/lab.md says why).
	FirmwareBoot bool
}

// StatePath is the state file of a cluster's lab.
func StatePath(stateDir, cluster string) string {
	if stateDir == "" {
		stateDir = DefaultStateDir
	}
	return filepath.Join(stateDir, "lab-"+cluster+".json")
}

// ReadState reads a lab's state file; it returns (nil, nil) when there is none.
func ReadState(stateDir, cluster string) (*State, error) {
	b, err := os.ReadFile(StatePath(stateDir, cluster))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", StatePath(stateDir, cluster), err)
	}
	return &s, nil
}

// PlanOf is the plan of the lab of cluster that is up under stateDir, as
// it was built (State.Layout; the policy file of the state for a lab
// brought up before layouts were recorded).
func PlanOf(stateDir, cluster string) (*Plan, error) {
	st, err := ReadState(stateDir, cluster)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, fmt.Errorf("lab %s is not up (no state file %s)", cluster, StatePath(stateDir, cluster))
	}
	p := st.Layout
	if p == nil {
		if st.Policy == "" {
			return nil, fmt.Errorf("%s records neither the lab's layout nor its policy file", StatePath(stateDir, cluster))
		}
		if p, err = policy.Load(st.Policy); err != nil {
			return nil, err
		}
	}
	return NewPlan(p)
}

func writeState(stateDir string, s *State) error {
	if err := os.MkdirAll(stateDirOr(stateDir), 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	path := StatePath(stateDir, s.Cluster)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func stateDirOr(d string) string {
	if d == "" {
		return DefaultStateDir
	}
	return d
}

// Existing lists the namespaces that exist now with the cluster's prefix.
func Existing(cluster string) []string {
	ents, _ := os.ReadDir(netnsDir)
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), NamespacePrefix(cluster)) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// Up builds the lab of p. It refuses when namespaces of the cluster exist.
// On failure it removes what it created.
func Up(p *policy.Policy, o Options) (st *State, err error) {
	pl, err := NewPlan(p)
	if err != nil {
		return nil, err
	}
	if ex := Existing(p.Cluster); len(ex) > 0 {
		return nil, fmt.Errorf("lab %s is already up (%d namespaces, e.g. %s): run 'sluice lab down' first", p.Cluster, len(ex), ex[0])
	}
	if err := checkTools(); err != nil {
		return nil, err
	}
	if pl.HasGuests() {
		if _, _, err := checkGuestTools(o); err != nil {
			return nil, err
		}
	}
	if ds, err := ExistingDomains(p.Cluster); err != nil {
		return nil, err
	} else if len(ds) > 0 {
		return nil, fmt.Errorf("lab %s is already up (%d libvirt domains, e.g. %s): run 'sluice lab down' first", p.Cluster, len(ds), ds[0])
	}
	logw := o.Log
	if logw == nil {
		logw = io.Discard
	}
	pl.useStateDir(o.StateDir)
	st = &State{Cluster: p.Cluster, Policy: o.PolicyFile, Layout: p, Namespaces: pl.Namespaces()}
	for i, ns := range st.Namespaces {
		if ns.Kind == policy.LabQemu {
			st.Namespaces[i].Console = guestConsole(o.StateDir, p.Cluster, ns.Entity)
		}
	}
	if err := writeState(o.StateDir, st); err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = Down(p.Cluster, o.StateDir)
		}
	}()
	if err := buildLinks(pl); err != nil {
		return nil, err
	}
	createCgroups(pl, st, logw)
	if err := writeState(o.StateDir, st); err != nil {
		return nil, err
	}
	start := func(name, ns, logName string, args ...string) error {
		pr, err := startIn(ns, o.StateDir, logName, args...)
		if err != nil {
			return fmt.Errorf("start %s in %s: %w", name, ns, err)
		}
		pr.Name = name
		st.Processes = append(st.Processes, pr)
		return writeState(o.StateDir, st)
	}
	// Storage first: a guest's QEMU opens its disks at its gateway when it
	// starts.
	for _, d := range pl.Datastores {
		// nbdkit in the foreground dies with the thread that started it
		// (it behaves as with --exit-with-parent when started from Go), so
		// it daemonizes and reports its pid in a pid file.
		// The datastore's volumes: one sparse file per disk and the stats
		// volume (storage.CreateVolumes keeps files already there).
		if err := os.MkdirAll(d.Array.Dir, 0o700); err != nil {
			return nil, err
		}
		pidFile := filepath.Join(stateDirOr(o.StateDir), "lab-"+p.Cluster+"-nbdkit-"+d.Datastore+".pid")
		listen := []string{"-i", d.IP.String(), "-p", strconv.Itoa(NBDPort)}
		if d.Driver == policy.DriverThrottle {
			// The operator's own disks: qcow2 images that the guests
			// open from nbdkit's socket, no stats volume (the throttle
			// driver keeps its stats in the directory itself).
			if err := createQcow2Volumes(d.Array.Dir, p, d.Datastore); err != nil {
				return nil, err
			}
			_ = os.Remove(d.Socket)
			listen = []string{"-U", d.Socket}
		} else if _, err := storage.CreateVolumes(d.Array.Dir, p, d.Datastore); err != nil {
			return nil, err
		}
		args := append(append([]string{"nbdkit", "--pidfile", pidFile}, listen...), d.Array.NbdkitArgs()...)
		logName := filepath.Join(stateDirOr(o.StateDir), "lab-"+p.Cluster+"-nbdkit-"+d.Datastore+".log")
		pid, err := startDaemon(d.Name, logName, pidFile, args...)
		if err != nil {
			return nil, fmt.Errorf("start nbdkit in %s: %w", d.Name, err)
		}
		st.Processes = append(st.Processes, Process{Name: "nbdkit:" + d.Datastore, Namespace: d.Name, PID: pid, Args: args, Log: logName})
		if err := writeState(o.StateDir, st); err != nil {
			return nil, err
		}
	}
	for _, d := range pl.Datastores {
		if d.Socket != "" {
			if err := waitUnixSockets([]string{d.Socket}, 10*time.Second); err != nil {
				return nil, fmt.Errorf("nbdkit of %s: %w", d.Datastore, err)
			}
			continue
		}
		if err := waitListening(d.Name, []int{NBDPort}, 10*time.Second); err != nil {
			return nil, fmt.Errorf("nbdkit of %s: %w", d.Datastore, err)
		}
	}
	gatewayDS := map[string]bool{}
	for _, d := range pl.Datastores {
		gatewayDS[d.Datastore] = d.Driver != policy.DriverThrottle
	}
	for _, h := range pl.Hosts {
		dss := map[string]bool{}
		for _, v := range p.VMs {
			if v.Host == h.Host {
				for _, dk := range v.Disks {
					if gatewayDS[dk.Datastore] {
						dss[dk.Datastore] = true
					}
				}
			}
		}
		if len(dss) == 0 {
			continue
		}
		if o.Gateway == "" {
			w := fmt.Sprintf("host %s has disks but this sluice binary has no 'gateway' command: storage gateway not started", h.Host)
			st.Warnings = append(st.Warnings, w)
			fmt.Fprintln(logw, "warning: "+w)
			continue
		}
		args := []string{o.Gateway, "gateway", "--host", h.Host, "--policy", o.PolicyFile}
		for _, d := range pl.Datastores {
			if dss[d.Datastore] {
				args = append(args, "--datastore", fmt.Sprintf("%s=nbd://%s:%d", d.Datastore, d.IP, NBDPort))
			}
		}
		args = append(args, o.GatewayArgs...)
		if err := start("gateway:"+h.Host, h.Name, "lab-"+p.Cluster+"-gateway-"+h.Host+".log", args...); err != nil {
			return nil, err
		}
		// The VMs can open their disks when each VM's socket accepts
		// (docs/storage.md, "Access control"); a guest's QEMU opens its
		// disks when it starts.
		var socks []string
		for _, v := range p.VMs {
			if v.Host == h.Host && slices.ContainsFunc(v.Disks, func(d policy.Disk) bool { return gatewayDS[d.Datastore] }) {
				socks = append(socks, storage.VMSocket(storage.SocketDir(p.Cluster, h.Host), v.Name))
			}
		}
		if err := waitUnixSockets(socks, 10*time.Second); err != nil {
			return nil, fmt.Errorf("lab: gateway of host %s: %v (log: %s)", h.Host, err,
				filepath.Join(stateDirOr(o.StateDir), "lab-"+p.Cluster+"-gateway-"+h.Host+".log"))
		}
	}
	// The guests boot while the servers start.
	if pl.HasGuests() {
		if err := startGuests(pl, st, o, logw); err != nil {
			return nil, err
		}
	}
	fab := pl.Fabric.Name
	var ports []int
	for _, v := range pl.VMs {
		for _, n := range v.NICs {
			// Not bound to an address: the server takes IPv4 and IPv6.
			if err := start(fmt.Sprintf("iperf3:%d", n.IperfPort), fab, "", "iperf3", "-s", "-J", "-p", strconv.Itoa(n.IperfPort)); err != nil {
				return nil, err
			}
			ports = append(ports, n.IperfPort)
		}
	}
	if err := start("sockperf", fab, "", "sockperf", "server", "--tcp", "-i", FabricIP.String(), "-p", strconv.Itoa(SockperfPort)); err != nil {
		return nil, err
	}
	ports = append(ports, SockperfPort)
	if err := waitListening(fab, ports, 10*time.Second); err != nil {
		return nil, err
	}
	if err := waitGuests(pl, o.StateDir, GuestBootTimeout); err != nil {
		return nil, err
	}
	if err := writeState(o.StateDir, st); err != nil {
		return nil, err
	}
	return st, nil
}

func checkTools() error {
	var miss []string
	for _, t := range []string{"ip", "iperf3", "sockperf", "nbdkit"} {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t)
		}
	}
	if len(miss) > 0 {
		return fmt.Errorf("lab: missing tools %s (run scripts/deps.sh)", strings.Join(miss, ", "))
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("lab: must run as root (network namespaces)")
	}
	return nil
}

// ip runs one `ip` command and returns its error with its output.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
	}
	return nil
}

// batch runs `ip -batch` with the given lines, stopping at the first error.
// A line "-n NS rest" runs "rest" in namespace NS; consecutive lines of one
// namespace go in one `ip -n NS -batch -`.
func batch(lines []string) error {
	run := func(ns string, group []string) error {
		args := []string{"-batch", "-"}
		if ns != "" {
			args = append([]string{"-n", ns}, args...)
		}
		cmd := exec.Command("ip", args...)
		cmd.Stdin = strings.NewReader(strings.Join(group, "\n") + "\n")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %s", strings.Join(args, " "), strings.TrimSpace(string(out)))
		}
		return nil
	}
	cur, group := "", []string(nil)
	for _, l := range lines {
		ns, rest := "", l
		if strings.HasPrefix(l, "-n ") {
			f := strings.SplitN(l, " ", 3)
			ns, rest = f[1], f[2]
		}
		if ns != cur && len(group) > 0 {
			if err := run(cur, group); err != nil {
				return err
			}
			group = nil
		}
		cur = ns
		group = append(group, rest)
	}
	if len(group) > 0 {
		return run(cur, group)
	}
	return nil
}

func buildLinks(pl *Plan) error {
	var nss []Namespace
	for _, ns := range pl.Namespaces() {
		if ns.Kind != policy.LabQemu { // a guest is a domain, not a namespace
			nss = append(nss, ns)
		}
	}
	var l []string
	for _, ns := range nss {
		l = append(l, "netns add "+ns.Name)
	}
	for _, ns := range nss {
		l = append(l, "-n "+ns.Name+" link set lo up")
	}
	if err := batch(l); err != nil {
		return err
	}
	// Before any link: a namespace the lab owns routes nothing between
	// the VMs' network and the storage network (a new namespace inherits
	// the machine's IPv4 forwarding).
	for _, ns := range nss {
		if err := noForwarding(ns.Name); err != nil {
			return err
		}
	}
	cidr := func(a fmt.Stringer) string { return fmt.Sprintf("%s/%d", a, PrefixLen) }
	f := pl.Fabric.Name
	l = []string{
		"-n " + f + " link add " + FabricBridge + " type bridge",
		"-n " + f + " addr add " + cidr(FabricIP) + " dev " + FabricBridge,
		fmt.Sprintf("-n %s addr add %s/%d dev %s nodad", f, FabricIP6, PrefixLen6, FabricBridge),
		"-n " + f + " link set " + FabricBridge + " up",
	}
	veth := func(ns, dev, peerNS, peer string) []string {
		return []string{
			fmt.Sprintf("-n %s link add %s type veth peer name %s netns %s", ns, dev, peer, peerNS),
		}
	}
	l = append(l, pl.storageLines()...)
	for _, h := range pl.Hosts {
		for k, u := range h.Uplinks {
			l = append(l, fmt.Sprintf("-n %s link add %s type bridge", h.Name, u.Bridge))
			l = append(l, veth(h.Name, u.Dev, f, u.FabricDev)...)
			l = append(l,
				fmt.Sprintf("-n %s link set %s master %s txqueuelen %d up", h.Name, u.Dev, u.Bridge, UplinkTxQueueLen),
				fmt.Sprintf("-n %s link set %s master %s up", f, u.FabricDev, FabricBridge),
				fmt.Sprintf("-n %s link set %s up", h.Name, u.Bridge))
			if k == 0 {
				l = append(l, fmt.Sprintf("-n %s addr add %s dev %s", h.Name, cidr(h.IP), u.Bridge))
			}
		}
	}
	for _, v := range pl.VMs {
		if v.Kind == policy.LabQemu {
			continue // startGuests puts the guest's taps on the bridges
		}
		hostNS := pl.Prefix + v.Host
		for _, n := range v.NICs {
			l = append(l, veth(v.Name, n.Dev, hostNS, n.HostDev)...)
			l = append(l,
				fmt.Sprintf("-n %s addr add %s dev %s", v.Name, cidr(n.IP), n.Dev),
				fmt.Sprintf("-n %s addr add %s/%d dev %s nodad", v.Name, n.IP6, PrefixLen6, n.Dev),
				fmt.Sprintf("-n %s link set %s address %s up", v.Name, n.Dev, n.MAC),
				fmt.Sprintf("-n %s link set %s master %s up", hostNS, n.HostDev, n.Bridge))
		}
	}
	return batch(l)
}

// startIn starts a long-running process in a namespace, detached, with its
// output in a log file under the state directory (or discarded).
func startIn(ns, stateDir, logName string, args ...string) (Process, error) {
	pr := Process{Namespace: ns, Args: args}
	out := io.Writer(nil)
	if logName != "" {
		pr.Log = filepath.Join(stateDirOr(stateDir), logName)
		f, err := os.Create(pr.Log)
		if err != nil {
			return pr, err
		}
		defer f.Close()
		out = f
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return pr, err
	}
	pr.PID = cmd.Process.Pid
	// Reap it if it exits while we run; the pid stays the process's own
	// because `ip netns exec` execs the command.
	go func() { _ = cmd.Wait() }()
	return pr, nil
}

// startDaemon runs a program that daemonizes itself and writes its pid to
// pidFile; it returns that pid. Start-up errors go to the log file.
func startDaemon(ns, logPath, pidFile string, args ...string) (int, error) {
	_ = os.Remove(pidFile)
	f, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logPath)
		return 0, fmt.Errorf("%v: %s", err, strings.TrimSpace(string(b)))
	}
	// The daemon's parent exits right after forking; the child writes the
	// pid file a moment later, so poll for it (an external process, with a
	// deadline).
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(pidFile)
		if err == nil && len(bytes.TrimSpace(b)) > 0 {
			return strconv.Atoi(strings.TrimSpace(string(b)))
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			return 0, fmt.Errorf("no pid in %s after 10s: %v %s", pidFile, err, strings.TrimSpace(string(log)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createQcow2Volumes makes the qcow2 image of every disk of datastore ds
// in dir (ThrottleVolume, the disk's size) that is not there yet, with
// qemu-img, and the throttle driver's probe file.
func createQcow2Volumes(dir string, p *policy.Policy, ds string) error {
	// The file the throttle driver probes the datastore's latency with
	// (an export of nbdkit too).
	if _, err := dirstats.EnsureProbe(dir); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	for _, v := range storage.Volumes(p, ds) {
		path := filepath.Join(dir, ThrottleVolume(v.VM, v.Disk))
		if _, err := os.Stat(path); err == nil {
			continue
		}
		// Metadata preallocated: every cluster is allocated, so a read
		// reaches the datastore as an operator's full image's would (an
		// empty qcow2 answers reads of unallocated clusters itself).
		out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-o", "preallocation=metadata", path, strconv.FormatUint(v.SizeBytes, 10)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("lab: qemu-img create %s: %v: %s (qemu-img is in qemu-utils: scripts/deps.sh)", path, err, bytes.TrimSpace(out))
		}
	}
	return nil
}

// waitUnixSockets polls until a server accepts on every Unix socket.
func waitUnixSockets(paths []string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for _, p := range paths {
		for {
			c, err := net.DialTimeout("unix", p, time.Second)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("nothing accepts on %s after %s: %v", p, within, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// waitListening polls until every TCP port listens in ns.
func waitListening(ns string, ports []int, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		out, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-Hltn").Output()
		missing := 0
		for _, p := range ports {
			if !bytes.Contains(out, []byte(":"+strconv.Itoa(p)+" ")) {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lab: %d servers in %s not listening after %s", missing, ns, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Down removes the lab of cluster: it kills the processes the state file
// records and every process in the cluster's namespaces, deletes those
// namespaces (which deletes their links), and removes the state file. It
// works from the prefix alone when the state file is lost.
func Down(cluster, stateDir string) error {
	st, rerr := ReadState(stateDir, cluster)
	var errs []error
	if rerr != nil {
		errs = append(errs, rerr)
	}
	var pids []int
	nsSet := map[string]bool{}
	// The guests go first: destroying one ends its QEMU and its taps.
	var doms []string
	if st != nil {
		doms = st.Domains
	}
	if err := removeDomains(cluster, doms); err != nil {
		errs = append(errs, err)
	}
	if err := stopHostLibvirtds(cluster); err != nil {
		errs = append(errs, err)
	}
	if st != nil {
		for _, pr := range st.Processes {
			if alive(pr) {
				pids = append(pids, pr.PID)
			}
		}
		for _, ns := range st.Namespaces {
			nsSet[ns.Name] = true
		}
	}
	for _, n := range Existing(cluster) {
		nsSet[n] = true
	}
	var names []string
	for n := range nsSet {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		out, _ := exec.Command("ip", "netns", "pids", n).Output()
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	killAll(pids, 3*time.Second)
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(netnsDir, n)); err != nil {
			continue
		}
		ino := agent.NetnsInode(filepath.Join(netnsDir, n))
		if err := ip("netns", "del", n); err != nil {
			errs = append(errs, err)
			continue
		}
		// The agent's records of the roots it replaced there go with
		// the namespace's devices.
		if ino != 0 {
			if err := agent.ForgetNetnsRoots(agent.DefaultRootsDir, ino); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := removeCgroups(cluster); err != nil {
		errs = append(errs, err)
	}
	// Pid files, nbdkit's sockets, agent and throttle driver statistics
	// and the datastores' volumes of the cluster go too; logs stay.
	for _, pat := range []string{"lab-" + cluster + "-*.pid", "lab-" + cluster + "-*.sock", "agent-" + cluster + "-*.json",
		"throttle-" + cluster + "-*.json", "throttle-originals-" + cluster + "-*.json", "lab-" + cluster + "-initrd", "lab-" + cluster + "-initrd-mig"} {
		m, _ := filepath.Glob(filepath.Join(stateDirOr(stateDir), pat))
		for _, f := range m {
			_ = os.Remove(f)
		}
	}
	// The lab's gateways publish where a gateway does by default: their
	// status files and per-VM socket directories go with their processes
	// (a gateway killed with SIGKILL leaves them).
	for _, pat := range []string{"gateway-" + cluster + "-*.json", "gw-" + cluster + "-*"} {
		m, _ := filepath.Glob(filepath.Join(filepath.Dir(storage.SocketDir(cluster, "h")), pat))
		for _, f := range m {
			if err := os.RemoveAll(f); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, d := range []string{"lab-" + cluster + ".volumes"} {
		if err := os.RemoveAll(filepath.Join(stateDirOr(stateDir), d)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(StatePath(stateDir, cluster)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// alive says whether a recorded process still runs as the same program.
func alive(pr Process) bool {
	if pr.PID <= 0 || len(pr.Args) == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pr.PID))
	if err != nil {
		return false
	}
	argv0 := strings.SplitN(string(b), "\x00", 2)[0]
	return filepath.Base(argv0) == filepath.Base(pr.Args[0]) || filepath.Base(argv0) == "ip"
}

func killAll(pids []int, grace time.Duration) {
	if len(pids) == 0 {
		return
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		left := 0
		for _, p := range pids {
			if syscall.Kill(p, 0) == nil && !zombie(p) {
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// Status is what `lab status` shows.
type Status struct {
	Cluster    string          `json:"cluster"`
	Up         bool            `json:"up"`
	Namespaces []NamespaceStat `json:"namespaces"`
	Processes  []ProcessStat   `json:"processes"`
	Warnings   []string        `json:"warnings,omitempty"`
}

// NamespaceStat is a namespace of the state file (or found by prefix) and
// whether it exists.
type NamespaceStat struct {
	Namespace
	Exists bool `json:"exists"`
}

// ProcessStat is a recorded process and whether it runs.
type ProcessStat struct {
	Process
	Running bool `json:"running"`
}

// GetStatus reports the lab of cluster from its state file and the
// namespaces that exist.
func GetStatus(cluster, stateDir string) (*Status, error) {
	st, err := ReadState(stateDir, cluster)
	if err != nil {
		return nil, err
	}
	ex := map[string]bool{}
	for _, n := range Existing(cluster) {
		ex[n] = true
	}
	s := &Status{Cluster: cluster, Namespaces: []NamespaceStat{}, Processes: []ProcessStat{}}
	seen := map[string]bool{}
	if st != nil {
		s.Warnings = st.Warnings
		for _, ns := range st.Namespaces {
			e := ex[ns.Name]
			if ns.Kind == policy.LabQemu {
				e = domainActive(ns.Name)
				s.Up = s.Up || e
			}
			s.Namespaces = append(s.Namespaces, NamespaceStat{Namespace: ns, Exists: e})
			seen[ns.Name] = true
		}
		for _, pr := range st.Processes {
			s.Processes = append(s.Processes, ProcessStat{Process: pr, Running: alive(pr)})
		}
	}
	for n := range ex {
		if !seen[n] {
			s.Namespaces = append(s.Namespaces, NamespaceStat{Namespace: Namespace{Name: n, Role: "unknown"}, Exists: true})
		}
	}
	s.Up = s.Up || len(ex) > 0
	return s, nil
}

// Exec runs a command in a lab namespace and returns its standard output.
// Tests and scripts use it to run clients.
func Exec(ctx context.Context, ns string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s in %s: %v: %s", strings.Join(args, " "), ns, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
