package controller

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"sluice/entitle"
	"sluice/placement"
	"sluice/policy"
)

// world is the cluster state the decisions of testdata/decide/ act on,
// in memory: what the controller keeps in etcd, and the agents' reports.
type world struct {
	doc       PolicyState
	p         *policy.Policy
	place     placement.Placement
	starting  map[string]Start
	history   map[string]placement.LastMove
	reports   map[string]*Report
	decisions []Decision
	seq       int64
	now       time.Time
}

func (w *world) view() view {
	c := &Controller{cfg: Config{Now: func() time.Time { return w.now }}}
	st := &state{doc: w.doc, p: w.p, place: w.place, starting: w.starting, history: w.history}
	return c.viewOf(st, w.reports)
}

// take applies n as the commit would, and renders it.
func (w *world) take(n *next, err error) string {
	var b strings.Builder
	if n != nil {
		w.doc, w.p, w.place, w.starting = n.doc, n.p, n.place, n.starting
		if n.history != nil {
			w.history = n.history
		}
		for _, d := range n.decisions {
			w.seq++
			d.Seq, d.Time = w.seq, w.now
			w.decisions = append(w.decisions, d)
		}
		for _, d := range n.rewrites {
			for i := range w.decisions {
				if w.decisions[i].Seq == d.Seq {
					w.decisions[i].Status = d.Status
				}
			}
		}
		b.WriteString(n.summary())
	}
	if err != nil {
		fmt.Fprintf(&b, "refused: %v\n", err)
	}
	if b.Len() == 0 {
		b.WriteString("nothing to write\n")
	}
	return b.String()
}

// vms renders every VM's desired host, observed host and state, and the
// reservations each host holds.
func (w *world) vms() string {
	v := w.view()
	var b strings.Builder
	for i := range w.p.VMs {
		vm := &w.p.VMs[i]
		st, _ := v.state(vm.Name)
		fmt.Fprintf(&b, "%s: placed %q, runs on %q: %s\n", vm.Name, v.place[vm.Name], v.runsOn(vm.Name), st)
	}
	held := map[string]float64{}
	for _, u := range entitle.Derive(w.p, entitle.Live{Hosts: v.holding()}).Uplinks {
		for _, c := range u.Classes {
			for _, n := range c.VNICs {
				held[u.Host] += n.ReservationBps
			}
		}
	}
	for _, h := range w.p.Hosts {
		fmt.Fprintf(&b, "%s holds %s of vNIC reservations\n", h.Name, entitle.FormatBps(held[h.Name]))
	}
	return b.String()
}

// whatIf runs decision d as WhatIf does (Controller.run, whatIfOf) on
// the world, which it leaves as it was, and renders the answer.
func (w *world) whatIf(d func(v view) (*next, error), mode DRSMode) string {
	c := &Controller{cfg: Config{Now: func() time.Time { return w.now }, DRS: mode}}
	st := &state{doc: w.doc, p: w.p, place: w.place, starting: w.starting, history: w.history}
	n, after, derr := c.run(st, st, w.reports, true, d)
	res, err := c.whatIfOf(st, w.reports, n, after, derr)
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	var b strings.Builder
	if !res.Admitted {
		fmt.Fprintf(&b, "refused: %s\n", res.Refusal)
		return b.String()
	}
	fmt.Fprintf(&b, "admitted (DRS %s)\n", res.DRS)
	for _, e := range res.Events {
		fmt.Fprintf(&b, "event %s %s: %s\n", e.Kind, e.Subject, e.Message)
	}
	for _, m := range res.Moves {
		fmt.Fprintf(&b, "move %s %s→%s %s\n", m.VM, m.From, m.To, m.Status)
	}
	for _, h := range res.Hosts {
		fmt.Fprintf(&b, "host %s runs %s\n", h.Host, strings.Join(h.VMs, " "))
	}
	for _, r := range res.Rates {
		fmt.Fprintf(&b, "rate %s %s on %s → %s on %s\n", r.Port, entitle.FormatBps(r.BeforeBps), r.BeforeUplink, entitle.FormatBps(r.AllocBps), r.Uplink)
	}
	for _, f := range res.Faults {
		fmt.Fprintf(&b, "still a fault: %s\n", f)
	}
	return b.String()
}

func TestDecide(t *testing.T) {
	datadriven.Walk(t, "testdata/decide", func(t *testing.T, path string) {
		w := &world{place: placement.Placement{}, reports: map[string]*Report{}, now: time.Unix(1_800_000_000, 0)}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(key string) string {
				for _, a := range d.CmdArgs {
					if a.Key == key && len(a.Vals) > 0 {
						return a.Vals[0]
					}
				}
				return ""
			}
			list := func(key string) []string {
				var out []string
				for _, a := range d.CmdArgs {
					if a.Key == key {
						for _, v := range a.Vals {
							for _, x := range strings.Split(v, ",") {
								if x != "" {
									out = append(out, x)
								}
							}
						}
					}
				}
				return out
			}
			switch d.Cmd {
			case "apply":
				p, err := policy.Parse("policy.yaml", []byte(d.Input))
				if err != nil {
					return "error: " + err.Error() + "\n"
				}
				return w.take(w.view().applyDoc("policy.yaml", d.Input, "", p), nil)
			case "report":
				host := arg("host")
				r := &Report{VMs: list("vms"), Unnamed: list("unnamed"), Failed: map[string]string{}}
				slices.Sort(r.VMs)
				for _, f := range list("failed") {
					vm, why, _ := strings.Cut(f, ":")
					r.Failed[vm] = why
				}
				for _, c := range list("capacity") {
					ds, iops, _ := strings.Cut(c, ":")
					v, err := strconv.ParseFloat(iops, 64)
					if err != nil {
						t.Fatalf("capacity %q: %v", c, err)
					}
					if r.CapacityIOPS == nil {
						r.CapacityIOPS = map[string]float64{}
					}
					r.CapacityIOPS[ds] = v
				}
				old := w.reports[host]
				w.reports[host] = r
				return w.take(w.view().report(host, old, r, w.decisions), nil)
			case "agent-gone":
				delete(w.reports, arg("host"))
				return "ok\n"
			case "set", "what-if":
				var chs []placement.Change
				for _, spec := range strings.Fields(d.Input) {
					ch, err := placement.ParseChange(spec)
					if err != nil {
						return "error: " + err.Error() + "\n"
					}
					chs = append(chs, ch)
				}
				mode := DRSMode(arg("drs"))
				if mode == "" {
					mode = DRSManual
				}
				if d.Cmd == "what-if" {
					return w.whatIf(func(v view) (*next, error) { return v.set(chs, "", mode) }, mode)
				}
				return w.take(w.view().set(chs, "", mode))
			case "power-on":
				return w.take(w.view().powerOn(arg("vm"), arg("on"), "", true))
			case "migrate":
				return w.take(w.view().migrate(arg("vm"), arg("to"), ""))
			case "admit":
				n, ans, err := w.view().admit(arg("vm"), AdmitRequest{Host: arg("on"), UUID: arg("uuid")})
				if err != nil {
					return w.take(nil, err)
				}
				out := fmt.Sprintf("allow %v vm %s: %s\n", ans.Allow, ans.VM, ans.Why)
				for _, d := range ans.Details {
					out += "  " + d + "\n"
				}
				if n == nil {
					return out + "nothing to write\n"
				}
				return out + w.take(n, nil)
			case "approve":
				seq, _ := strconv.ParseInt(arg("seq"), 10, 64)
				for _, dec := range w.decisions {
					if dec.Seq == seq {
						return w.take(w.view().approve(dec, ""))
					}
				}
				return "no such decision\n"
			case "drs":
				mode := DRSMode(arg("drs"))
				if mode == "" {
					mode = DRSManual
				}
				th, _ := strconv.Atoi(arg("threshold"))
				return w.take(w.view().drs(placement.Demand{}, w.decisions, max(th, 1), mode), nil)
			case "tick":
				dur, err := time.ParseDuration(arg("by"))
				if err != nil {
					t.Fatal(err)
				}
				w.now = w.now.Add(dur)
				return "ok\n"
			case "vms":
				return w.vms()
			case "desired":
				host := arg("host")
				dh := desiredOf(w.p, w.place, w.starting, nil)[host]
				if dh == nil || len(dh.VMs) == 0 {
					return "nothing placed\n"
				}
				return fmt.Sprintf("vms %v starting %v moves %v cpu %v\n", dh.VMs, dh.Starting, dh.Moves, dh.CPU)
			}
			t.Fatalf("unknown command %s", d.Cmd)
			return ""
		})
	})
}
