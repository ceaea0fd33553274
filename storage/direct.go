package storage

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A directory datastore's volumes are opened with O_DIRECT, as QEMU's
// cache=none opens a disk image (what libvirt asks of disks on shared file
// systems before it migrates a VM): no page of a volume stays in the
// gateway host's page cache, so a write the VM saw acknowledged is on the
// file server, and a read gets what the server has, whichever host wrote
// it last and whenever each host opened the file. Where the file system
// refuses O_DIRECT (tmpfs before Linux 6.6) the volume is local, and its
// page cache is the only copy: it is opened through the cache.

// defaultDirectAlign is the alignment of direct I/O (offset, length and
// memory) when the kernel does not report it (statx without
// STATX_DIOALIGN, before Linux 6.1): a multiple of every logical block
// size.
const defaultDirectAlign = 4096

// openFileVolume opens the volume file at path: with O_DIRECT unless the
// file system refuses it (at open, or in statx's alignment).
func openFileVolume(path string) (*fileVolume, error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
	var off, mem uint64
	direct := err == nil
	if direct {
		if off, mem, direct = directAlign(f); !direct {
			f.Close()
		}
	}
	if !direct && (err == nil || errors.Is(err, syscall.EINVAL)) {
		f, err = os.OpenFile(path, os.O_RDWR, 0)
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("volume %s: %w (sluice datastore create makes it)", path, errMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("volume %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("volume %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() && fi.Mode()&os.ModeDevice == 0 {
		f.Close()
		return nil, fmt.Errorf("volume %s: not a regular file or block device", path)
	}
	size := uint64(fi.Size())
	if fi.Mode()&os.ModeDevice != 0 {
		end, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("volume %s: %w", path, err)
		}
		size = uint64(end)
	}
	return &fileVolume{f: f, size: size, direct: direct, align: max(off, 1), memAlign: max(mem, 1)}, nil
}

// directAlign is the offset and memory alignment that direct I/O on f
// needs (statx STATX_DIOALIGN), defaultDirectAlign when the kernel does not
// say, and ok false when it says f takes no direct I/O.
func directAlign(f *os.File) (off, mem uint64, ok bool) {
	var st unix.Statx_t
	err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st)
	if err != nil || st.Mask&unix.STATX_DIOALIGN == 0 {
		return defaultDirectAlign, defaultDirectAlign, true
	}
	if st.Dio_offset_align == 0 || st.Dio_mem_align == 0 {
		return 0, 0, false
	}
	return uint64(st.Dio_offset_align), uint64(st.Dio_mem_align), true
}

// fileVolume is a volume file. FLUSH and FUA are fdatasync. With direct
// set, requests whose offset, length or memory are not aligned go through
// an aligned bounce buffer; a write that covers only part of an aligned
// block reads the block, changes it and writes it back while every other
// write of the volume waits (rmw), so that no write is lost to another's
// read-modify-write.
type fileVolume struct {
	f               *os.File
	size            uint64
	direct          bool
	align, memAlign uint64 // of offsets and lengths, of memory (1 when not direct)
	rmw             sync.RWMutex
}

func (v *fileVolume) sizeBytes() uint64 { return v.size }

// fits reports whether p at off can be read or written directly.
func (v *fileVolume) fits(p []byte, off uint64) bool {
	if !v.direct || len(p) == 0 {
		return true
	}
	addr := uint64(uintptr(unsafe.Pointer(&p[0])))
	return off%v.align == 0 && uint64(len(p))%v.align == 0 && addr%v.memAlign == 0
}

// span is the aligned range [lo, hi) holding n bytes at off.
func (v *fileVolume) span(off uint64, n int) (lo, hi uint64) {
	lo = off - off%v.align
	hi = off + uint64(n)
	if r := hi % v.align; r != 0 {
		hi += v.align - r
	}
	return lo, hi
}

// bounce is a zeroed buffer of n bytes aligned for direct I/O.
func (v *fileVolume) bounce(n uint64) []byte {
	return alignedTo(int(n), int(max(v.memAlign, 4096)))
}

// pread fills p from off; what lies past the end of the file reads as
// zeroes (a file shorter than its disk).
func (v *fileVolume) pread(p []byte, off uint64) error {
	n, err := v.f.ReadAt(p, int64(off))
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		clear(p[n:])
		return nil
	}
	return ioErr(err)
}

func (v *fileVolume) readAt(p []byte, off uint64) error {
	if v.fits(p, off) {
		return v.pread(p, off)
	}
	lo, hi := v.span(off, len(p))
	b := v.bounce(hi - lo)
	if err := v.pread(b, lo); err != nil {
		return err
	}
	copy(p, b[off-lo:])
	return nil
}

func (v *fileVolume) writeAt(p []byte, off uint64, fua bool) error {
	var err error
	switch lo, hi := v.span(off, len(p)); {
	case v.fits(p, off):
		v.rmw.RLock()
		_, err = v.f.WriteAt(p, int64(off))
		v.rmw.RUnlock()
	case lo == off && hi == off+uint64(len(p)):
		// Aligned on the volume, not in memory: a copy suffices.
		b := v.bounce(hi - lo)
		copy(b, p)
		v.rmw.RLock()
		_, err = v.f.WriteAt(b, int64(lo))
		v.rmw.RUnlock()
	default:
		err = v.readModifyWrite(p, off, lo, hi)
	}
	if err != nil {
		return ioErr(err)
	}
	if fua {
		return v.flush()
	}
	return nil
}

// readModifyWrite writes p at off through the aligned range [lo, hi): the
// partly covered first and last blocks are read first. No other write of
// the volume runs meanwhile. A range that ends past the end of the file
// is cut back to the file's size after the write.
func (v *fileVolume) readModifyWrite(p []byte, off, lo, hi uint64) error {
	v.rmw.Lock()
	defer v.rmw.Unlock()
	b := v.bounce(hi - lo)
	if off != lo {
		if err := v.pread(b[:v.align], lo); err != nil {
			return err
		}
	}
	end := off + uint64(len(p))
	if end != hi && (hi-v.align != lo || off == lo) {
		if err := v.pread(b[hi-lo-v.align:], hi-v.align); err != nil {
			return err
		}
	}
	copy(b[off-lo:], p)
	if _, err := v.f.WriteAt(b, int64(lo)); err != nil {
		return err
	}
	if hi > v.size {
		// The file grew to the aligned end (end ≤ size: the disk is
		// no larger than its volume).
		return v.f.Truncate(int64(v.size))
	}
	return nil
}

func (v *fileVolume) flush() error {
	return ioErr(syscall.Fdatasync(int(v.f.Fd())))
}

func (v *fileVolume) trim(off, n uint64) error {
	const punchHole, keepSize = 0x02, 0x01
	v.rmw.RLock()
	err := syscall.Fallocate(int(v.f.Fd()), punchHole|keepSize, int64(off), int64(n))
	v.rmw.RUnlock()
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return nil // trim is advisory
	}
	return ioErr(err)
}

func (v *fileVolume) close() { v.f.Close() }
func (v *fileVolume) abort() { v.f.Close() }
