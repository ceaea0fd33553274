package policy

import (
	"strconv"

	"gopkg.in/yaml.v3"
)

// Field names of every entity, in the order docs/policy.md lists them.
var (
	policyFields    = []string{"cluster", "reservationCap", "hosts", "trafficClasses", "networkPools", "portGroups", "datastores", "vms", "unnamedVMs"}
	hostFields      = []string{"name", "cpu", "memory", "uplinks"}
	hostCPUFields   = []string{"cores", "mhz", "sendMHzPerGbps", "sendOverheadMHz", "hostCores"}
	uplinkFields    = []string{"name", "speed", "usable"}
	classFields     = []string{"shares", "reservation", "limit", "ingress"}
	ingressFields   = []string{"shares", "reservation", "limit"}
	unnamedFields   = []string{"shares", "reservation", "limit"}
	poolFields      = []string{"name", "reservation", "portGroups", "hosts"}
	portGroupFields = []string{"name", "vlan"}
	dsFields        = []string{"name", "driver", "sioc", "array", "capacityIOPS"}
	siocFields      = []string{"enabled", "congestionThreshold", "controlPeriod", "gamma", "shareTerm", "minWindow", "maxWindow"}
	arrayFields     = []string{"slots", "serviceTime"}
	vmFields        = []string{"name", "host", "cpu", "memory", "nics", "disks", "migratable", "latency", "lab"}
	vmLabFields     = []string{"kind"}
	vmCPUFields     = []string{"vcpus", "shares", "reservationMHz", "limitMHz"}
	nicFields       = []string{"name", "portGroup", "shares", "reservation", "limit", "uplink", "passthrough", "ingress"}
	diskFields      = []string{"name", "datastore", "shares", "reservationIOPS", "limitIOPS", "size"}
)

// Upper bounds of small integers.
const (
	maxCores  = 4096
	maxMHz    = 100_000
	maxVCPUs  = 768
	maxSlots  = 65536
	maxWindow = 65536 // I/Os outstanding per host on a datastore
	maxVMMHz  = 1 << 30
	maxVLAN   = 4094
)

func (d *decoder) policy(root *yaml.Node) *Policy {
	p := &Policy{ReservationCap: DefaultReservationCap, File: d.file}
	m := d.mapping(root, "", &p.Pos, "", policyFields...)
	if m == nil {
		return p
	}
	p.Pos.Line = root.Line
	p.Cluster = d.name(m, "cluster", true)
	if s, line, ok := d.scalar(m, "reservationCap"); ok {
		f, err := strconv.ParseFloat(s, 64)
		if len(s) > MaxQuantityLen {
			d.add(line, "reservationCap", "%s", tooLong(s, "a number"))
		} else if err != nil || !isPlainNumber(s) || f <= 0 || f > 1 {
			d.add(line, "reservationCap", "must be a fraction in (0, 1], got %q", clip(s))
		} else {
			p.ReservationCap = f
		}
	}
	for i, n := range d.list(m, "hosts") {
		p.Hosts = append(p.Hosts, d.host(n, itemPath("hosts", i, n)))
	}
	if v, ok := m.vals["hosts"]; !ok {
		d.add(m.line, "hosts", "missing (required): at least one host")
	} else if len(p.Hosts) == 0 && (v.Kind == yaml.SequenceNode && len(v.Content) == 0 || v.Tag == "!!null") {
		d.add(v.Line, "hosts", "at least one host is required")
	}
	p.TrafficClasses = d.classes(m)
	for i, n := range d.list(m, "networkPools") {
		p.NetworkPools = append(p.NetworkPools, d.pool(n, itemPath("networkPools", i, n)))
	}
	for i, n := range d.list(m, "portGroups") {
		p.PortGroups = append(p.PortGroups, d.portGroup(n, itemPath("portGroups", i, n)))
	}
	for i, n := range d.list(m, "datastores") {
		p.Datastores = append(p.Datastores, d.datastore(n, itemPath("datastores", i, n)))
	}
	for i, n := range d.list(m, "vms") {
		p.VMs = append(p.VMs, d.vm(n, itemPath("vms", i, n)))
	}
	p.UnnamedVMs = d.unnamedVMs(m)
	return p
}

// unnamedVMs decodes what each vNIC of a running VM that the policy does
// not name gets; the default is shares normal, no reservation, no limit.
func (d *decoder) unnamedVMs(top *mapping) UnnamedVNIC {
	u := UnnamedVNIC{Shares: NetSharesNormal, Limit: Unlimited}
	v, ok := top.vals["unnamedVMs"]
	if !ok || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		return u
	}
	u.Pos.Line = v.Line
	m := d.mapping(v, "unnamedVMs", &u.Pos, "", unnamedFields...)
	if m == nil {
		return u
	}
	d.netRSL(m, &u.Shares, &u.Reservation, &u.Limit)
	return u
}

func isPlainNumber(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && c != '.' {
			return false
		}
	}
	return s != ""
}

func (d *decoder) host(n *yaml.Node, path string) Host {
	h := Host{Pos: Pos{Line: n.Line}}
	m := d.mapping(n, path, &h.Pos, "", hostFields...)
	if m == nil {
		return h
	}
	h.Name = d.name(m, "name", true)
	if v, ok := m.vals["cpu"]; ok {
		if c := d.mapping(v, path+".cpu", &h.Pos, "cpu.", hostCPUFields...); c != nil {
			d.integer(c, "cores", 1, maxCores, &h.CPU.Cores)
			d.integer(c, "mhz", 1, maxMHz, &h.CPU.MHz)
			d.integer(c, "sendMHzPerGbps", 1, maxMHz, &h.CPU.SendMHzPerGbps)
			d.integer(c, "sendOverheadMHz", 0, maxMHz, &h.CPU.SendOverheadMHz)
			d.hostCores(c, path, &h)
		}
	}
	d.size(m, "memory", &h.Memory)
	for i, u := range d.list(m, "uplinks") {
		h.Uplinks = append(h.Uplinks, d.uplink(u, itemPath(path+".uplinks", i, u)))
	}
	return h
}

// hostCores reads cpu.hostCores of host h (the cores kept for the host
// when latency-sensitive VMs are pinned): at most cpu.cores, and only with
// them; 1 by default when cores are given.
func (d *decoder) hostCores(c *mapping, path string, h *Host) {
	n := -1
	d.integer(c, "hostCores", 0, maxCores, &n)
	switch {
	case n < 0:
		if h.CPU.Cores > 0 {
			h.CPU.HostCores = DefaultHostCores
		}
	case h.CPU.Cores == 0:
		d.add(h.Pos.FieldLine("cpu.hostCores"), path+".cpu.hostCores", "hostCores needs cpu.cores (the host's cores are not modelled)")
	case n > h.CPU.Cores:
		d.add(h.Pos.FieldLine("cpu.hostCores"), path+".cpu.hostCores", "%d cores kept for the host, more than its %d cores", n, h.CPU.Cores)
	default:
		h.CPU.HostCores = n
	}
}

// DefaultHostCores is how many cores a host whose file gives cores keeps
// for itself when it gives no cpu.hostCores: core 0.
const DefaultHostCores = 1

func (d *decoder) uplink(n *yaml.Node, path string) Uplink {
	u := Uplink{Pos: Pos{Line: n.Line}}
	m := d.mapping(n, path, &u.Pos, "", uplinkFields...)
	if m == nil {
		return u
	}
	u.Name = d.name(m, "name", true)
	speedOK := d.rate(m, "speed", &u.Speed, false)
	usableOK := d.rate(m, "usable", &u.Usable, false)
	if _, ok := m.vals["speed"]; !ok {
		d.add(m.line, path+".speed", "missing (required): the line rate, e.g. 10Gbps")
	} else if speedOK && u.Speed == 0 {
		d.add(u.Pos.FieldLine("speed"), path+".speed", "must be positive")
	}
	switch {
	case !usableOK:
		if _, given := m.vals["usable"]; !given {
			u.Usable = u.Speed
		}
	case u.Usable == 0:
		d.add(u.Pos.FieldLine("usable"), path+".usable", "must be positive")
	case u.Usable > u.Speed && u.Speed > 0:
		d.add(u.Pos.FieldLine("usable"), path+".usable", "%s is more than the speed %s", FormatRate(u.Usable), FormatRate(u.Speed))
	}
	return u
}

// classes returns all nine traffic classes, with the file's settings.
func (d *decoder) classes(top *mapping) []TrafficClass {
	tcs := make([]TrafficClass, len(TrafficClassNames))
	for i, name := range TrafficClassNames {
		tcs[i] = TrafficClass{Name: name, Shares: NetSharesNormal, Limit: Unlimited}
	}
	v, ok := top.vals["trafficClasses"]
	if !ok || (v.Kind == yaml.ScalarNode && v.Tag == "!!null") {
		return tcs
	}
	var all Pos
	m := d.mapping(v, "trafficClasses", &all, "", TrafficClassNames...)
	if m == nil {
		return tcs
	}
	for i := range tcs {
		tc := &tcs[i]
		n, ok := m.vals[tc.Name]
		if !ok {
			continue
		}
		tc.Declared = true
		tc.Pos.Line = n.Line
		path := "trafficClasses." + tc.Name
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			continue // `nfs:` alone declares the class with defaults
		}
		cm := d.mapping(n, path, &tc.Pos, "", classFields...)
		if cm == nil {
			continue
		}
		d.netRSL(cm, &tc.Shares, &tc.Reservation, &tc.Limit)
		tc.Ingress = d.ingress(cm, &tc.Pos)
	}
	return tcs
}

// ingress decodes the `ingress` mapping of m (a vNIC or a traffic class),
// recording its fields' lines in pos as "ingress.KEY"; nil when absent.
func (d *decoder) ingress(m *mapping, pos *Pos) *Ingress {
	v, ok := m.vals["ingress"]
	if !ok {
		return nil
	}
	in := &Ingress{Shares: NetSharesNormal, Limit: Unlimited}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return in // `ingress:` alone: shares normal, no reservation, no limit
	}
	im := d.mapping(v, join(m.path, "ingress"), pos, m.prefix+"ingress.", ingressFields...)
	if im == nil {
		return in
	}
	d.netRSL(im, &in.Shares, &in.Reservation, &in.Limit)
	return in
}

// netRSL decodes the network shares, reservation and limit of m and
// reports a reservation above the limit.
func (d *decoder) netRSL(m *mapping, shares *int, r, l *Bps) {
	d.shares(m, "shares", "network", 1, shares)
	d.rate(m, "reservation", r, false)
	d.rate(m, "limit", l, true)
	d.checkRL(m, *r, *l)
}

// checkRL reports a reservation above the limit.
func (d *decoder) checkRL(m *mapping, r, l Bps) {
	if r > l {
		d.add(m.pos.FieldLine(m.prefix+"reservation"), join(m.path, "reservation"), "reservation %s is more than the limit %s", FormatRate(r), FormatRate(l))
	}
}

func (d *decoder) pool(n *yaml.Node, path string) NetworkPool {
	np := NetworkPool{Pos: Pos{Line: n.Line}}
	m := d.mapping(n, path, &np.Pos, "", poolFields...)
	if m == nil {
		return np
	}
	np.Name = d.name(m, "name", true)
	if _, ok := m.vals["reservation"]; !ok {
		d.add(m.line, path+".reservation", "missing (required): the pool's reservation quota, e.g. 15Gbps")
	}
	d.rate(m, "reservation", &np.Reservation, false)
	np.PortGroups, _ = d.nameList(m, "portGroups")
	if len(np.PortGroups) == 0 {
		if _, ok := m.vals["portGroups"]; !ok {
			d.add(m.line, path+".portGroups", "missing (required): the port groups whose vNICs use the pool")
		}
	}
	np.Hosts, _ = d.nameList(m, "hosts")
	return np
}

func (d *decoder) portGroup(n *yaml.Node, path string) PortGroup {
	pg := PortGroup{Pos: Pos{Line: n.Line}}
	if n.Kind == yaml.ScalarNode && nameRE.MatchString(n.Value) {
		pg.Name = n.Value // `portGroups: [pg-web, pg-db]`
		return pg
	}
	m := d.mapping(n, path, &pg.Pos, "", portGroupFields...)
	if m == nil {
		return pg
	}
	pg.Name = d.name(m, "name", true)
	d.integer(m, "vlan", 0, maxVLAN, &pg.VLAN)
	return pg
}

func (d *decoder) datastore(n *yaml.Node, path string) Datastore {
	ds := Datastore{Pos: Pos{Line: n.Line}}
	ds.SIOC = SIOC{CongestionThreshold: DefaultCongestionThreshold, ControlPeriod: DefaultControlPeriod,
		Gamma: DefaultSIOCGamma, ShareTerm: DefaultSIOCShareTerm, MinWindow: DefaultSIOCMinWindow, MaxWindow: DefaultSIOCMaxWindow}
	ds.Array = Array{Slots: DefaultArraySlots, ServiceTime: DefaultArrayServiceTime}
	m := d.mapping(n, path, &ds.Pos, "", dsFields...)
	if m == nil {
		return ds
	}
	ds.Name = d.name(m, "name", true)
	if s, line, ok := d.scalar(m, "driver"); ok {
		switch s {
		case DriverThrottle, DriverGateway:
			ds.Driver = s
		default:
			d.add(line, path+".driver", "unknown driver %q (want %s or %s)%s", clip(s), DriverThrottle, DriverGateway, suggest(s, []string{DriverThrottle, DriverGateway}))
		}
	}
	if v, ok := m.vals["sioc"]; ok {
		if s := d.mapping(v, path+".sioc", &ds.Pos, "sioc.", siocFields...); s != nil {
			d.boolean(s, "enabled", &ds.SIOC.Enabled)
			d.duration(s, "congestionThreshold", &ds.SIOC.CongestionThreshold)
			d.duration(s, "controlPeriod", &ds.SIOC.ControlPeriod)
			d.siocGains(s, &ds.SIOC)
		}
	}
	if v, ok := m.vals["array"]; ok {
		if a := d.mapping(v, path+".array", &ds.Pos, "array.", arrayFields...); a != nil {
			d.integer(a, "slots", 1, maxSlots, &ds.Array.Slots)
			d.duration(a, "serviceTime", &ds.Array.ServiceTime)
		}
	}
	if _, line, ok := d.scalar(m, "capacityIOPS"); ok {
		problems := len(d.errs) + d.dropped
		d.iops(m, "capacityIOPS", &ds.CapacityIOPS, false)
		switch {
		case len(d.errs)+d.dropped > problems:
		case ds.CapacityIOPS == 0:
			d.add(line, path+".capacityIOPS", "a datastore's capacity must be positive (leave it out to declare none)")
		case ds.ArrayGiven() && ds.CapacityIOPS > ds.ArrayIOPS():
			d.add(line, path+".capacityIOPS", "%d IOPS is more than the emulated array serves (%d slots / %s = %d IOPS)",
				ds.CapacityIOPS, ds.Array.Slots, ds.Array.ServiceTime, ds.ArrayIOPS())
		}
	}
	return ds
}

// siocGains decodes the PARDA gains of a datastore's sioc mapping into s
// (which holds the defaults).
func (d *decoder) siocGains(m *mapping, s *SIOC) {
	d.fraction(m, "gamma", true, &s.Gamma)
	d.fraction(m, "shareTerm", false, &s.ShareTerm)
	problems := len(d.errs) + d.dropped
	d.integer(m, "minWindow", 1, maxWindow, &s.MinWindow)
	d.integer(m, "maxWindow", 1, maxWindow, &s.MaxWindow)
	if len(d.errs)+d.dropped > problems || s.MinWindow <= s.MaxWindow {
		return // a bad bound is reported already
	}
	if _, given := m.vals["maxWindow"]; given {
		d.add(m.pos.FieldLine(m.prefix+"maxWindow"), join(m.path, "maxWindow"), "%d is less than minWindow %d", s.MaxWindow, s.MinWindow)
	} else {
		d.add(m.pos.FieldLine(m.prefix+"minWindow"), join(m.path, "minWindow"), "%d is more than the default maxWindow %d", s.MinWindow, s.MaxWindow)
	}
}

// fraction parses a number in (0, 1], or (0, 1) when one is excluded.
func (d *decoder) fraction(m *mapping, key string, oneOK bool, dst *float64) {
	s, line, ok := d.scalar(m, key)
	if !ok {
		return
	}
	if len(s) > MaxQuantityLen {
		d.add(line, join(m.path, key), "%s", tooLong(s, "a number"))
		return
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !isPlainNumber(s) || f <= 0 || f > 1 || (f == 1 && !oneOK) {
		interval := "(0, 1)"
		if oneOK {
			interval = "(0, 1]"
		}
		d.add(line, join(m.path, key), "must be a number in %s, got %q", interval, clip(s))
		return
	}
	*dst = f
}

func (d *decoder) vm(n *yaml.Node, path string) VM {
	vm := VM{Pos: Pos{Line: n.Line}, Migratable: true}
	vm.CPU = VMCPU{VCPUs: 1, Shares: CPUSharesNormal}
	m := d.mapping(n, path, &vm.Pos, "", vmFields...)
	if m == nil {
		return vm
	}
	vm.Name = d.name(m, "name", true)
	vm.Host = d.name(m, "host", false)
	if v, ok := m.vals["cpu"]; ok {
		if c := d.mapping(v, path+".cpu", &vm.Pos, "cpu.", vmCPUFields...); c != nil {
			d.integer(c, "vcpus", 1, maxVCPUs, &vm.CPU.VCPUs)
			vm.CPU.Shares = CPUSharesNormal * vm.CPU.VCPUs
			d.shares(c, "shares", "cpu", vm.CPU.VCPUs, &vm.CPU.Shares)
			d.integer(c, "reservationMHz", 0, maxVMMHz, &vm.CPU.ReservationMHz)
			d.integer(c, "limitMHz", 1, maxVMMHz, &vm.CPU.LimitMHz)
			if vm.CPU.LimitMHz > 0 && vm.CPU.ReservationMHz > vm.CPU.LimitMHz {
				d.add(vm.Pos.FieldLine("cpu.reservationMHz"), path+".cpu.reservationMHz", "reservation %dMHz is more than the limit %dMHz", vm.CPU.ReservationMHz, vm.CPU.LimitMHz)
			}
		}
	}
	d.size(m, "memory", &vm.Memory)
	d.boolean(m, "migratable", &vm.Migratable)
	if s, line, ok := d.scalar(m, "latency"); ok {
		switch s {
		case LatencyNormal:
		case LatencySensitive:
			vm.LatencySensitive = true
		default:
			d.add(line, path+".latency", "unknown latency %q (want %s or %s)%s", clip(s), LatencyNormal, LatencySensitive, suggest(s, []string{LatencyNormal, LatencySensitive}))
		}
	}
	if v, ok := m.vals["lab"]; ok {
		if c := d.mapping(v, path+".lab", &vm.Pos, "lab.", vmLabFields...); c != nil {
			if s, line, ok := d.scalar(c, "kind"); ok {
				switch s {
				case LabNetns, LabQemu:
					vm.Lab.Kind = s
				default:
					d.add(line, path+".lab.kind", "unknown lab kind %q (want %s or %s)%s", clip(s), LabNetns, LabQemu, suggest(s, []string{LabNetns, LabQemu}))
				}
			}
		}
	}
	for i, c := range d.list(m, "nics") {
		vm.NICs = append(vm.NICs, d.nic(c, itemPath(path+".nics", i, c)))
	}
	for i, c := range d.list(m, "disks") {
		vm.Disks = append(vm.Disks, d.disk(c, itemPath(path+".disks", i, c)))
	}
	if vm.LatencySensitive && vm.CPU.LimitMHz > 0 {
		d.add(vm.Pos.FieldLine("cpu.limitMHz"), path+".cpu.limitMHz", "a latency-sensitive VM takes no CPU limit: its vCPUs run on cores of their own (omit limitMHz, or make the VM latency: normal)")
	}
	if vm.LatencySensitive {
		for _, nic := range vm.NICs {
			if !nic.Passthrough && nic.Reservation == 0 {
				d.add(vm.Pos.FieldLine("latency"), path+".latency", "a latency-sensitive VM's vNICs need a reservation (%s has none): its priority holds within the reservation", nic.Name)
			}
		}
	}
	for _, nic := range vm.NICs {
		if !nic.Passthrough {
			continue
		}
		if _, explicit := m.vals["migratable"]; explicit && vm.Migratable {
			d.add(vm.Pos.FieldLine("migratable"), path+".migratable", "a VM with a passthrough vNIC (%s) cannot migrate", nic.Name)
		}
		vm.Migratable = false
	}
	return vm
}

func (d *decoder) nic(n *yaml.Node, path string) NIC {
	nic := NIC{Pos: Pos{Line: n.Line}, Shares: NetSharesNormal, Limit: Unlimited}
	m := d.mapping(n, path, &nic.Pos, "", nicFields...)
	if m == nil {
		return nic
	}
	nic.Name = d.name(m, "name", true)
	nic.PortGroup = d.name(m, "portGroup", false)
	d.netRSL(m, &nic.Shares, &nic.Reservation, &nic.Limit)
	nic.Uplink = d.name(m, "uplink", false)
	d.passthrough(m, &nic)
	nic.Ingress = d.ingress(m, &nic.Pos)
	switch {
	case nic.VF:
		d.vf(m, path, &nic)
	case nic.Passthrough:
		for _, k := range []string{"shares", "reservation", "limit", "ingress"} {
			if _, ok := m.vals[k]; ok {
				d.add(nic.Pos.FieldLine(k), path+"."+k, "a passthrough vNIC bypasses the scheduler and takes no %s", k)
			}
		}
	}
	return nic
}

// PassthroughVF is the value of a vNIC's passthrough field for an SR-IOV
// virtual function (NIC.VF).
const PassthroughVF = "vf"

// passthrough reads the vNIC's passthrough field: true, false or vf.
func (d *decoder) passthrough(m *mapping, nic *NIC) {
	s, line, ok := d.scalar(m, "passthrough")
	if !ok {
		return
	}
	switch s {
	case "true":
		nic.Passthrough = true
	case "false":
	case PassthroughVF:
		nic.Passthrough, nic.VF = true, true
	default:
		d.add(line, join(m.path, "passthrough"), "expected true, false or %s (an SR-IOV virtual function), got %q%s", PassthroughVF, clip(s), suggest(s, []string{"true", "false", PassthroughVF}))
	}
}

// vf checks a VF vNIC (passthrough: vf): it names its PF (uplink), takes
// no shares or ingress (the NIC's VF rates shape only what it sends), and
// its rates become whole Mbit/s: the reservation rounded up, the limit
// rounded down, at least 1 Mbit/s.
func (d *decoder) vf(m *mapping, path string, nic *NIC) {
	for _, k := range []string{"shares", "ingress"} {
		if _, ok := m.vals[k]; ok {
			d.add(nic.Pos.FieldLine(k), path+"."+k, "an SR-IOV VF (passthrough: vf) bypasses the host's scheduler and takes no %s: only its reservation and limit, which the NIC enforces on what it sends", k)
		}
	}
	if _, ok := m.vals["uplink"]; !ok {
		d.add(nic.Pos.Line, path+".uplink", "missing (required for passthrough: vf): the uplink whose NIC is the VF's PF, one of the host's uplinks")
	}
	nic.Shares = NetSharesNormal
	if nic.Reservation > nic.Limit {
		return // reported by netRSL
	}
	if nic.Limit != Unlimited {
		if nic.Limit < MbpsBps {
			d.add(nic.Pos.FieldLine("limit"), path+".limit", "a VF's limit is its max_tx_rate in whole Mbit/s: at least 1Mbps, got %s", FormatRate(nic.Limit))
			return
		}
		nic.Limit = nic.Limit / MbpsBps * MbpsBps
	}
	r := (nic.Reservation + MbpsBps - 1) / MbpsBps * MbpsBps
	if r > nic.Limit {
		d.add(nic.Pos.FieldLine("reservation"), path+".reservation", "a VF's rates are whole Mbit/s: the reservation rounds up to %s, more than the limit rounded down, %s", FormatRate(r), FormatRate(nic.Limit))
		return
	}
	nic.Reservation = r
}

func (d *decoder) disk(n *yaml.Node, path string) Disk {
	dk := Disk{Pos: Pos{Line: n.Line}, Shares: StorageSharesNormal, LimitIOPS: UnlimitedIOPS}
	m := d.mapping(n, path, &dk.Pos, "", diskFields...)
	if m == nil {
		return dk
	}
	dk.Name = d.name(m, "name", true)
	dk.Datastore = d.name(m, "datastore", true)
	d.shares(m, "shares", "storage", 1, &dk.Shares)
	d.iops(m, "reservationIOPS", &dk.ReservationIOPS, false)
	d.iops(m, "limitIOPS", &dk.LimitIOPS, true)
	d.size(m, "size", &dk.Size)
	if dk.ReservationIOPS > dk.LimitIOPS {
		d.add(dk.Pos.FieldLine("reservationIOPS"), path+".reservationIOPS", "reservation %d IOPS is more than the limit %d IOPS", dk.ReservationIOPS, dk.LimitIOPS)
	}
	return dk
}
