package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sluice/controller"
)

// explainPolicy has every part of an explanation: Fig. 2 step a with an
// ingress setting on vm1's vNIC (outbound and inbound parts), CPU figures
// (cpu lines; h2 with a measured cost of sending), a system class and a
// disk (driver line).
const explainPolicy = `cluster: fig2
hosts:
  - name: h1
    cpu: {cores: 16, mhz: 2600}
    memory: 128GiB
    uplinks: [{name: vmnic0, speed: 10Gbps, usable: 9.4Gbps}]
  - name: h2
    cpu: {cores: 4, mhz: 2600, sendMHzPerGbps: 300, sendOverheadMHz: 50}
    memory: 128GiB
    uplinks: [{name: vmnic0, speed: 10Gbps, usable: 9.4Gbps}]
trafficClasses:
  vm: {shares: normal}
  nfs: {shares: normal, ingress: {shares: high}}
datastores:
  - name: nfs1
    driver: throttle
    array: {slots: 8, serviceTime: 5ms}
vms:
  - {name: vm1, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0, reservation: 7.5Gbps, ingress: {reservation: 2Gbps}}], disks: [{name: disk0, datastore: nfs1}]}
  - {name: vm2, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0}]}
  - {name: vm3, host: h1, cpu: {vcpus: 2}, memory: 4GiB, nics: [{name: nic0}]}
  - {name: vm4, host: h2, cpu: {vcpus: 1, limitMHz: 1000}, memory: 4GiB, nics: [{name: nic0}], disks: [{name: disk0, datastore: nfs1, shares: 2000}]}
`

// TestExplainSameAsController: `sluice explain FILE PORT` and the
// controller's explain (`sluice ctl explain PORT`, the console) say the
// same lines for the same policy and placement (every VM on its policy
// host, no agent), both through package explain; only the CLI may end a
// disk's explanation with what the throttle driver of its host says, and
// a port's with what its host's agent read of its uplink's NIC
// (host-local lines, "live, …"). A name that is no port is an error of
// both.
func TestExplainSameAsController(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "fig2.yaml")
	if err := os.WriteFile(file, []byte(explainPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := controller.OpenEtcd(controller.EtcdConfig{Dir: filepath.Join(dir, "etcd"), UnsafeNoFsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	c := controller.New(controller.Config{Client: e.Client, Prefix: "/explain-test/"})
	if _, err := c.Apply(ctx, controller.ApplyRequest{File: "fig2.yaml", Document: explainPolicy}); err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"vm1/nic0", "vm2/nic0", "vm4/nic0", "h1/vm", "h2/nfs", "h1/vmnic0/nfs", "vm1/disk0", "vm4/disk0"} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"explain", file, port}, &stdout, &stderr); code != exitOK {
			t.Fatalf("sluice explain %s: exit %d: %s", port, code, stderr.String())
		}
		cli := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
		ex, err := c.Explain(ctx, port)
		if err != nil {
			t.Fatalf("controller explain %s: %v", port, err)
		}
		if len(ex.Lines) > len(cli) || !slices.Equal(ex.Lines, cli[:len(ex.Lines)]) ||
			(len(cli) > len(ex.Lines) && !strings.HasPrefix(cli[len(ex.Lines)], "live, ")) {
			t.Errorf("%s: the controller says\n%s\nsluice explain says\n%s", port, strings.Join(ex.Lines, "\n"), strings.Join(cli, "\n"))
		}
	}
	// Every kind of line is there.
	for port, want := range map[string]string{"vm1/nic0": "inbound (what vm1/nic0 receives):", "vm2/nic0": "what it receives is not controlled",
		"vm4/nic0": "(measured on h2, cpu.sendMHzPerGbps)", "vm1/disk0": "driver: throttle (datastore nfs1 says so)"} {
		if ex, _ := c.Explain(ctx, port); !slices.ContainsFunc(ex.Lines, func(l string) bool { return strings.Contains(l, want) }) {
			t.Errorf("%s: no line with %q:\n%s", port, want, strings.Join(ex.Lines, "\n"))
		}
	}
	if code := run([]string{"explain", file, "vm1/nic9"}, new(bytes.Buffer), new(bytes.Buffer)); code != exitBad {
		t.Errorf("sluice explain vm1/nic9: exit %d, want %d", code, exitBad)
	}
	if _, err := c.Explain(ctx, "vm1/nic9"); controller.StatusOf(err) != http.StatusNotFound {
		t.Errorf("controller explain vm1/nic9: %v, want 404", err)
	}
}
