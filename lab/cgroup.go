package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sluice/cpuctl"
)

// VMCgroup is the CPU cgroup of a VM of the lab, relative to the root of
// the cgroup hierarchy (cpuctl.Tree): its namespace's name,
// "sl-<cluster>-<vm>" (on this machine /sys/fs/cgroup/cpu/sl-<cluster>-<vm>).
// Up creates it; tests put the processes they start in a namespace VM
// into it (cpuctl.Tree.Attach), Up moves a QEMU guest's process into it
// (attachGuest), and the agent sets it. It is "" when the plan has no
// such VM.
func VMCgroup(pl *Plan, vm string) string {
	if v := pl.VM(vm); v != nil {
		return v.Name
	}
	return ""
}

// createCgroups makes one CPU cgroup per VM of the plan. A machine without
// a cgroup hierarchy with the cpu controller gets a warning, not an error:
// the network and storage of a lab do not need it.
func createCgroups(pl *Plan, st *State, logw io.Writer) {
	tree, err := cpuctl.Detect("")
	if err == nil {
		for _, v := range pl.VMs {
			if err = tree.Create(v.Name); err != nil {
				break
			}
			st.Cgroups = append(st.Cgroups, v.Name)
		}
	}
	if err != nil {
		w := fmt.Sprintf("VM CPU cgroups not created: %v", err)
		st.Warnings = append(st.Warnings, w)
		fmt.Fprintln(logw, "warning: "+w)
	}
}

// attachGuest moves the QEMU process of guest v (all its threads, out of
// the group libvirt made for it) into the VM's lab cgroup, so that the
// agent's settings and statistics of VMCgroup cover the whole guest as
// they cover a namespace VM's processes. A lab without cgroups
// (createCgroups warned) leaves the guest where libvirt put it.
func attachGuest(st *State, v VMPlan) error {
	if !slices.Contains(st.Cgroups, v.Name) {
		return nil
	}
	tree, err := cpuctl.Detect("")
	if err != nil {
		return err
	}
	pid, err := GuestPID(v)
	if err != nil {
		return err
	}
	if err := tree.Attach(v.Name, pid); err != nil {
		return fmt.Errorf("lab: guest %s into its cgroup: %w", v.VM, err)
	}
	return nil
}

// GuestPID is the pid of guest v's QEMU (libvirt's pid file of its
// domain).
func GuestPID(v VMPlan) (int, error) {
	b, err := os.ReadFile(guestPidFile(v.Name))
	if err != nil {
		return 0, fmt.Errorf("lab: pid of guest %s: %w", v.VM, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("lab: pid of guest %s: %s: %w", v.VM, guestPidFile(v.Name), err)
	}
	return pid, nil
}

// guestPidFile is where libvirt's QEMU driver keeps a running domain's pid.
func guestPidFile(domain string) string { return "/run/libvirt/qemu/" + domain + ".pid" }

// removeCgroups removes the cluster's CPU cgroups, found by prefix (also
// after a crash), killing the processes still in them: they are the lab's.
func removeCgroups(cluster string) error {
	tree, err := cpuctl.Detect("")
	if err != nil {
		return nil // no hierarchy: the lab made none
	}
	ents, _ := os.ReadDir(tree.Dir(""))
	var errs []error
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), NamespacePrefix(cluster)) {
			continue
		}
		g := e.Name()
		pids, _ := tree.Procs(g)
		killAll(pids, 3*time.Second)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		// A killed process leaves its group a moment after it dies.
		for i := 0; ; i++ {
			if err = tree.Remove(g); err == nil || i == 100 || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
