package agent

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"sluice/internal/ops"
	"sluice/internal/ops/opstest"
	"sluice/nicinfo"
)

// fakeNICs is a NICReader with a NIC per device; it counts reads.
type fakeNICs struct {
	nics  map[string]nicinfo.Info
	err   error
	reads int
}

func (f *fakeNICs) Read(dev string) (nicinfo.Info, error) {
	f.reads++
	return f.nics[dev], f.err
}

// tenGig is a multi-queue NIC as nicinfo reads it, with GSO as given.
func tenGig(dev string, gso bool) nicinfo.Info {
	return nicinfo.Info{Dev: dev, Driver: "ixgbe", SpeedBps: 10e9, Duplex: "full", TxQueues: 8, RxQueues: 8,
		Channels: &nicinfo.Channels{Combined: 8, MaxCombined: 63},
		Offloads: []nicinfo.Offload{{Name: "tso", On: true}, {Name: "gso", On: gso}, {Name: "gro", On: true},
			{Name: "lro", Fixed: true}, {Name: "rx", On: true}, {Name: "tx", On: true}}}
}

// TestUplinkNIC: the agent reads the uplink's NIC at its first step and
// after a Resync, not every step; the statistics carry it with the root
// qdisc sluice replaced (mq) and the warnings (GSO off, the mq root), and
// NICLog hands each warning out once while it holds. A NIC that cannot
// be read is an error in its statistics, not a failed step.
func TestUplinkNIC(t *testing.T) {
	p := mustPolicy(t, followPolicy)
	k := NewFakeKernel("sl-up0")
	k.Devs["sl-up0"].Root = Qdisc{Kind: "mq", Handle: "0:0", Default: true}
	inv := testInventory(p, "h1")
	for _, v := range inv.VNICs {
		k.Devs[v.HostDev] = &FakeDev{}
	}
	nics := &fakeNICs{nics: map[string]nicinfo.Info{"sl-up0": tenGig("sl-up0", false)}}
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true, NIC: nics})
	if err != nil {
		t.Fatal(err)
	}
	var log NICLog
	step := func(now int64) *UplinkNIC {
		t.Helper()
		if _, err := a.Step(now); err != nil {
			t.Fatal(err)
		}
		return a.Stats().Uplinks[0].NIC
	}
	gsoOff := "GSO is off on sl-up0: every packet goes down the stack MTU-sized, so CPU per Gbps sent rises (seed 001); `ethtool -K sl-up0 gso on` turns it on"
	mq := MQNote("sl-up0", 8)

	// The first step reads the NIC, and records the mq root as it
	// replaces it: its statistics say so.
	d := a.Decide(a.Measure(1e9))
	if n := d.Stats.Uplinks[0].NIC; n == nil || n.Driver != "ixgbe" || n.RootBefore != "" || !reflect.DeepEqual(n.Warnings, []string{gsoOff}) {
		t.Fatalf("first decision: NIC %+v", n)
	}
	if _, err := a.Apply(d); err != nil {
		t.Fatal(err)
	}
	n := a.Stats().Uplinks[0].NIC
	if n.RootBefore != "mq" || !reflect.DeepEqual(n.Warnings, []string{gsoOff, mq}) {
		t.Errorf("first step: root before %q, warnings %q", n.RootBefore, n.Warnings)
	}
	if d.Stats.Uplinks[0].NIC.RootBefore != "" {
		t.Error("Apply changed the decision's statistics")
	}
	if !strings.Contains(mq, "mq over 8 TX queues") || !strings.Contains(mq, "one HTB") {
		t.Errorf("mq note %q: says neither the TX queues nor the HTB", mq)
	}
	if got := log.Fresh(a.Stats()); !reflect.DeepEqual(got, []string{"uplink up0: " + gsoOff, "uplink up0: " + mq}) {
		t.Errorf("first step logs %q", got)
	}
	n = step(1.1e9)
	if n.RootBefore != "mq" || !reflect.DeepEqual(n.Warnings, []string{gsoOff, mq}) {
		t.Errorf("second step: root before %q, warnings %q", n.RootBefore, n.Warnings)
	}
	if got := log.Fresh(a.Stats()); len(got) != 0 {
		t.Errorf("second step logs %q, want nothing new", got)
	}
	for now := int64(1.2e9); now < 2e9; now += 1e8 {
		step(now)
	}
	if nics.reads != 1 {
		t.Errorf("%d reads of the NIC in 9 steps, want 1", nics.reads)
	}
	if got := log.Fresh(a.Stats()); len(got) != 0 {
		t.Errorf("nothing changed, logs %q", got)
	}

	// GSO turned on, then a change of the inventory: read again.
	nics.nics["sl-up0"] = tenGig("sl-up0", true)
	if err := a.Resync(); err != nil {
		t.Fatal(err)
	}
	n = step(2e9)
	if nics.reads != 2 || !reflect.DeepEqual(n.Warnings, []string{mq}) {
		t.Errorf("after Resync: %d reads, warnings %q", nics.reads, n.Warnings)
	}
	if got := log.Fresh(a.Stats()); len(got) != 0 {
		t.Errorf("GSO on: logs %q", got)
	}
	// Off again: logged again.
	nics.nics["sl-up0"] = tenGig("sl-up0", false)
	if err := a.SetPolicy(p); err != nil {
		t.Fatal(err)
	}
	step(2.1e9)
	if got := log.Fresh(a.Stats()); !reflect.DeepEqual(got, []string{"uplink up0: " + gsoOff}) {
		t.Errorf("GSO off again: logs %q", got)
	}

	// The metrics carry it.
	m := NewMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	m.Observe(a.Stats(), 0, nil)
	fams := opstest.Scrape(t, ops.Handler(reg, m.Ready, nil))
	for _, c := range []struct {
		name   string
		want   float64
		labels []string
	}{
		{"sluice_agent_uplink_nic_info", 1, []string{"uplink", "up0", "dev", "sl-up0", "driver", "ixgbe", "root_before", "mq"}},
		{"sluice_agent_uplink_nic_speed_bits_per_second", 10e9, []string{"uplink", "up0", "dev", "sl-up0"}},
		{"sluice_agent_uplink_nic_queues", 8, []string{"uplink", "up0", "dev", "sl-up0", "direction", "tx"}},
		{"sluice_agent_uplink_nic_channels", 8, []string{"uplink", "up0", "dev", "sl-up0", "kind", "combined"}},
		{"sluice_agent_uplink_nic_channels_max", 63, []string{"uplink", "up0", "dev", "sl-up0", "kind", "combined"}},
		{"sluice_agent_uplink_nic_offload_enabled", 0, []string{"uplink", "up0", "dev", "sl-up0", "offload", "gso"}},
		{"sluice_agent_uplink_nic_offload_enabled", 1, []string{"uplink", "up0", "dev", "sl-up0", "offload", "tso"}},
		{"sluice_agent_uplink_nic_warnings", 2, []string{"uplink", "up0", "dev", "sl-up0"}},
	} {
		if got, ok := fams.Value(c.name, c.labels...); !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	if _, ok := fams.Value("sluice_agent_uplink_nic_channels", "uplink", "up0", "dev", "sl-up0", "kind", "rx"); ok {
		t.Error("rx channels exported for a NIC without rx channels")
	}
	opstest.Lint(t, reg)

	// A NIC that cannot be read: an error in the statistics, logged
	// once, read again a second later until it can be.
	nics.err = errors.New("LinkByName sl-up0: Link not found")
	_ = a.Resync()
	n = step(3e9)
	if n.Error != nics.err.Error() {
		t.Errorf("NIC error %q", n.Error)
	}
	if got := log.Fresh(a.Stats()); !reflect.DeepEqual(got, []string{"uplink up0: reading its NIC: " + nics.err.Error()}) {
		t.Errorf("read error logs %q", got)
	}
	reads := nics.reads
	for now := int64(3.1e9); now <= 4e9; now += 1e8 {
		step(now)
	}
	if got := log.Fresh(a.Stats()); len(got) != 0 {
		t.Errorf("the same error again logs %q", got)
	}
	if nics.reads != reads+1 {
		t.Errorf("%d reads in the second after a failed one, want 1", nics.reads-reads)
	}
	nics.err = nil
	for now := int64(4.1e9); now <= 5.1e9; now += 1e8 {
		step(now)
	}
	if n := a.Stats().Uplinks[0].NIC; n.Error != "" || nics.reads != reads+2 {
		t.Errorf("after the device came back: error %q, %d more reads, want 2", n.Error, nics.reads-reads)
	}
}

// TestNoNICReader: without Config.NIC the statistics have no NIC and the
// metrics no NIC series.
func TestNoNICReader(t *testing.T) {
	p := mustPolicy(t, followPolicy)
	k := NewFakeKernel("sl-up0")
	inv := testInventory(p, "h1")
	for _, v := range inv.VNICs {
		k.Devs[v.HostDev] = &FakeDev{}
	}
	a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Step(1e9); err != nil {
		t.Fatal(err)
	}
	if n := a.Stats().Uplinks[0].NIC; n != nil {
		t.Errorf("NIC %+v without a reader", n)
	}
}

// TestSlowLink: a NIC that reports a link slower than the policy's line
// rate is a warning; a faster one (a lab veth's 10 Gb/s under a 1 Gbps
// uplink) is not.
func TestSlowLink(t *testing.T) {
	for _, c := range []struct {
		linkBps int64
		warn    bool
	}{{100e6, true}, {1e9, false}, {10e9, false}, {0, false}} {
		p := mustPolicy(t, followPolicy)
		k := NewFakeKernel("sl-up0")
		inv := testInventory(p, "h1")
		for _, v := range inv.VNICs {
			k.Devs[v.HostDev] = &FakeDev{}
		}
		info := tenGig("sl-up0", true)
		info.SpeedBps = c.linkBps
		nics := &fakeNICs{nics: map[string]nicinfo.Info{"sl-up0": info}}
		a, err := New(Config{Policy: p, Host: "h1", Kernel: k, Inventory: inv, Dynamic: true, NIC: nics})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Step(1e9); err != nil {
			t.Fatal(err)
		}
		var want []string
		if c.warn {
			want = []string{SlowLinkNote("sl-up0", c.linkBps, 1e9)}
		}
		if got := a.Stats().Uplinks[0].NIC.Warnings; !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
			t.Errorf("link %d bit/s: warnings %q, want %q", c.linkBps, got, want)
		}
	}
	want := "sl-up0 reports a 100Mb/s link, below the policy's line rate 1Gbps: HTB's root lets more through than the link carries"
	if got := SlowLinkNote("sl-up0", 100e6, 1e9); !strings.HasPrefix(got, want) {
		t.Errorf("note %q", got)
	}
}
