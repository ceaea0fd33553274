package cpuctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Cgroups applies settings to VM cgroups and reads their counters. A group
// is a path relative to the root of the hierarchy, e.g. "sl-c1-vm1" or
// libvirt's "machine.slice/machine-qemu\x2d1\x2dvm1.scope".
type Cgroups interface {
	// Apply reconciles the CPU files of group with s: it reads each file
	// and writes only those that differ, so that applying twice writes
	// nothing. It returns the files it wrote ("cpu.weight", ...);
	// independent failures are joined and each names its file.
	Apply(group string, s Setting) (written []string, err error)
	// Stats reads the counters of group (see Stats).
	Stats(group string) (Stats, error)
}

// Tree is a real cgroup hierarchy: besides Apply and Stats it creates and
// removes groups and moves processes into them (the lab does; the agent
// uses the groups libvirt creates).
type Tree interface {
	Cgroups
	// Create makes group (and its parents); it exists already is no error.
	Create(group string) error
	// Attach moves process pid (all its threads) into group.
	Attach(group string, pid int) error
	// Procs lists the processes in group.
	Procs(group string) ([]int, error)
	// Remove deletes group, which must hold no process; a missing group is
	// no error.
	Remove(group string) error
	// Dir is the directory of group in the hierarchy with the cpu
	// controller.
	Dir(group string) string
}

// V2 is the unified hierarchy (cgroup2) with the cpu controller: cpu.weight,
// cpu.max, cpu.stat, cpu.pressure, cgroup.threads.
type V2 struct {
	Root string // its mount point, e.g. /sys/fs/cgroup
	Proc string // /proc when empty
}

// V1 is the legacy hierarchies: the cpu controller (cpu.shares,
// cpu.cfs_quota_us, cpu.cfs_period_us, cpu.stat with throttled_time in ns),
// cpuacct for usage (cpuacct.usage), and optionally the unified hierarchy
// for PSI (cpu.pressure), which the kernel keeps even where cgroup2 has
// no cpu controller. A group has the same relative path in each.
type V1 struct {
	CPU     string // e.g. /sys/fs/cgroup/cpu (or cpu,cpuacct when co-mounted)
	Acct    string // e.g. /sys/fs/cgroup/cpuacct; empty or CPU when co-mounted
	Unified string // e.g. /sys/fs/cgroup/unified; empty: no PSI
	Proc    string // /proc when empty
}

// readFile returns the trimmed contents of a cgroup file; its error names
// the file.
func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("cpuctl: read %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func writeFile(path, val string) error {
	// O_WRONLY without O_CREATE: a cgroup file that is not there is an
	// error, never a new regular file.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("cpuctl: write %s: %w", val, err)
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cpuctl: write %s to %s: %w", val, path, err)
	}
	return nil
}

// reconcile writes each wanted value whose file holds another one, in
// order, and returns the names written. same compares a file's value with
// the wanted one.
func reconcile(dir string, want [][2]string, same func(file, have, want string) bool) ([]string, error) {
	var written []string
	var errs []error
	for _, fw := range want {
		p := filepath.Join(dir, fw[0])
		have, err := readFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if same(fw[0], have, fw[1]) {
			continue
		}
		if err := writeFile(p, fw[1]); err != nil {
			errs = append(errs, err)
			continue
		}
		written = append(written, fw[0])
	}
	return written, errors.Join(errs...)
}

func procDir(p string) string {
	if p == "" {
		return "/proc"
	}
	return p
}

// Dir is Root/group.
func (c V2) Dir(group string) string { return filepath.Join(c.Root, group) }

// Apply sets cpu.weight and cpu.max.
func (c V2) Apply(group string, s Setting) ([]string, error) {
	return reconcile(c.Dir(group), [][2]string{
		{"cpu.weight", strconv.Itoa(s.Weight)},
		{"cpu.max", s.CPUMax()},
	}, func(_, have, want string) bool { return strings.Join(strings.Fields(have), " ") == want })
}

// Create makes group and enables the cpu controller for it in its
// parents' cgroup.subtree_control where that is missing.
func (c V2) Create(group string) error {
	parts := strings.Split(filepath.Clean(group), string(filepath.Separator))
	dir := c.Root
	for _, part := range parts {
		sc := filepath.Join(dir, "cgroup.subtree_control")
		if have, err := readFile(sc); err == nil && !hasWord(have, "cpu") {
			if err := writeFile(sc, "+cpu"); err != nil {
				return err
			}
		}
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("cpuctl: %w", err)
		}
	}
	return nil
}

// Attach writes pid to cgroup.procs.
func (c V2) Attach(group string, pid int) error {
	return writeFile(filepath.Join(c.Dir(group), "cgroup.procs"), strconv.Itoa(pid))
}

// Procs reads cgroup.procs.
func (c V2) Procs(group string) ([]int, error) {
	return readIDs(filepath.Join(c.Dir(group), "cgroup.procs"))
}

// Remove deletes the group's directory.
func (c V2) Remove(group string) error { return rmdir(c.Dir(group)) }

// Stats reads cpu.stat (usage_usec, nr_periods, nr_throttled,
// throttled_usec), cpu.pressure, and the schedstat of the threads of the
// group and its sub-groups (cgroup.threads).
func (c V2) Stats(group string) (Stats, error) {
	dir := c.Dir(group)
	var st Stats
	kv, err := readKV(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return st, err
	}
	st.UsageNs = kv["usage_usec"] * 1000
	st.NrPeriods, st.NrThrottled = kv["nr_periods"], kv["nr_throttled"]
	st.ThrottledNs = kv["throttled_usec"] * 1000
	st.PressureSomeUs, st.HasPressure = readPressure(filepath.Join(dir, "cpu.pressure"))
	tids, err := subtreeIDs(dir, "cgroup.threads")
	if err != nil {
		return st, err
	}
	st.Threads = len(tids)
	st.RunDelayNs = runDelay(procDir(c.Proc), tids)
	return st, nil
}

func (c V1) dirs(group string) []string {
	out := []string{filepath.Join(c.CPU, group)}
	if c.Acct != "" && c.Acct != c.CPU {
		out = append(out, filepath.Join(c.Acct, group))
	}
	if c.Unified != "" {
		out = append(out, filepath.Join(c.Unified, group))
	}
	return out
}

func (c V1) acctDir(group string) string {
	if c.Acct == "" {
		return filepath.Join(c.CPU, group)
	}
	return filepath.Join(c.Acct, group)
}

// Dir is CPU/group.
func (c V1) Dir(group string) string { return filepath.Join(c.CPU, group) }

// Apply sets cpu.shares, cpu.cfs_period_us and cpu.cfs_quota_us (the
// period first: the quota is checked against it).
func (c V1) Apply(group string, s Setting) ([]string, error) {
	return reconcile(c.Dir(group), [][2]string{
		{"cpu.shares", strconv.Itoa(s.Shares)},
		{"cpu.cfs_period_us", strconv.FormatInt(s.PeriodUs, 10)},
		{"cpu.cfs_quota_us", strconv.FormatInt(s.QuotaUs, 10)},
	}, func(_, have, want string) bool { return have == want })
}

// Create makes group in each hierarchy (cpu, cpuacct, unified).
func (c V1) Create(group string) error {
	for _, d := range c.dirs(group) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cpuctl: %w", err)
		}
	}
	return nil
}

// Attach writes pid to cgroup.procs in each hierarchy.
func (c V1) Attach(group string, pid int) error {
	var errs []error
	for _, d := range c.dirs(group) {
		errs = append(errs, writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)))
	}
	return errors.Join(errs...)
}

// Procs reads cgroup.procs of the cpu hierarchy.
func (c V1) Procs(group string) ([]int, error) {
	return readIDs(filepath.Join(c.Dir(group), "cgroup.procs"))
}

// Remove deletes group from each hierarchy.
func (c V1) Remove(group string) error {
	var errs []error
	for _, d := range c.dirs(group) {
		errs = append(errs, rmdir(d))
	}
	return errors.Join(errs...)
}

// Stats reads cpuacct.usage, cpu.stat (nr_periods, nr_throttled,
// throttled_time in ns), cpu.pressure from the unified hierarchy when
// configured, and the schedstat of the tasks of the group and its
// sub-groups (libvirt puts a domain's threads in emulator/ and vcpuN/).
// Where the group exists in the cpu hierarchy only (libvirt on a machine
// whose cpuacct is mounted apart, as this project's: it joins the domain
// to cpu but leaves it at cpuacct's root), the usage is the CPU time of
// the group's threads from schedstat (its first field), which loses what
// threads that exited had used (Rates clamps a fall to 0).
func (c V1) Stats(group string) (Stats, error) {
	var st Stats
	tids, err := subtreeIDs(c.Dir(group), "tasks")
	if err != nil {
		return st, err
	}
	st.Threads = len(tids)
	st.RunDelayNs = runDelay(procDir(c.Proc), tids)
	acct := filepath.Join(c.acctDir(group), "cpuacct.usage")
	u, err := readFile(acct)
	switch {
	case err == nil:
		if st.UsageNs, err = strconv.ParseUint(u, 10, 64); err != nil {
			return st, fmt.Errorf("cpuctl: %s: %w", acct, err)
		}
	case errors.Is(err, os.ErrNotExist) && c.acctDir(group) != c.Dir(group):
		st.UsageNs = runTime(procDir(c.Proc), tids)
	default:
		return st, err
	}
	kv, err := readKV(filepath.Join(c.Dir(group), "cpu.stat"))
	if err != nil {
		return st, err
	}
	st.NrPeriods, st.NrThrottled, st.ThrottledNs = kv["nr_periods"], kv["nr_throttled"], kv["throttled_time"]
	if c.Unified != "" {
		st.PressureSomeUs, st.HasPressure = readPressure(filepath.Join(c.Unified, group, "cpu.pressure"))
	}
	return st, nil
}

// subtreeIDs reads the IDs in file (tasks, cgroup.threads) of dir and of
// every group below it; a sub-group that vanishes meanwhile counts none.
func subtreeIDs(dir, file string) ([]int, error) {
	ids, err := readIDs(filepath.Join(dir, file))
	if err != nil {
		return nil, err
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			sub, _ := subtreeIDs(filepath.Join(dir, e.Name()), file)
			ids = append(ids, sub...)
		}
	}
	return ids, nil
}

func hasWord(s, w string) bool {
	for _, f := range strings.Fields(s) {
		if f == w {
			return true
		}
	}
	return false
}

func rmdir(d string) error {
	if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cpuctl: %w", err)
	}
	return nil
}

func readIDs(path string) ([]int, error) {
	s, err := readFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range strings.Fields(s) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("cpuctl: %s: %w", path, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// readKV reads a flat keyed file ("key value" lines, as cpu.stat).
func readKV(path string) (map[string]uint64, error) {
	s, err := readFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("cpuctl: %s: %q: %w", path, line, err)
		}
		out[f[0]] = v
	}
	return out, nil
}
