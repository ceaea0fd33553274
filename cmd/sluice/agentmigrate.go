package main

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"

	"sluice/virt"
)

// On a libvirt host the agent's executor of a migration is libvirt's
// live migration: the destination's agent, seeing a VM new in its desired
// state that its libvirtd does not run, finds the peer whose libvirtd
// runs it (--migrate-peer) and asks that libvirtd to migrate the domain
// live, peer to peer, to this host's libvirtd as the peers reach it
// (--migrate-uri). The VM is found by the policy's name for it: its
// domain's name or UUID.

// migrateTimeout bounds one live migration the agent carries out.
const migrateTimeout = 5 * time.Minute

// migrateFlags say how an agent on a libvirt host migrates VMs in.
type migrateFlags struct {
	uri   string   // this host's libvirtd as its peers' libvirtds reach it
	data  string   // where the source's QEMU sends the memory (libvirt's migrate_uri); empty: libvirt's choice
	peers hostURIs // every other host's libvirtd as this agent reaches it
}

func (f *migrateFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.uri, "migrate-uri", "", "this host's libvirt URI as the other hosts' libvirtd reach it (e.g. qemu+tls://h2.example.org/system): the destination of the live migrations the controller sends here (libvirt inventory)")
	fs.StringVar(&f.data, "migrate-data", "", "where the source's QEMU sends the guest's memory, e.g. tcp://10.0.0.2 on a migration network (libvirt's migrate_uri; default: libvirt's choice, this host's name)")
	fs.Var(&f.peers, "migrate-peer", "HOST=URI: the libvirt URI of another host of the cluster, where a VM migrating here may run now (libvirt inventory; repeated)")
}

// hostURIs is a repeated HOST=URI flag.
type hostURIs map[string]string

func (h *hostURIs) String() string {
	var s []string
	for k, v := range *h {
		s = append(s, k+"="+v)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

func (h *hostURIs) Set(s string) error {
	if *h == nil {
		*h = hostURIs{}
	}
	host, uri, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok || host == "" || !strings.Contains(uri, ":") {
		return fmt.Errorf("migrate-peer %q: want HOST=URI, e.g. h1=qemu+tls://h1.example.org/system", s)
	}
	if old, dup := (*h)[host]; dup {
		return fmt.Errorf("migrate-peer %s given twice (%s and %s)", host, old, uri)
	}
	(*h)[host] = uri
	return nil
}

// mover returns the executor of host's agent: it migrates vm live from
// the peer whose libvirtd runs it to this host (virt.Pull); a VM the
// local libvirtd (socket) runs already is left alone.
func (f *migrateFlags) mover(host, socket string) func(vm string) error {
	return func(vm string) error {
		if f.uri == "" {
			return fmt.Errorf("libvirt live migration to host %s needs its destination URI: give the agent --migrate-uri (this host's libvirtd as the other hosts reach it, e.g. qemu+tls://%s/system)", host, host)
		}
		peers := map[string]string{}
		for h, u := range f.peers {
			if h != host {
				peers[h] = u
			}
		}
		if len(peers) == 0 {
			return fmt.Errorf("no --migrate-peer: the agent cannot find the libvirtd that runs %s", vm)
		}
		ctx, cancel := context.WithTimeout(context.Background(), migrateTimeout)
		defer cancel()
		_, _, err := virt.Pull{DestURI: f.uri, DataURI: f.data, Peers: peers, Local: socket}.Migrate(ctx, vm)
		return err
	}
}
