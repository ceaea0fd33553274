package controller

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestScopedPublish: a commit publishes only the hosts whose desired state
// can have changed (publishScope); after every operation of a random
// sequence (sets of every field kind on VMs, vNICs, disks and hosts,
// power-ons, migrations, agents' reports) the desired state of every host
// in etcd equals what publishing every host would give.
func TestScopedPublish(t *testing.T) {
	f := newFixture(t, true)
	rng := rand.New(rand.NewPCG(7, 2026))
	const nh, nv = 5, 30
	var doc strings.Builder
	doc.WriteString("cluster: pub\ndatastores: [{name: ds1, array: {slots: 8, serviceTime: 5ms}}]\nhosts:\n")
	for h := range nh {
		fmt.Fprintf(&doc, "  - {name: h%d, cpu: {cores: 16, mhz: 2000}, memory: 256GiB, uplinks: [{name: up0, speed: 10Gbps}, {name: up1, speed: 10Gbps}]}\n", h)
	}
	doc.WriteString("vms:\n")
	for v := range nv {
		host := ""
		if v%4 != 3 {
			host = fmt.Sprintf(", host: h%d", v%nh)
		}
		fmt.Fprintf(&doc, "  - {name: vm%d%s, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 10Mbps}], disks: [{name: d0, datastore: ds1, size: 1GiB, reservationIOPS: 10}]}\n", v, host)
	}
	f.apply(doc.String())
	ops := 0
	for i := 0; i < 150; i++ {
		vm := fmt.Sprintf("vm%d", rng.IntN(nv))
		host := fmt.Sprintf("h%d", rng.IntN(nh))
		var err error
		switch k := rng.IntN(12); k {
		case 0:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s/nic0.reservation=%dMbps", vm, 1+rng.IntN(50))}})
		case 1:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s/nic0.shares=%d", vm, 1+rng.IntN(100))}})
		case 2:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s/nic0.uplink=up%d", vm, rng.IntN(2))}})
		case 3:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s.cpu.reservation=%dMHz", vm, 100*rng.IntN(5))}})
		case 4:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s.cpu.shares=%d", vm, 100+rng.IntN(2000)), fmt.Sprintf("%s.memory=%dGiB", vm, 1+rng.IntN(3))}})
		case 5:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s/d0.reservation=%d", vm, 1+rng.IntN(100))}})
		case 6:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s.host=%s", vm, host)}})
		case 7:
			_, err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("%s.cores=%d", host, 8+rng.IntN(16))}})
		case 8:
			_, err = f.c.PowerOn(f.ctx, vm, PowerOnRequest{Host: host})
		case 9:
			_, err = f.c.Migrate(f.ctx, vm, MigrateRequest{To: host})
		default:
			// host's agent reports a random subset of the VMs placed there
			st, lerr := f.c.load(f.ctx)
			if lerr != nil {
				t.Fatal(lerr)
			}
			r := Report{VMs: []string{}}
			for v, h := range st.place {
				if h == host && rng.IntN(2) == 0 {
					r.VMs = append(r.VMs, v)
				}
			}
			_, err = f.c.Register(f.ctx, host, r)
		}
		if err != nil {
			continue // refused: nothing written
		}
		ops++
		checkPublished(t, f, i)
	}
	if ops < 75 {
		t.Fatalf("only %d of 150 operations were made: the sequence tests too little", ops)
	}
	t.Logf("%d operations, each followed by every host's desired state checked", ops)
}

// checkPublished compares every host's desired state in etcd with the
// rendering of every host from the state.
func checkPublished(t *testing.T, f *fixture, step int) {
	t.Helper()
	st, err := f.c.load(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.c.cfg.Client.Get(f.ctx, f.c.key(dirDesired), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for _, kv := range resp.Kvs {
		have[strings.TrimPrefix(string(kv.Key), f.c.key(dirDesired))] = string(kv.Value)
	}
	want := desiredOf(st.p, st.place, st.starting, nil)
	for _, h := range st.p.Hosts {
		dh := emptyDesired(h.Name)
		if w := want[h.Name]; w != nil {
			dh = *w
		}
		b, _ := json.Marshal(dh)
		if have[h.Name] != string(b) {
			t.Fatalf("step %d: the published desired state of %s is stale:\nhave %s\nwant %s", step, h.Name, have[h.Name], b)
		}
	}
}

// TestRepublish: a desired state written by an older controller (no part
// of the policy) is rewritten at start (Republish), once; the next start
// rewrites nothing.
func TestRepublish(t *testing.T) {
	f := newFixture(t, true)
	f.apply(readExample(t, "netioc-fig2.yaml"))
	key := f.c.key(dirDesired + "h1")
	if _, err := f.c.cfg.Client.Put(f.ctx, key, `{"host":"h1","revision":0,"vms":["vm1"]}`); err != nil {
		t.Fatal(err)
	}
	n, err := f.c.Republish(f.ctx)
	if err != nil || n != 1 {
		t.Fatalf("Republish: %d rewritten (%v), want 1", n, err)
	}
	checkPublished(t, f, 0)
	if n, err := f.c.Republish(f.ctx); err != nil || n != 0 {
		t.Fatalf("Republish again: %d rewritten (%v), want 0", n, err)
	}
}

// TestGroupCommit: concurrent decisions are committed together, each
// with its own outcome: 40 sets of 40 vNICs, 10 sets refused (a vNIC that
// does not exist) and 20 hosts registering at once. Every accepted set
// gets its own event and a revision of its own, the policy has every
// change once, the refused ones change nothing, every registration is
// recorded, and every host's published state is the rendering of the
// final state.
func TestGroupCommit(t *testing.T) {
	f := newFixture(t, true)
	var doc strings.Builder
	doc.WriteString("cluster: gc\nhosts:\n")
	for h := range 20 {
		fmt.Fprintf(&doc, "  - {name: h%d, cpu: {cores: 16, mhz: 2000}, memory: 256GiB, uplinks: [{name: up0, speed: 10Gbps}]}\n", h)
	}
	doc.WriteString("vms:\n")
	for v := range 40 {
		fmt.Fprintf(&doc, "  - {name: vm%d, host: h%d, cpu: {vcpus: 1}, memory: 1GiB, nics: [{name: nic0, reservation: 10Mbps}]}\n", v, v%20)
	}
	before := f.apply(doc.String()).Revision
	type out struct {
		i   int
		res Result
		err error
	}
	results := make(chan out, 70)
	var wg sync.WaitGroup
	for i := range 70 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o out
			o.i = i
			switch {
			case i < 40:
				o.res, o.err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("vm%d/nic0.reservation=%dMbps", i, 20+i)}})
			case i < 50:
				o.res, o.err = f.c.Set(f.ctx, SetRequest{Changes: []string{fmt.Sprintf("vm%d/nic9.reservation=1Mbps", i-40)}})
			default:
				h := i - 50
				_, o.err = f.c.Register(f.ctx, fmt.Sprintf("h%d", h), Report{VMs: []string{fmt.Sprintf("vm%d", h), fmt.Sprintf("vm%d", h+20)}})
			}
			results <- o
		}()
	}
	wg.Wait()
	close(results)
	f.c.mu.Lock()
	most := f.c.maxBatch
	f.c.mu.Unlock()
	if most < 2 {
		t.Fatalf("the 70 concurrent decisions were committed one at a time: no group commit to test")
	}
	t.Logf("at most %d decisions committed together", most)
	revs := map[int64]bool{}
	for o := range results {
		switch {
		case o.i < 40:
			if o.err != nil {
				t.Fatalf("set %d: %v", o.i, o.err)
			}
			if len(o.res.Events) != 1 || o.res.Events[0].Subject != fmt.Sprintf("vm%d/nic0", o.i) {
				t.Errorf("set %d: events %+v, want its own set event", o.i, o.res.Events)
			}
			if revs[o.res.Revision] {
				t.Errorf("set %d: revision %d given twice", o.i, o.res.Revision)
			}
			revs[o.res.Revision] = true
		case o.i < 50:
			if o.err == nil {
				t.Errorf("set %d of a vNIC that does not exist was accepted", o.i)
			}
		default:
			if o.err != nil {
				t.Errorf("register h%d: %v", o.i-50, o.err)
			}
		}
	}
	ps, err := f.c.Policy(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Revision != before+40 || len(ps.Changes) != 40 {
		t.Fatalf("policy revision %d with %d changes, want %d with 40", ps.Revision, len(ps.Changes), before+40)
	}
	for i := range 40 {
		if n := strings.Count(strings.Join(ps.Changes, " "), fmt.Sprintf("vm%d/nic0.reservation=%dMbps", i, 20+i)); n != 1 {
			t.Errorf("change of vm%d recorded %d times", i, n)
		}
	}
	evs, err := f.c.Events(f.ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	regs, seqs := 0, map[int64]bool{}
	for _, e := range evs {
		if e.Kind == "register" {
			regs++
		}
		if seqs[e.Seq] {
			t.Errorf("event number %d given twice", e.Seq)
		}
		seqs[e.Seq] = true
	}
	if regs != 20 {
		t.Errorf("%d registrations recorded, want 20", regs)
	}
	checkPublished(t, f, 0)
}
