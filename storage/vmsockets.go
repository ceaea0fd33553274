package storage

import (
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
)

// VMSockets are a gateway's per-VM sockets, VMSocket(dir, VM): one
// listener for each VM the gateway serves (Gateway.VMs), on which that VM
// opens its own disks only (Gateway.ServeVM). Sync opens and closes them
// as the VMs come and go with the policy or the controller's placement.
// A nil *VMSockets has no sockets: Sync and Close do nothing.
type VMSockets struct {
	g    *Gateway
	dir  string
	perm SocketPerm

	mu sync.Mutex
	ls map[string]net.Listener // by VM
}

// NewVMSockets returns g's per-VM sockets in dir, each with perm; none is
// open until Sync.
func NewVMSockets(g *Gateway, dir string, perm SocketPerm) *VMSockets {
	return &VMSockets{g: g, dir: dir, perm: perm, ls: map[string]net.Listener{}}
}

// Sync opens a socket for every VM the gateway serves that has none and
// closes the sockets of VMs it no longer serves (their connections get
// ESHUTDOWN from the gateway: the disks left). When a socket fails to
// open, none of the new ones is open; the next Sync tries again.
func (v *VMSockets) Sync() error {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	want := v.g.VMs()
	for vm, l := range v.ls {
		if !slices.Contains(want, vm) {
			l.Close()
			delete(v.ls, vm)
		}
	}
	var add []string
	for _, vm := range want {
		if _, ok := v.ls[vm]; !ok {
			add = append(add, vm)
		}
	}
	if len(add) == 0 {
		return nil
	}
	ls, err := ListenVMs(v.dir, add, v.perm)
	if err != nil {
		return err
	}
	for vm, l := range ls {
		v.ls[vm] = l
		go func() {
			if err := v.g.ServeVM(l, vm); err != nil && !errors.Is(err, net.ErrClosed) {
				v.g.logAt(slog.LevelError, "socket of %s: %v", vm, err)
			}
		}()
	}
	return nil
}

// Close closes every socket.
func (v *VMSockets) Close() {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for vm, l := range v.ls {
		l.Close()
		delete(v.ls, vm)
	}
}
