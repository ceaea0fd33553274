package policy

import "strconv"

// listPath names an item of a list the way the decoder does: by name, or
// by 0-based index when it has none.
func listPath(list, name string, i int) string {
	if name == "" {
		return list + "[" + strconv.Itoa(i) + "]"
	}
	return list + "[" + name + "]"
}

// resolve checks names for uniqueness and references for existence.
func (p *Policy) resolve(l *errorList) {
	hosts := map[string]*Host{}
	for i := range p.Hosts {
		h := &p.Hosts[i]
		path := listPath("hosts", h.Name, i)
		if h.Name != "" {
			if prev, dup := hosts[h.Name]; dup {
				l.add(h.Pos.FieldLine("name"), path+".name", "duplicate host name %q (first at line %d)", h.Name, prev.Pos.Line)
			} else {
				hosts[h.Name] = h
			}
		}
		seen := map[string]int{}
		for j, u := range h.Uplinks {
			if u.Name == "" {
				continue
			}
			if prev, dup := seen[u.Name]; dup {
				l.add(u.Pos.FieldLine("name"), listPath(path+".uplinks", u.Name, j)+".name", "duplicate uplink name %q (first at line %d)", u.Name, prev)
			} else {
				seen[u.Name] = u.Pos.Line
			}
		}
	}

	declaredPGs := map[string]int{}
	for i, pg := range p.PortGroups {
		if pg.Name == "" {
			continue
		}
		if prev, dup := declaredPGs[pg.Name]; dup {
			l.add(pg.Pos.FieldLine("name"), listPath("portGroups", pg.Name, i), "duplicate port group %q (first at line %d)", pg.Name, prev)
		} else {
			declaredPGs[pg.Name] = pg.Pos.Line
		}
	}
	pgKnown := func(name string) bool {
		if len(p.PortGroups) == 0 {
			return true // port groups are implicit
		}
		_, ok := declaredPGs[name]
		return ok
	}
	pgNames := func() []string {
		var names []string
		for _, pg := range p.PortGroups {
			names = append(names, pg.Name)
		}
		return names
	}

	pools := map[string]int{}
	pgPool := map[string]string{}
	for i, np := range p.NetworkPools {
		path := listPath("networkPools", np.Name, i)
		if np.Name != "" {
			if prev, dup := pools[np.Name]; dup {
				l.add(np.Pos.FieldLine("name"), path+".name", "duplicate pool name %q (first at line %d)", np.Name, prev)
			} else {
				pools[np.Name] = np.Pos.Line
			}
		}
		for j, pg := range np.PortGroups {
			field := path + ".portGroups[" + strconv.Itoa(j) + "]"
			if !pgKnown(pg) {
				l.addHint(func() string { return suggest(pg, pgNames()) }, np.Pos.FieldLine("portGroups"), field, "unknown port group %q", pg)
			}
			if other, taken := pgPool[pg]; taken && other != np.Name {
				l.add(np.Pos.FieldLine("portGroups"), field, "port group %q is already in pool %q (a port group belongs to at most one pool)", pg, other)
			} else {
				pgPool[pg] = np.Name
			}
		}
		for j, hn := range np.Hosts {
			if _, ok := hosts[hn]; !ok {
				l.addHint(func() string { return suggest(hn, p.hostNames()) }, np.Pos.FieldLine("hosts"), path+".hosts["+strconv.Itoa(j)+"]", "unknown host %q", hn)
			}
		}
		if len(np.Hosts) == 0 {
			p.NetworkPools[i].Hosts = p.hostNames()
		}
	}

	datastores := map[string]int{}
	var dsNames []string
	for i, ds := range p.Datastores {
		if ds.Name == "" {
			continue
		}
		if prev, dup := datastores[ds.Name]; dup {
			l.add(ds.Pos.FieldLine("name"), listPath("datastores", ds.Name, i)+".name", "duplicate datastore name %q (first at line %d)", ds.Name, prev)
		} else {
			datastores[ds.Name] = ds.Pos.Line
			dsNames = append(dsNames, ds.Name)
		}
	}

	vms := map[string]int{}
	for i := range p.VMs {
		vm := &p.VMs[i]
		path := listPath("vms", vm.Name, i)
		if vm.Name != "" {
			if prev, dup := vms[vm.Name]; dup {
				l.add(vm.Pos.FieldLine("name"), path+".name", "duplicate VM name %q (first at line %d)", vm.Name, prev)
			} else {
				vms[vm.Name] = vm.Pos.Line
			}
		}
		var host *Host
		if vm.Host != "" {
			host = hosts[vm.Host]
			if host == nil {
				l.addHint(func() string { return suggest(vm.Host, p.hostNames()) }, vm.Pos.FieldLine("host"), path+".host", "unknown host %q", vm.Host)
			}
		}
		nics := map[string]int{}
		for j, nic := range vm.NICs {
			npath := listPath(path+".nics", nic.Name, j)
			if nic.Name != "" {
				if prev, dup := nics[nic.Name]; dup {
					l.add(nic.Pos.FieldLine("name"), npath+".name", "duplicate vNIC name %q (first at line %d)", nic.Name, prev)
				} else {
					nics[nic.Name] = nic.Pos.Line
				}
			}
			if nic.PortGroup != "" && !pgKnown(nic.PortGroup) {
				l.addHint(func() string { return suggest(nic.PortGroup, pgNames()) }, nic.Pos.FieldLine("portGroup"), npath+".portGroup", "unknown port group %q", nic.PortGroup)
			}
			if nic.Uplink != "" {
				switch {
				case vm.Host == "":
					l.add(nic.Pos.FieldLine("uplink"), npath+".uplink", "pinning to an uplink needs the VM's host")
				case host != nil && host.Uplink(nic.Uplink) == nil:
					l.addHint(func() string { return suggest(nic.Uplink, host.uplinkNames()) }, nic.Pos.FieldLine("uplink"), npath+".uplink", "host %s has no uplink %q", host.Name, nic.Uplink)
				}
			}
		}
		disks := map[string]int{}
		for j, dk := range vm.Disks {
			dpath := listPath(path+".disks", dk.Name, j)
			if dk.Name != "" {
				if prev, dup := disks[dk.Name]; dup {
					l.add(dk.Pos.FieldLine("name"), dpath+".name", "duplicate disk name %q (first at line %d)", dk.Name, prev)
				} else {
					disks[dk.Name] = dk.Pos.Line
				}
			}
			if dk.Datastore != "" {
				if _, ok := datastores[dk.Datastore]; !ok {
					l.addHint(func() string { return suggest(dk.Datastore, dsNames) }, dk.Pos.FieldLine("datastore"), dpath+".datastore", "unknown datastore %q", dk.Datastore)
				}
			}
		}
	}
}

func (p *Policy) hostNames() []string {
	names := make([]string, 0, len(p.Hosts))
	for _, h := range p.Hosts {
		if h.Name != "" {
			names = append(names, h.Name)
		}
	}
	return names
}

func (h *Host) uplinkNames() []string {
	names := make([]string, 0, len(h.Uplinks))
	for _, u := range h.Uplinks {
		names = append(names, u.Name)
	}
	return names
}
