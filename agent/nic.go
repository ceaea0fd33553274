package agent

import (
	"fmt"
	"slices"

	"sluice/nicinfo"
	"sluice/policy"
)

// NICReader reads what an uplink device's NIC is: driver, speed, queues,
// offloads (nicinfo.Reader; a fake in tests).
type NICReader interface {
	Read(dev string) (nicinfo.Info, error)
}

// UplinkNIC is what the agent knows of an uplink's NIC (Config.NIC): what
// the kernel reported when the agent last read it (at start and after
// each change of the inventory or the policy, never every step), the root
// qdisc sluice replaced, and the warnings that follow from both.
type UplinkNIC struct {
	nicinfo.Info
	// RootBefore is the kind of the root qdisc the device had before
	// sluice replaced it ("mq", "noqueue", "fq_codel", …, as recorded in
	// the state file); "" until the agent has taken the uplink.
	RootBefore string `json:"root_before,omitempty"`
	// Warnings are one line each: an offload whose absence costs CPU per
	// Gbps (TSO, GSO or GRO off), a link slower than the policy's line
	// rate, and an mq root that sluice's single HTB replaced. The agent
	// logs each once while it holds (NICLog).
	Warnings []string `json:"warnings,omitempty"`
	// Error says why the NIC could not be read (the rest then holds what
	// was read); "" when it was.
	Error string `json:"error,omitempty"`
	// ReadNs is when the agent read it.
	ReadNs int64 `json:"read_ns"`
}

// MQNote is the warning of an uplink whose root qdisc was mq: sluice put
// one HTB in its place, so every TX queue's packets now pass one qdisc
// and its lock (docs/agent.md, "The uplink's NIC").
func MQNote(dev string, txQueues int) string {
	return fmt.Sprintf("root qdisc of %s was mq over %d TX queues; sluice replaced it with one HTB tree: the %d queues now funnel through one qdisc lock (docs/agent.md, \"The uplink's NIC\": the plan for 25-100 GbE)",
		dev, txQueues, txQueues)
}

// SlowLinkNote is the warning of an uplink whose NIC reports a link speed
// below the policy's line rate (the HTB root's rate).
func SlowLinkNote(dev string, linkBps int64, lineBps WireBps) string {
	return fmt.Sprintf("%s reports a %s link, below the policy's line rate %s: HTB's root lets more through than the link carries, so the queue builds in the driver, not in sluice's classes, and reservations and shares do not hold; give the uplink the link's speed in the policy",
		dev, nicinfo.FormatSpeed(linkBps), policy.FormatRate(policy.Bps(lineBps)))
}

// NICRetryNs is how long after a failed read of an uplink's NIC the agent
// reads it again (a read that succeeds waits for the next change).
const NICRetryNs = int64(1e9)

// nicDue says whether Measure at nowNs reads the uplinks' NICs: at the
// first step, after a change (nicStale), and NICRetryNs after a read that
// failed.
func (a *Agent) nicDue(nowNs int64) bool {
	if a.cfg.NIC == nil {
		return false
	}
	if a.nicStale {
		return true
	}
	for _, n := range a.nics {
		if n.Error != "" && nowNs-a.nicReadNs >= NICRetryNs {
			return true
		}
	}
	return false
}

// readNICs reads the NIC of every outbound tree's device (an inbound
// tree's device is sluice's own IFB).
func (a *Agent) readNICs(nowNs int64) map[string]UplinkNIC {
	out := map[string]UplinkNIC{}
	for _, t := range a.trees {
		if t.Inbound {
			continue
		}
		info, err := a.cfg.NIC.Read(t.Dev)
		n := UplinkNIC{Info: info, ReadNs: nowNs}
		if err != nil {
			n.Error = err.Error()
		}
		out[t.Dev] = n
	}
	return out
}

// takeNICs keeps the NICs a measurement read.
func (a *Agent) takeNICs(read map[string]UplinkNIC) {
	if read == nil {
		return
	}
	a.nics = map[string]*UplinkNIC{}
	for dev, n := range read {
		a.nics[dev] = &n
		a.nicReadNs = n.ReadNs
	}
	a.nicStale = false
}

// uplinkNIC is the NIC of t's device for the statistics, with the root
// qdisc recorded before sluice's and the warnings; nil when it was not
// read. It renews the agent's copy when the recorded root changed, so
// that statistics already handed out never change.
func (a *Agent) uplinkNIC(t *Tree) *UplinkNIC {
	n := a.nics[t.Dev]
	if n == nil {
		return nil
	}
	root := a.rec.Uplinks[t.Dev].Kind
	if n.Warnings != nil && n.RootBefore == root {
		return n
	}
	c := *n
	c.RootBefore = root
	c.Warnings = append([]string{}, c.Info.Warnings()...)
	if c.SpeedBps > 0 && c.SpeedBps < int64(t.SpeedBps) {
		c.Warnings = append(c.Warnings, SlowLinkNote(t.Dev, c.SpeedBps, t.SpeedBps))
	}
	if root == "mq" {
		c.Warnings = append(c.Warnings, MQNote(t.Dev, c.TxQueues))
	}
	a.nics[t.Dev] = &c
	return &c
}

// withRoots gives the NICs of s the root qdiscs recorded since s was
// decided (an agent's first Apply records each uplink's root after its
// Decide), on a copy of s's uplinks.
func (a *Agent) withRoots(s Stats) Stats {
	copied := false
	for i, u := range s.Uplinks {
		if u.NIC == nil || u.NIC.RootBefore == a.rec.Uplinks[u.Dev].Kind {
			continue
		}
		for _, t := range a.trees {
			if t.Dev != u.Dev || t.Inbound {
				continue
			}
			if !copied {
				s.Uplinks, copied = slices.Clone(s.Uplinks), true
			}
			s.Uplinks[i].NIC = a.uplinkNIC(t)
		}
	}
	return s
}

// NICLog remembers which warnings of the uplinks' NICs were logged, so
// that each is logged once while it holds (again if it goes away and
// comes back).
type NICLog struct {
	said map[string]map[string]bool // uplink device → warning
}

// Fresh returns the warnings of s's uplink NICs (and their read errors)
// not logged yet, prefixed with their uplink, and forgets those no longer
// there.
func (l *NICLog) Fresh(s Stats) []string {
	if l.said == nil {
		l.said = map[string]map[string]bool{}
	}
	var out []string
	for _, u := range s.Uplinks {
		if u.NIC == nil {
			continue
		}
		now := map[string]bool{}
		for _, w := range u.NIC.Warnings {
			now[w] = true
			if !l.said[u.Dev][w] {
				out = append(out, fmt.Sprintf("uplink %s: %s", u.Uplink, w))
			}
		}
		if u.NIC.Error != "" {
			now[u.NIC.Error] = true
			if !l.said[u.Dev][u.NIC.Error] {
				out = append(out, fmt.Sprintf("uplink %s: reading its NIC: %s", u.Uplink, u.NIC.Error))
			}
		}
		l.said[u.Dev] = now
	}
	return out
}
