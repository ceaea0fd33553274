package top

import (
	"errors"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"sluice/agent"
	"sluice/storage"
)

// snapshot is host h1 with two VMs on a 1 Gbps uplink (usable 940 Mbps),
// vm1 with CPU and a disk.
func snapshot() Snapshot {
	at := time.Unix(1000, 0)
	return Snapshot{At: at, Agent: &agent.Stats{Cluster: "c", Host: "h1", Dynamic: true, NowNs: at.Add(-300 * time.Millisecond).UnixNano(),
		Uplinks: []agent.UplinkStat{{Uplink: "up0", Dev: "eth0", SpeedBps: 1e9, UsableBps: 940e6, Ports: []agent.PortStat{
			{Port: "vm1/nic0", RateBps: 800e6, EntitlementBps: 750e6, ReservationBps: 750e6, Shares: 50, Queued: 3},
			{Port: "vm2/nic0", RateBps: 200e6, EntitlementBps: 190e6, Shares: 50},
			{Port: "h1/vmotion", EntitlementBps: 0, Shares: 50},
		}}},
		CPU: []agent.CPUStat{{VM: "vm1", EntitlementMHz: 2000, Reason: "reservation", UsedPct: 95, ReadyPct: 4.5, ThrottledPct: 1}, {VM: "vm3", UsedPct: 10}},
	}, Gateways: []storage.Status{{Host: "h1", Disks: []storage.DiskStatus{{Disk: "vm1/d0", IOPS: 480, EntitlementIOPS: 500, LatencyMeanMs: 2.5}}}}}
}

// TestRows: a row per port with payload rates (wire × usable/speed), the
// VM's CPU and disks joined, and a row for a VM with CPU but no vNIC.
func TestRows(t *testing.T) {
	rows := Rows(snapshot())
	if len(rows) != 4 {
		t.Fatalf("%d rows: %+v", len(rows), rows)
	}
	r := rows[0]
	if r.Port != "vm1/nic0" || r.RateBps != 752e6 || !r.HasCPU || r.CPUReadyPct != 4.5 || r.Disks != 1 || r.IOPS != 480 {
		t.Errorf("vm1/nic0: %+v", r)
	}
	if rows[3].VM != "vm3" || rows[3].Port != "-" || !rows[3].HasCPU {
		t.Errorf("vm3: %+v", rows[3])
	}
}

// TestSortAndKeys: keys choose the sort column; numbers sort busiest
// first; ↓ selects the next row, whose reasons are shown.
func TestSortAndKeys(t *testing.T) {
	s := snapshot()
	m := NewModel(func() Snapshot { return s }, time.Second, ByName)
	key := func(k string) {
		var msg tea.KeyMsg
		switch k {
		case "down":
			msg = tea.KeyMsg{Type: tea.KeyDown}
		default:
			msg = tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune(k)}
		}
		m.Update(msg)
	}
	order := func() string {
		var ports []string
		for _, l := range strings.Split(m.View(), "\n") {
			// Rows begin with the selection mark (" " or ">"), then the VM.
			if f := strings.Fields(l); (strings.HasPrefix(l, " ") || strings.HasPrefix(l, ">")) && len(f) > 10 {
				ports = append(ports, f[1])
			}
		}
		return strings.Join(ports, " ")
	}
	if got := order(); got != "- h1/vmotion vm1/nic0 vm2/nic0" {
		t.Errorf("by name: %s", got)
	}
	key("r")
	if got := order(); got != "vm1/nic0 vm2/nic0 - h1/vmotion" {
		t.Errorf("by rate: %s", got)
	}
	key("y")
	if got := order(); !strings.HasPrefix(got, "vm1/nic0") {
		t.Errorf("by ready: %s", got)
	}
	key("r")
	key("down")
	if v := m.View(); !strings.Contains(v, ">vm2") || !strings.Contains(v, "vm2/nic0 on up0: entitled 190.0 Mbps (reservation 0.0 Mbps, shares 50, limit unlimited), measured 188.0 Mbps") {
		t.Errorf("after ↓:\n%s", v)
	}
	if _, cmd := m.Update(tea.KeyMsg{Type: tea.KeyRunes, Runes: []rune("q")}); cmd == nil {
		t.Error("q does not quit")
	}
}

// TestControllerView: the controller's view has a row per port with its
// host in the HOST column, sorts like a host's, and says where the reason
// is; an unreachable controller is one line.
func TestControllerView(t *testing.T) {
	at := time.Unix(2000, 0)
	s := Snapshot{At: at, Controller: "https://127.0.0.1:7443", Ports: []PortSample{
		{Host: "h1", Port: "vm1/nic0", EntitledBps: 750e6, MeasuredBps: 740e6, At: at},
		{Host: "h2", Port: "vm2/nic0", EntitledBps: 1e9, MeasuredBps: 990e6, At: at},
	}}
	out := Render(s, View{Sort: ByEntitled})
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[0], "2 ports on 2 hosts") || !strings.Contains(out, "HOST") {
		t.Errorf("header:\n%s", out)
	}
	first := -1
	for i, l := range lines {
		if f := strings.Fields(strings.TrimPrefix(l, ">")); len(f) >= 5 && f[1] == "vm2/nic0" {
			first = i
			if f[2] != "h2" || f[3] != "1000.0" || f[4] != "990.0" {
				t.Errorf("vm2/nic0's row: %q", l)
			}
		}
	}
	if first < 0 || !strings.HasPrefix(lines[first], ">") || !strings.Contains(out, "sluice ctl explain vm2/nic0") {
		t.Errorf("sorted by entitlement, vm2/nic0 first and selected, with where its reason is:\n%s", out)
	}
	s.Err, s.Ports = errors.New("connection refused"), nil
	if out := Render(s, View{}); !strings.Contains(out, "no view from the controller: connection refused") {
		t.Errorf("unreachable:\n%s", out)
	}
}
