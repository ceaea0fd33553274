package storage

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directVolume creates a file of size bytes in a temporary directory and
// opens it as a volume; the test fails unless the file system takes
// O_DIRECT (the CI machine's /tmp is ext4).
func directVolume(t *testing.T, size int64) (*fileVolume, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	v, err := openFileVolume(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.close)
	if !v.direct {
		t.Fatalf("%s: the file system of the test's temporary directory refuses O_DIRECT: these tests need one that takes it (ext4, xfs)", path)
	}
	return v, path
}

// residentPages counts the pages of the file at path in the page cache.
func residentPages(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	pg := os.Getpagesize()
	vec := make([]byte, (len(m)+pg-1)/pg)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, b := range vec {
		n += int(b & 1)
	}
	return n
}

// openFlags are the flags of the process's open file f (/proc/self/fdinfo).
func openFlags(t *testing.T, f *os.File) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatalf("no flags in /proc/self/fdinfo/%d", f.Fd())
	return 0
}

// A volume is opened with O_DIRECT: what the VM wrote and read, aligned
// or not, leaves no page of the volume in the host's page cache (the
// page cache a second host's gateway could not see), and reads back.
func TestVolumeBypassesPageCache(t *testing.T) {
	v, path := directVolume(t, 1<<20)
	if openFlags(t, v.f)&syscall.O_DIRECT == 0 {
		t.Fatalf("volume opened without O_DIRECT (fdinfo flags %o)", openFlags(t, v.f))
	}
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i*7 + 1)
	}
	if err := v.writeAt(want[:64<<10], 0, false); err != nil {
		t.Fatal(err)
	}
	// Unaligned in offset and length, and unaligned in memory.
	if err := v.writeAt(want[70000:70000+5000], 70000, false); err != nil {
		t.Fatal(err)
	}
	if err := v.writeAt(want[4097:4097+8192], 4097, false); err != nil {
		t.Fatal(err)
	}
	if n := residentPages(t, path); n != 0 {
		t.Errorf("%d pages of the volume are in the page cache after acknowledged writes, want 0", n)
	}
	got := make([]byte, 80000)
	if err := v.readAt(got[3:], 3); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[3:64<<10], want[3:64<<10]) || !bytes.Equal(got[70000:75000], want[70000:75000]) {
		t.Error("the volume reads back other bytes than were written")
	}
	if n := residentPages(t, path); n != 0 {
		t.Errorf("%d pages of the volume are in the page cache after reads, want 0", n)
	}
}

// Concurrent writes of any offset and length, several in each aligned
// block, all land (none is undone by another's read-modify-write), a
// file whose size is not a multiple of the alignment keeps its size, and
// the volume reads back the model.
func TestVolumeUnalignedWrites(t *testing.T) {
	const size = 5*4096 + 1000
	v, path := directVolume(t, size)
	model := make([]byte, size)
	// Writers own disjoint byte ranges (interleaved by 100 bytes), so the
	// outcome does not depend on their order.
	const writers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 200 {
				chunk := r.IntN(size/100/writers)*writers + w
				off := chunk*100 + r.IntN(50)
				n := 1 + r.IntN(100-off%100)
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(r.Uint32())
				}
				if err := v.writeAt(p, uint64(off), r.IntN(10) == 0); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				copy(model[off:], p)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if err := v.readAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != model[i] {
			t.Fatalf("byte %d reads %#x, the last write there wrote %#x", i, got[i], model[i])
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != size {
		t.Errorf("the file has %v bytes after the writes (%v), want %d", fi.Size(), err, size)
	}
	onDisk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, model) {
		t.Error("the file read through the page cache differs from what was written")
	}
}

// BenchmarkFileVolume: 4 KiB random writes (no flush) and reads of a
// 64 MiB volume file in the benchmark's temporary directory, opened with
// O_DIRECT (the gateway's way) and through the page cache (before): the
// price of leaving no page cached. Compare the two in one run.
func BenchmarkFileVolume(b *testing.B) {
	const size = 64 << 20
	for _, mode := range []string{"direct", "cached"} {
		for _, op := range []string{"write", "read"} {
			b.Run(mode+"/"+op, func(b *testing.B) {
				path := filepath.Join(b.TempDir(), "v.img")
				if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
					b.Fatal(err)
				}
				v, err := openFileVolume(path)
				if err != nil {
					b.Fatal(err)
				}
				if mode == "cached" {
					// The same file through the page cache.
					v.close()
					f, err := os.OpenFile(path, os.O_RDWR, 0)
					if err != nil {
						b.Fatal(err)
					}
					v = &fileVolume{f: f, size: size, align: 1, memAlign: 1}
				}
				defer v.close()
				if mode == "direct" && !v.direct {
					b.Fatal("the file system refuses O_DIRECT")
				}
				buf := alignedBuf(4096)
				r := rand.New(rand.NewPCG(1, 2))
				b.SetBytes(4096)
				b.ResetTimer()
				for b.Loop() {
					off := uint64(r.IntN(size/4096)) * 4096
					if op == "write" {
						err = v.writeAt(buf, off, false)
					} else {
						err = v.readAt(buf, off)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
