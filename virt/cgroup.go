package virt

import (
	"os"
	"path"
	"strings"
)

// ProcCgroup resolves a running domain's cgroup directory from its QEMU
// process: libvirt's pid file (/run/libvirt/qemu/NAME.pid), then
// /proc/PID/cgroup. It returns the cpu controller's directory of the
// domain (cgroup v1: /sys/fs/cgroup/cpu/...; v2: /sys/fs/cgroup/...),
// without libvirt's emulator sub-group, or "" when it cannot tell.
func ProcCgroup(d Domain) string {
	pid, err := os.ReadFile("/run/libvirt/qemu/" + d.Name + ".pid")
	if err != nil {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/cgroup")
	if err != nil {
		return ""
	}
	v2root := "/sys/fs/cgroup/unified"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		v2root = "/sys/fs/cgroup"
	}
	return cgroupDir(string(b), v2root)
}

// cgroupDir picks the cpu controller's directory from /proc/PID/cgroup: the
// v1 line naming cpu when there is one, else the v2 line.
func cgroupDir(procCgroup, v2root string) string {
	v2 := ""
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2 = path.Join(v2root, trimEmulator(f[2]))
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			if c == "cpu" {
				return path.Join("/sys/fs/cgroup/cpu", trimEmulator(f[2]))
			}
		}
	}
	return v2
}

func trimEmulator(p string) string {
	return strings.TrimSuffix(p, "/emulator")
}
