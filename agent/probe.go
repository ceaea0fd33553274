package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"sluice/storage/nbd"
	"sluice/throttle"
	"sluice/throttle/dirstats"
)

// Prober measures a datastore's latency with one small read: what the
// host's requests wait at the datastore, below QEMU's throttles.
type Prober interface {
	Probe() (time.Duration, error)
	Close() error
}

// DirProber reads the probe file of a datastore's directory (an NFS
// mount, say) with O_DIRECT at a random aligned offset.
type DirProber struct {
	mu sync.Mutex
	f  *os.File
}

// NewDirProber opens dir's probe file, making it if missing.
func NewDirProber(dir string) (*DirProber, error) {
	p, err := dirstats.EnsureProbe(dir)
	if err != nil {
		return nil, fmt.Errorf("probe file in %s: %w", dir, err)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_DIRECT, 0)
	if errors.Is(err, syscall.EINVAL) {
		f, err = os.Open(p) // a file system without O_DIRECT
	}
	if err != nil {
		return nil, err
	}
	return &DirProber{f: f}, nil
}

// Probe reads ProbeBytes at a random offset.
func (p *DirProber) Probe() (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	buf := aligned(throttle.ProbeBytes)
	off := rand.Int64N(dirstats.ProbeBytes/throttle.ProbeBytes) * throttle.ProbeBytes
	t0 := time.Now()
	_, err := p.f.ReadAt(buf, off)
	return time.Since(t0), err
}

// Close closes the file.
func (p *DirProber) Close() error { return p.f.Close() }

func aligned(n int) []byte {
	b := make([]byte, n+4096)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095)
	return b[off : off+n]
}

// NBDProber reads the probe export of an NBD server that serves the
// datastore's directory (the lab's nbdkit), reconnecting when needed.
type NBDProber struct {
	Network, Addr, Export string

	mu sync.Mutex
	c  *nbd.Client
}

// Probe reads ProbeBytes at a random offset of the export.
func (p *NBDProber) Probe() (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := nbd.Dial(ctx, p.Network, p.Addr, p.Export)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("probe %s %s: %w", p.Addr, p.Export, err)
		}
		p.c = c
	}
	n := p.c.SizeBytes() / throttle.ProbeBytes
	if n == 0 {
		return 0, fmt.Errorf("probe %s %s: export smaller than %d bytes", p.Addr, p.Export, throttle.ProbeBytes)
	}
	buf := make([]byte, throttle.ProbeBytes)
	t0 := time.Now()
	if err := p.c.ReadAt(buf, rand.Uint64N(n)*throttle.ProbeBytes); err != nil {
		p.c.Close()
		p.c = nil
		return 0, fmt.Errorf("probe %s %s: %w", p.Addr, p.Export, err)
	}
	return time.Since(t0), nil
}

// Close closes the connection.
func (p *NBDProber) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.c == nil {
		return nil
	}
	err := p.c.Close()
	p.c = nil
	return err
}

// probes accumulates a datastore's probes between periods.
type probes struct {
	mu  sync.Mutex
	acc throttle.Probe
	err error
}

func (ps *probes) add(d time.Duration, err error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if err != nil {
		ps.err = err
		return
	}
	ps.acc.N++
	ps.acc.LatSumNs += float64(d.Nanoseconds())
}

func (ps *probes) take() (throttle.Probe, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := ps.acc, ps.err
	ps.acc, ps.err = throttle.Probe{}, nil
	return p, err
}
