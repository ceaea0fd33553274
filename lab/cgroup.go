package lab

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"sluice/cpuctl"
)

// VMCgroup is the CPU cgroup of a namespace VM of the lab, relative to the
// root of the cgroup hierarchy (cpuctl.Tree): its namespace's name,
// "sl-<cluster>-<vm>" (on this machine /sys/fs/cgroup/cpu/sl-<cluster>-<vm>).
// Up creates it; tests put the processes they start in the VM's namespace
// into it (cpuctl.Tree.Attach) and the agent sets it. It is "" when the
// plan has no such VM.
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
