package controller

import (
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"sluice/entitle"
	"sluice/policy"
)

// The rate history the web console charts: each host report's measured
// rate per port beside the port's entitlement at that time, in memory
// only (a restarted controller starts an empty history) and bounded.
const (
	// HistoryWindow is how far back the history of a port reaches.
	HistoryWindow = 10 * time.Minute
	// HistorySamples is the most samples kept per port (a report a second
	// for HistoryWindow).
	HistorySamples = 600
	// HistoryPorts is the most ports with a history: a port is recorded
	// only when it is on the trees of the reporting host's desired state,
	// and a port beyond this many is not recorded.
	HistoryPorts = 4096
)

// Sample is one report's measured rate of a port and its entitlement then.
type Sample struct {
	Time time.Time `json:"time"`
	Host string    `json:"host"`
	// MeasuredBps is what the host's agent measured (bits/s); EntitledBps
	// what the host's desired state entitles the port to with the VMs the
	// report says run there, every demand unbounded (sluice alloc's rate).
	MeasuredBps float64 `json:"measured_bps"`
	EntitledBps float64 `json:"entitled_bps"`
}

// PortHistory is the samples of one port, oldest first.
type PortHistory struct {
	Port    string   `json:"port"`
	Samples []Sample `json:"samples"`
}

// History is what GET /v1/history answers.
type History struct {
	WindowSeconds int           `json:"window_s"`    // HistoryWindow
	MaxSamples    int           `json:"max_samples"` // HistorySamples
	Ports         []PortHistory `json:"ports"`
}

// rateHistory keeps a ring of samples per port, and each host's last
// entitlements with what they were computed from.
type rateHistory struct {
	mu    sync.Mutex
	rings map[string]*ring
	ents  map[string]entitled
}

// entitled is the entitlements of a host's ports for a policy, a
// placement and the VMs running there: reports that change none of them
// (the most) reuse them rather than derive the host again.
type entitled struct {
	p       *policy.Policy
	place   uintptr // the placement map's identity (a new state has a new map)
	running string
	bps     map[string]float64
}

// ring is a port's last HistorySamples samples: next is where the next
// one goes; full once it wrapped.
type ring struct {
	s    [HistorySamples]Sample
	next int
	full bool
}

func (r *ring) add(s Sample) {
	r.s[r.next] = s
	if r.next++; r.next == len(r.s) {
		r.next, r.full = 0, true
	}
}

// since returns the samples at or after from, oldest first.
func (r *ring) since(from time.Time) []Sample {
	var all []Sample
	if r.full {
		all = append(all, r.s[r.next:]...)
	}
	all = append(all, r.s[:r.next]...)
	i := sort.Search(len(all), func(i int) bool { return !all[i].Time.Before(from) })
	return all[i:]
}

// record adds one sample per port of rates that has an entitlement in
// entitled, at t.
func (h *rateHistory) record(host string, t time.Time, rates, entitled map[string]float64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rings == nil {
		h.rings = map[string]*ring{}
	}
	for port, m := range rates {
		e, ok := entitled[port]
		if !ok {
			continue
		}
		r := h.rings[port]
		if r == nil {
			if len(h.rings) >= HistoryPorts {
				continue
			}
			r = &ring{}
			h.rings[port] = r
		}
		r.add(Sample{Time: t, Host: host, MeasuredBps: m, EntitledBps: e})
	}
}

// get returns the history of port ("" every port) from now-HistoryWindow
// on, ports in name order; ports without a sample in the window are left
// out.
func (h *rateHistory) get(port string, now time.Time) History {
	out := History{WindowSeconds: int(HistoryWindow / time.Second), MaxSamples: HistorySamples, Ports: []PortHistory{}}
	h.mu.Lock()
	defer h.mu.Unlock()
	from := now.Add(-HistoryWindow)
	for _, name := range sortedKeys(h.rings) {
		if port != "" && name != port {
			continue
		}
		if s := h.rings[name].since(from); len(s) > 0 {
			out.Ports = append(out.Ports, PortHistory{Port: name, Samples: s})
		}
	}
	return out
}

// entitledOn is what the desired state of host (its part of p with the
// VMs placed there, place) entitles each port to with the VMs running
// there (every demand unbounded), as its agent derives its trees.
func entitledOn(p *policy.Policy, place map[string]string, host string, running []string) map[string]float64 {
	part := entitle.HostParts(p, place, map[string]bool{host: true})[host]
	if part == nil {
		return nil
	}
	live := entitle.Live{Hosts: map[string]string{}}
	for _, vm := range running {
		live.Hosts[vm] = host
	}
	n := entitle.NewNet(entitle.Derive(part, live))
	n.Compute()
	out := map[string]float64{}
	for _, pt := range n.Ports {
		out[pt.Name] = pt.AllocBps()
	}
	return out
}

// noteRates records r's measured rates of host with their entitlements
// in st (the state the report was taken in).
func (c *Controller) noteRates(st *state, host string, r *Report) {
	if st.p == nil || len(r.RatesBps) == 0 {
		return
	}
	key := entitled{p: st.p, place: reflect.ValueOf(st.place).Pointer(), running: strings.Join(r.VMs, ",")}
	c.hist.mu.Lock()
	e, ok := c.hist.ents[host]
	c.hist.mu.Unlock()
	if !ok || e.p != key.p || e.place != key.place || e.running != key.running {
		key.bps = entitledOn(st.p, st.place, host, r.VMs)
		e = key
		c.hist.mu.Lock()
		if c.hist.ents == nil {
			c.hist.ents = map[string]entitled{}
		}
		if len(c.hist.ents) < HistoryPorts { // hosts, bounded as ports are
			c.hist.ents[host] = e
		}
		c.hist.mu.Unlock()
	}
	c.hist.record(host, c.cfg.Now().UTC(), r.RatesBps, e.bps)
}

// RateHistory returns the rate history of port ("": every port) over the
// last HistoryWindow.
func (c *Controller) RateHistory(port string) History {
	return c.hist.get(port, c.cfg.Now())
}
