package virt

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// fakeConn is a stateful libvirt: domains start and stop, each start gives
// its interfaces the next vnetN tap and MAC, and every change is sent as a
// lifecycle event to the subscriber.
type fakeConn struct {
	mu      sync.Mutex
	running map[string]string // name → live XML
	nextTap int
	events  chan Event
	listErr error
	xmlErr  map[string]error // LiveXML of these domains fails
}

func newFake() *fakeConn {
	return &fakeConn{running: map[string]string{}, events: make(chan Event, 16)}
}

// start runs a domain whose interfaces carry the given aliases (net0 … when
// an alias is empty) on bridge sl-br0, and sends kind.
func (f *fakeConn) start(name, uuid string, aliases []string, kind EventKind) {
	f.mu.Lock()
	var b strings.Builder
	fmt.Fprintf(&b, "<domain type='qemu' id='1'><name>%s</name><uuid>%s</uuid><vcpu placement='static' current='1'>2</vcpu>", name, uuid)
	b.WriteString("<resource><partition>/machine</partition></resource><devices>")
	b.WriteString("<disk type='file' device='disk'><source file='/var/lib/sl-" + name + ".qcow2'/><target dev='vda' bus='virtio'/><alias name='virtio-disk0'/></disk>")
	for i, a := range aliases {
		if a == "" {
			a = fmt.Sprintf("net%d", i)
		}
		fmt.Fprintf(&b, "<interface type='bridge'><mac address='52:54:00:00:00:%02x'/><source bridge='sl-br0'/><target dev='vnet%d'/><model type='virtio'/><alias name='%s'/></interface>",
			f.nextTap, f.nextTap, a)
		f.nextTap++
	}
	b.WriteString("</devices></domain>")
	f.running[name] = b.String()
	f.mu.Unlock()
	f.events <- Event{Domain: name, Kind: kind}
}

// stop ends a domain; with kind EventOther no event is sent (a lost one).
func (f *fakeConn) stop(name string, kind EventKind) {
	f.mu.Lock()
	delete(f.running, name)
	f.mu.Unlock()
	if kind != EventOther {
		f.events <- Event{Domain: name, Kind: kind}
	}
}

func (f *fakeConn) Running() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []string
	for n := range f.running {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

func (f *fakeConn) LiveXML(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.xmlErr[name]; err != nil {
		return nil, err
	}
	x, ok := f.running[name]
	if !ok {
		return nil, fmt.Errorf("fake %s: %w", name, ErrNotRunning)
	}
	return []byte(x), nil
}

func (f *fakeConn) Lifecycle(ctx context.Context) (<-chan Event, error) {
	out := make(chan Event)
	go func() {
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-f.events:
				if !ok {
					return
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// render shows the inventory's whole state as text.
func render(inv *Inventory) string {
	var b strings.Builder
	for _, d := range inv.Domains() {
		fmt.Fprintf(&b, "%s uuid=%s vcpus=%d partition=%s disks=", d.Name, d.UUID, d.VCPUs, d.Partition)
		for i, k := range d.Disks {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, "%s:%s", k.Target, k.Source)
		}
		b.WriteString("\n")
		for _, i := range d.Interfaces {
			v, _ := inv.Port(d.Name + "/" + i.MAC)
			fmt.Fprintf(&b, "  %s %s %s bridge=%s index=%d\n", i.Alias, i.Dev, i.MAC, i.Bridge, v.Index)
		}
	}
	vms, _ := inv.VMs()
	fmt.Fprintf(&b, "vms: %s\nunnamed: %s\n", strings.Join(vms, " "), strings.Join(inv.Unnamed(), " "))
	// The unnamed domains' vNICs as the agent's ports, each resolved
	// back through Port.
	for _, u := range inv.UnnamedVMs() {
		fmt.Fprintf(&b, "  unnamed %s:", u.Name)
		for _, n := range u.NICs {
			v, ok := inv.Port(u.Name + "/" + n)
			fmt.Fprintf(&b, " %s=%s", n, v.Dev)
			if !ok {
				b.WriteString("(not found)")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
