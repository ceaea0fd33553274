package lab

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// KernelCacheDir keeps the uncompressed guest kernels that pvhKernel
// makes (one per host kernel, about 66 MB each); the Debian package's
// purge removes it.
const KernelCacheDir = "/var/cache/sluice/lab"

// pvhKernel returns an uncompressed copy of vmlinuz that QEMU boots at its
// PVH entry point: an ELF whose Xen PHYS32_ENTRY note QEMU's -kernel
// follows, so that neither the firmware's Linux loader nor the kernel's
// decompressor runs in the guest. Under TCG that is about 3 s of every
// guest's boot (a guest ready 7.8–8.5 s after its start against
// 11.1–11.4 s from vmlinuz, 2026-11-27). The copy is made once per host
// kernel (named by vmlinuz's name, size and time) in cacheDir; an
// error says why there is none (the caller boots vmlinuz).
func pvhKernel(vmlinuz, cacheDir string) (string, error) {
	fi, err := os.Stat(vmlinuz)
	if err != nil {
		return "", err
	}
	path := filepath.Join(cacheDir, fmt.Sprintf("%s-%d-%d.pvh", filepath.Base(vmlinuz), fi.Size(), fi.ModTime().Unix()))
	if err := checkPVH(path); err == nil {
		return path, nil
	}
	img, err := os.ReadFile(vmlinuz)
	if err != nil {
		return "", err
	}
	elfImg, err := decompressKernel(img)
	if err != nil {
		return "", fmt.Errorf("%s: %w", vmlinuz, err)
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(cacheDir, ".pvh-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(elfImg); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return "", err
	}
	if err := checkPVH(tmp.Name()); err != nil {
		return "", err
	}
	return path, os.Rename(tmp.Name(), path)
}

// kernelCompressors are the formats a bzImage's payload may have, by
// their magic bytes, and the program that decompresses each.
var kernelCompressors = []struct {
	magic []byte
	cmd   []string
}{
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0}, []string{"xz", "-dcq"}},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, []string{"zstd", "-dcq"}},
	{[]byte{0x1f, 0x8b, 0x08}, []string{"gzip", "-dcq"}},
	{[]byte{0x02, 0x21, 0x4c, 0x18}, []string{"lz4", "-dcq"}},
}

// decompressKernel finds the compressed ELF inside a bzImage: at each
// place a known format's magic bytes occur (first occurrence of each), it
// decompresses from there and keeps the first output that is an ELF with
// a PVH entry. Trailing bytes after the stream make the programs complain;
// their output counts all the same.
func decompressKernel(img []byte) ([]byte, error) {
	for _, c := range kernelCompressors {
		i := bytes.Index(img, c.magic)
		if i < 0 {
			continue
		}
		if _, err := exec.LookPath(c.cmd[0]); err != nil {
			continue
		}
		cmd := exec.Command(c.cmd[0], c.cmd[1:]...)
		cmd.Stdin = bytes.NewReader(img[i:])
		out, _ := cmd.Output()
		if err := hasPVHEntry(out); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("no compressed ELF with a PVH entry point found (xz, zstd, gzip, lz4)")
}

// checkPVH tells whether the file at path is an ELF with a PVH entry; it
// reads the headers and notes only, not the whole kernel (every lab up
// checks its cached copy).
func checkPVH(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("not an ELF: %w", err)
	}
	defer f.Close()
	return pvhEntry(f)
}

// xenElfNotePhys32Entry is the type of the Xen ELF note that holds a
// kernel's 32-bit PVH entry point.
const xenElfNotePhys32Entry = 18

// hasPVHEntry tells whether b is an x86-64 ELF with a Xen PHYS32_ENTRY
// note.
func hasPVHEntry(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("not an ELF: %w", err)
	}
	return pvhEntry(f)
}

// pvhEntry tells whether f is an x86-64 ELF with a Xen PHYS32_ENTRY note.
func pvhEntry(f *elf.File) error {
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("ELF for %v, not x86-64", f.Machine)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			return err
		}
		for len(data) >= 12 {
			nameSz, descSz, typ := binary.LittleEndian.Uint32(data), binary.LittleEndian.Uint32(data[4:]), binary.LittleEndian.Uint32(data[8:])
			off := 12 + align4(nameSz)
			end := off + align4(descSz)
			if nameSz > uint32(len(data)) || descSz > uint32(len(data)) || end > uint32(len(data)) {
				break
			}
			if string(bytes.TrimRight(data[12:12+nameSz], "\x00")) == "Xen" && typ == xenElfNotePhys32Entry {
				return nil
			}
			data = data[end:]
		}
	}
	return fmt.Errorf("ELF without a PVH entry point (Xen note %d)", xenElfNotePhys32Entry)
}

func align4(n uint32) uint32 { return (n + 3) &^ 3 }
