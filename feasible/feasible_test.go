package feasible_test

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"sluice/feasible"
	"sluice/policy"
)

// TestDataDriven runs testdata/*.txt. Commands:
//
//	host NAME [cores=N] [hostcores=N] [mhz=N] [memory=SIZE] [cap=F] [vm=RATE] [other=RATE] [invm=RATE] [inother=RATE]
//	                input: one uplink per line, "NAME SPEED [down]"; the
//	                budgets follow from the classes (feasible.Classes), the
//	                inbound ones from the inbound classes (invm, inother;
//	                printed when one is given)
//	add             input: VMs, one per line (see parseVM), counted on the host
//	remove VM       takes VM off the host
//	fit             input: VMs; for each, "fits" or its reasons (feasible.Why)
//	problems        why the host cannot meet its VMs' reservations
//	assign          input: vNICs "NAME=RATE[@UPLINK]"; the packer's uplink of each
//
// add and remove print the load and the packing per uplink. The harness
// recomputes the packing afresh (feasible.Assign) after every step and
// checks that fit agrees with a fresh packing of the VM and the host's
// vNICs; a disagreement prints a VIOLATION line.
func TestDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &harness{vms: map[string]*feasible.VM{}}
		datadriven.RunTest(t, path, h.run)
	})
}

type harness struct {
	host feasible.Host
	load feasible.Load
	vms  map[string]*feasible.VM // counted on the host
	n    int                     // VMs parsed so far (file order)
	s    feasible.Scratch
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "host":
		return h.newHost(t, d)
	case "add":
		for _, line := range lines(d.Input) {
			v := h.parseVM(t, line)
			h.load.Add(&h.host, v)
			h.vms[v.Name] = v
		}
		return h.state()
	case "remove":
		name := d.CmdArgs[0].Key
		v, ok := h.vms[name]
		if !ok {
			d.Fatalf(t, "no VM %s", name)
		}
		h.load.Remove(&h.host, v)
		delete(h.vms, name)
		return h.state()
	case "fit":
		var b strings.Builder
		for _, line := range lines(d.Input) {
			v := h.parseVM(t, line)
			h.n-- // not counted: the next VM takes its place in file order
			why := feasible.Why(&h.host, &h.load, v, &h.s)
			fits := feasible.Fits(&h.host, &h.load, v, &h.s)
			if fits != (len(why) == 0) {
				fmt.Fprintf(&b, "VIOLATION: Fits %v but %d reasons\n", fits, len(why))
			}
			if fits && !h.freshFits(v) {
				fmt.Fprintf(&b, "VIOLATION: %s fits, but a fresh packing has a misfit\n", v.Name)
			}
			if len(why) == 0 {
				fmt.Fprintf(&b, "%s: fits\n", v.Name)
			}
			for _, r := range why {
				fmt.Fprintf(&b, "%s: %s [%s %s]\n", v.Name, r.Text, r.Check, r.NIC)
			}
		}
		return b.String()
	case "problems":
		var vms []*feasible.VM
		for _, v := range h.vms {
			vms = append(vms, v)
		}
		sort.Slice(vms, func(i, j int) bool { return vms[i].Name < vms[j].Name })
		ps := feasible.Problems(&h.host, &h.load, vms)
		if len(ps) == 0 {
			return "none\n"
		}
		return strings.Join(ps, "\n") + "\n"
	case "assign":
		var nics []feasible.NIC
		for i, f := range strings.Fields(strings.Join(lines(d.Input), " ")) {
			nics = append(nics, parseNIC(t, f, 0, i))
		}
		at, misfits := feasible.Assign(&h.host, nics)
		var b strings.Builder
		for i, n := range nics {
			u := "-"
			if at[i] >= 0 {
				u = h.host.Uplinks[at[i]].Name
			}
			fmt.Fprintf(&b, "%s %s\n", n.Name, u)
		}
		fmt.Fprintf(&b, "misfits %d\n", misfits)
		return b.String()
	}
	d.Fatalf(t, "unknown command %s", d.Cmd)
	return ""
}

func (h *harness) newHost(t *testing.T, d *datadriven.TestData) string {
	var c, in feasible.Classes
	showIn := false
	h.host = feasible.Host{Name: d.CmdArgs[0].Key}
	h.load = feasible.Load{}
	h.vms = map[string]*feasible.VM{}
	h.n = 0
	for _, a := range d.CmdArgs[1:] {
		v := a.Vals[0]
		switch a.Key {
		case "cores":
			h.host.Cores = atoi(t, v)
		case "hostcores":
			h.host.HostCores = atoi(t, v)
		case "mhz":
			h.host.CoreMHz = int64(atoi(t, v))
		case "memory":
			h.host.MemoryBytes = size(t, v)
		case "cap":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			c.Cap = f
		case "vm":
			c.VMBps = rate(t, v)
		case "other":
			c.OtherBps = rate(t, v)
		case "invm":
			in.VMBps, showIn = rate(t, v), true
		case "inother":
			in.OtherBps, showIn = rate(t, v), true
		default:
			d.Fatalf(t, "unknown host argument %s", a.Key)
		}
	}
	for _, line := range lines(d.Input) {
		f := strings.Fields(line)
		u := c.Uplink(f[0], rate(t, f[1]), len(f) > 2 && f[2] == "down")
		in.Cap = c.Cap
		u.InBudgetBps, u.InWhy = in.Budget(rate(t, f[1])), in.BudgetWhy(rate(t, f[1]))
		h.host.Uplinks = append(h.host.Uplinks, u)
	}
	var b strings.Builder
	for _, u := range h.host.Uplinks {
		fmt.Fprintf(&b, "%s budget %s (%s)", u.Name, feasible.Rate(u.BudgetBps), u.Why)
		if showIn {
			fmt.Fprintf(&b, ", inbound %s (%s)", feasible.Rate(u.InBudgetBps), u.InWhy)
		}
		if u.Down {
			b.WriteString(" down")
		}
		b.WriteString("\n")
	}
	if b.Len() == 0 {
		b.WriteString("no uplinks\n")
	}
	return b.String()
}

// parseVM parses "NAME [vcpus=N] [cpu=MHZ] [mem=SIZE] [sensitive] [NIC=RATE[@UPLINK][:INRATE] ...]"
// (INRATE: the vNIC's inbound reservation; sensitive: latency-sensitive,
// its vCPUs pinned to cores of their own).
func (h *harness) parseVM(t *testing.T, line string) *feasible.VM {
	f := strings.Fields(line)
	v := &feasible.VM{Name: f[0], VCPUs: 1}
	k := 0
	for _, kv := range f[1:] {
		key, val, _ := strings.Cut(kv, "=")
		switch key {
		case "vcpus":
			v.VCPUs = atoi(t, val)
		case "cpu":
			v.CPUMHz = int64(atoi(t, val))
		case "mem":
			v.MemoryBytes = size(t, val)
		case "sensitive":
			v.Pinned = true
		default:
			v.NICs = append(v.NICs, parseNIC(t, kv, h.n, k))
			k++
		}
	}
	feasible.SortNICs(v.NICs)
	h.n++
	return v
}

func parseNIC(t *testing.T, s string, vm, index int) feasible.NIC {
	name, val, _ := strings.Cut(s, "=")
	val, inRate, _ := strings.Cut(val, ":")
	r, pin, _ := strings.Cut(val, "@")
	n := feasible.NIC{Name: name, ReservationBps: rate(t, r), Uplink: pin, VM: vm, Index: index}
	if inRate != "" {
		n.InReservationBps = rate(t, inRate)
	}
	return n
}

// state prints the load and the packing, and checks it against a fresh one.
func (h *harness) state() string {
	var b strings.Builder
	l := &h.load
	fmt.Fprintf(&b, "load: cpu %s, memory %s, vNICs %s, wide %d, misfits %d\n",
		feasible.MHz(l.CPUMHz), feasible.Size(l.MemoryBytes), feasible.Rate(l.NetBps), l.Wide, l.Misfits(&h.host))
	used := l.UsedBps(&h.host)
	for j, u := range h.host.Uplinks {
		fmt.Fprintf(&b, "  %s %s of %s\n", u.Name, feasible.Rate(used[j]), feasible.Rate(u.BudgetBps))
	}
	fresh, misfits := feasible.Assign(&h.host, l.NICs)
	freshUsed := make([]int64, len(h.host.Uplinks))
	for i, j := range fresh {
		if j >= 0 {
			freshUsed[j] += l.NICs[i].ReservationBps
		}
	}
	if misfits != l.Misfits(&h.host) || fmt.Sprint(freshUsed) != fmt.Sprint(used) {
		fmt.Fprintf(&b, "VIOLATION: a fresh packing gives %v with %d misfits\n", freshUsed, misfits)
	}
	if l.InBps > 0 {
		fmt.Fprintf(&b, "inbound: %s\n", feasible.Rate(l.InBps))
	}
	if l.PinnedCores > 0 {
		fmt.Fprintf(&b, "pinned cores: %d of %d (%d kept for the host)\n", l.PinnedCores, h.host.Cores, h.host.HostCores)
	}
	fmt.Fprintf(&b, "holds: %v\n", feasible.Holds(&h.host, l))
	return b.String()
}

// freshFits packs the host's vNICs and v's afresh.
func (h *harness) freshFits(v *feasible.VM) bool {
	nics := append(append([]feasible.NIC(nil), h.load.NICs...), v.NICs...)
	_, misfits := feasible.Assign(&h.host, nics)
	return misfits == 0
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func atoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func rate(t *testing.T, s string) int64 {
	r, err := policy.ParseRate(s)
	if err != nil {
		t.Fatal(err)
	}
	return int64(r)
}

func size(t *testing.T, s string) int64 {
	r, err := policy.ParseSize(s)
	if err != nil {
		t.Fatal(err)
	}
	return int64(r)
}
