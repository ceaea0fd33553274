package nbd

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
)

// scriptConn plays a fixed client byte stream to the server and discards
// what the server sends.
type scriptConn struct{ r *bytes.Reader }

func (c *scriptConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *scriptConn) Close() error                { return nil }

// clientScript builds a valid client stream: flags, NBD_OPT_GO for export,
// then the given requests.
func clientScript(export string, reqs ...[]byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(flagFixedNewstyle|flagNoZeroes))
	binary.Write(&b, binary.BigEndian, uint64(optMagic))
	binary.Write(&b, binary.BigEndian, uint32(optGo))
	binary.Write(&b, binary.BigEndian, uint32(4+len(export)+2))
	binary.Write(&b, binary.BigEndian, uint32(len(export)))
	b.WriteString(export)
	binary.Write(&b, binary.BigEndian, uint16(0))
	for _, r := range reqs {
		b.Write(r)
	}
	return b.Bytes()
}

func req(typ, flags uint16, handle, off uint64, length uint32, payload []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(requestMagic))
	binary.Write(&b, binary.BigEndian, flags)
	binary.Write(&b, binary.BigEndian, typ)
	binary.Write(&b, binary.BigEndian, handle)
	binary.Write(&b, binary.BigEndian, off)
	binary.Write(&b, binary.BigEndian, length)
	b.Write(payload)
	return b.Bytes()
}

// FuzzServer feeds arbitrary client bytes to the server: it must never
// panic, hang or touch memory outside the export, whatever the client sends.
func FuzzServer(f *testing.F) {
	f.Add(clientScript("d"))
	f.Add(clientScript("d", req(CmdWrite, CmdFlagFUA, 1, 0, 4, []byte("abcd")), req(CmdRead, 0, 2, 0, 4, nil), req(CmdFlush, 0, 3, 0, 0, nil), req(CmdDisc, 0, 4, 0, 0, nil)))
	f.Add(clientScript("d", req(CmdRead, 0, 1, 1<<40, 4096, nil), req(CmdTrim, 0, 2, 65000, 1000, nil), req(99, 0, 3, 0, 0, nil)))
	f.Add(clientScript("d", req(CmdWrite, 0, 1, 0, 1<<30, nil)))
	f.Add(clientScript("nope"))
	f.Add([]byte{0, 0, 0, 3, 0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, 0, 0, 0, 3, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, 0, 0, 0, 1, 0, 0, 0, 1, 'd'})
	f.Fuzz(func(t *testing.T, in []byte) {
		mem := &memBackend{data: make([]byte, 64<<10)}
		s := &Server{Exports: MapExports{"d": mem}, MaxInFlight: 4}
		s.ServeConn(&scriptConn{r: bytes.NewReader(in)})
		if len(mem.data) != 64<<10 {
			t.Fatal("export resized")
		}
	})
}

var _ io.ReadWriteCloser = (*scriptConn)(nil)
