package virt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestDataDriven runs testdata/*.txt against the fake libvirt. Commands:
//
//	start NAME [uuid=U] [nics=ALIAS,...] [migrated]   a domain starts; its event is handled
//	stop NAME [migrated] [lost]                       it stops; lost: no event is sent
//	refresh                                           a full re-read
//	policy NAME...                                    SetPolicyVMs
//	port VM/NIC ...                                   what Port returns
//
// Each prints the inventory's state after it (port prints its answers).
// Run with -rewrite to regenerate the expectations, then review the diff.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		f := newFake()
		inv := New(f, Config{})
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var out strings.Builder
			handle := func() {
				select {
				case ev := <-f.events:
					fmt.Fprintf(&out, "event %s %s\n", ev.Kind, ev.Domain)
					if err := inv.Handle(ev); err != nil {
						fmt.Fprintf(&out, "error: %v\n", err)
					}
				default:
					out.WriteString("no event\n")
				}
			}
			switch d.Cmd {
			case "start":
				var uuid, nics string
				d.MaybeScanArgs(t, "uuid", &uuid)
				d.MaybeScanArgs(t, "nics", &nics)
				kind := EventStarted
				if d.HasArg("migrated") {
					kind = EventMigratedIn
				}
				f.start(d.CmdArgs[0].Key, uuid, strings.Split(nics, ","), kind)
				handle()
			case "stop":
				kind := EventStopped
				if d.HasArg("migrated") {
					kind = EventMigratedOut
				}
				if d.HasArg("lost") {
					kind = EventOther
				}
				f.stop(d.CmdArgs[0].Key, kind)
				if kind != EventOther {
					handle()
				}
			case "refresh":
				if err := inv.Refresh(); err != nil {
					fmt.Fprintf(&out, "error: %v\n", err)
				}
			case "policy":
				var names []string
				for _, a := range d.CmdArgs {
					names = append(names, a.Key)
				}
				inv.SetPolicyVMs(names)
			case "port":
				for _, a := range d.CmdArgs {
					v, ok := inv.Port(a.Key)
					if !ok {
						fmt.Fprintf(&out, "%s: none\n", a.Key)
						continue
					}
					m := v.Match()
					fmt.Fprintf(&out, "%s: dev=%s mac=%s bridge=%s index=%d match.index=%d match.dev=%s\n", a.Key, v.Dev, v.MAC, v.Bridge, v.Index, m.Index, m.HostDev)
				}
				return out.String()
			default:
				t.Fatalf("unknown command %q", d.Cmd)
			}
			select {
			case <-inv.Changes():
				out.WriteString("changed\n")
			default:
			}
			out.WriteString(render(inv))
			return out.String()
		})
	})
}

// TestRunFollowsEvents: Run reads the domains that already run, then each
// start and stop reaches Changes and the inventory.
func TestRunFollowsEvents(t *testing.T) {
	f := newFake()
	f.running["old"] = "<domain><name>old</name><devices><interface type='bridge'><mac address='52:54:00:aa:00:01'/><target dev='vnet9'/></interface></devices></domain>"
	inv := New(f, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	wait := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.After(5 * time.Second) // a broken harness, not a latency check
		for !cond() {
			select {
			case <-inv.Changes():
			case <-deadline:
				t.Fatalf("%s: not seen; inventory:\n%s", what, render(inv))
			}
		}
	}
	wait("old", func() bool { _, ok := inv.Port("old/vnet9"); return ok })
	f.start("new", "", []string{"ua-nic0"}, EventStarted)
	wait("new", func() bool { v, ok := inv.Port("new/nic0"); return ok && v.Index == 1 })
	f.stop("old", EventStopped)
	wait("old gone", func() bool { _, ok := inv.Port("old/vnet9"); return !ok })
	if vms, _ := inv.VMs(); strings.Join(vms, " ") != "new" {
		t.Errorf("VMs = %v, want [new]", vms)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel: %v", err)
	}
}

// TestRunStreamLost: a closed event stream ends Run with an error, so the
// caller reconnects.
func TestRunStreamLost(t *testing.T) {
	f := newFake()
	inv := New(f, Config{})
	close(f.events)
	if err := inv.Run(context.Background()); err == nil {
		t.Fatal("Run returned nil after the event stream closed")
	}
}

func TestRefreshError(t *testing.T) {
	f := newFake()
	f.listErr = errors.New("ConnectListAllDomains: boom")
	if err := New(f, Config{}).Refresh(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Refresh = %v", err)
	}
}

// A domain that cannot be read does not keep the others out: Refresh
// says which one (a DomainsError, which the agent reports and goes on
// with) and has read the rest.
func TestRefreshDomainError(t *testing.T) {
	f := newFake()
	f.start("vm1", "", []string{"ua-nic0"}, EventStarted)
	f.start("vm2", "", []string{"ua-nic0"}, EventStarted)
	f.xmlErr = map[string]error{"vm1": errors.New("DomainGetXMLDesc vm1: boom")}
	inv := New(f, Config{})
	err := inv.Refresh()
	var de *DomainsError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "vm1: boom") {
		t.Fatalf("Refresh = %v, want a DomainsError naming vm1", err)
	}
	var names []string
	for _, d := range inv.Domains() {
		names = append(names, d.Name)
	}
	if len(names) != 1 || names[0] != "vm2" {
		t.Errorf("domains after Refresh: %v, want vm2", names)
	}
}

func TestUplinkDevice(t *testing.T) {
	inv := New(newFake(), Config{Uplinks: map[string]string{"vmnic0": "bond0"}})
	if d, err := inv.UplinkDevice("vmnic0"); err != nil || d != "bond0" {
		t.Errorf("UplinkDevice(vmnic0) = %q, %v", d, err)
	}
	if _, err := inv.UplinkDevice("vmnic1"); err == nil || !strings.Contains(err.Error(), "--uplink vmnic1=DEVICE") {
		t.Errorf("UplinkDevice(vmnic1) = %v", err)
	}
}

func TestKindOf(t *testing.T) {
	for _, c := range []struct {
		event, detail int32
		want          EventKind
	}{
		{2, 0, EventStarted}, {2, 1, EventMigratedIn}, {2, 2, EventStarted},
		{5, 0, EventStopped}, {5, 1, EventStopped}, {5, 3, EventMigratedOut},
		{8, 0, EventStopped}, {1, 0, EventStopped}, {3, 0, EventOther}, {4, 1, EventOther},
	} {
		if got := kindOf(c.event, c.detail); got != c.want {
			t.Errorf("kindOf(%d, %d) = %s, want %s", c.event, c.detail, got, c.want)
		}
	}
}

// TestUnnamedVMsLeaveThroughAnUplink: with Config.Master, a vNIC of an
// unnamed domain counts when it is on the bridge an uplink device is a
// port of, or a macvtap on an uplink device; one on another bridge sends
// nothing through the uplinks and gets no class.
func TestUnnamedVMsLeaveThroughAnUplink(t *testing.T) {
	f := newFake()
	f.running["out"] = `<domain><name>out</name><devices>
<interface type='bridge'><mac address='52:54:00:00:01:01'/><source bridge='br0'/><target dev='vnet1'/></interface>
<interface type='bridge'><mac address='52:54:00:00:01:02'/><source bridge='br-internal'/><target dev='vnet2'/></interface>
<interface type='direct'><mac address='52:54:00:00:01:03'/><source dev='bond0' mode='bridge'/><target dev='macvtap0'/></interface>
<interface type='direct'><mac address='52:54:00:00:01:04'/><source dev='eth9' mode='bridge'/><target dev='macvtap1'/></interface>
</devices></domain>`
	f.running["inside"] = `<domain><name>inside</name><devices>
<interface type='bridge'><mac address='52:54:00:00:02:01'/><source bridge='br-internal'/><target dev='vnet3'/></interface>
</devices></domain>`
	masters := map[string]string{"bond0": "br0"}
	inv := New(f, Config{Uplinks: map[string]string{"up0": "bond0"}, Master: func(d string) (string, error) { return masters[d], nil }})
	if err := inv.Refresh(); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(inv.UnnamedVMs())
	if want := "[{inside []} {out [nic0 nic2]}]"; got != want {
		t.Errorf("UnnamedVMs() = %s, want %s", got, want)
	}
	if v, ok := inv.Port("out/nic2"); !ok || v.Dev != "macvtap0" {
		t.Errorf("out/nic2 = %+v %v, want macvtap0", v, ok)
	}
}
