package nbd

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"io"
	"testing"

	"sluice/internal/testcert"
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

// optScript is a client stream of flags and bare options (no payload).
func optScript(opts ...uint32) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, uint32(flagFixedNewstyle|flagNoZeroes))
	for _, o := range opts {
		binary.Write(&b, binary.BigEndian, uint64(optMagic))
		binary.Write(&b, binary.BigEndian, o)
		binary.Write(&b, binary.BigEndian, uint32(0))
	}
	return b.Bytes()
}

// FuzzServer feeds arbitrary client bytes to the server: it must never
// panic, hang or touch memory outside the export, whatever the client sends.
// Every input is served three times: on a listener open to all exports; on
// one whose Access allows only "d" (export "x" must stay untouched); and on
// one that requires TLS (the fuzzer cannot complete a TLS handshake, so no
// export may be touched at all).
func FuzzServer(f *testing.F) {
	ca, err := testcert.NewCA("fuzz CA")
	if err != nil {
		f.Fatal(err)
	}
	sp, err := ca.Server()
	if err != nil {
		f.Fatal(err)
	}
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{sp.TLS()}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	onlyD := func(id, export string) bool { return export == "d" }
	f.Add(optScript(optList))
	f.Add(optScript(optStartTLS))
	f.Add(append(optScript(optStartTLS), 0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0))
	f.Add(optScript(optStartTLS, optStartTLS, optList))
	f.Add(clientScript("x", req(CmdWrite, 0, 1, 0, 4, []byte("abcd"))))
	f.Add(clientScript("d"))
	f.Add(clientScript("d", req(CmdWrite, CmdFlagFUA, 1, 0, 4, []byte("abcd")), req(CmdRead, 0, 2, 0, 4, nil), req(CmdFlush, 0, 3, 0, 0, nil), req(CmdDisc, 0, 4, 0, 0, nil)))
	f.Add(clientScript("d", req(CmdRead, 0, 1, 1<<40, 4096, nil), req(CmdTrim, 0, 2, 65000, 1000, nil), req(99, 0, 3, 0, 0, nil)))
	f.Add(clientScript("d", req(CmdWrite, 0, 1, 0, 1<<30, nil)))
	f.Add(clientScript("nope"))
	f.Add([]byte{0, 0, 0, 3, 0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, 0, 0, 0, 3, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, 0, 0, 0, 1, 0, 0, 0, 1, 'd'})
	f.Fuzz(func(t *testing.T, in []byte) {
		for mode, a := range []Access{{}, {Allow: onlyD}, {Allow: onlyD, TLS: tlsCfg}} {
			mem := &memBackend{data: make([]byte, 64<<10)}
			other := &memBackend{data: make([]byte, 4096)}
			s := &Server{Exports: MapExports{"d": mem, "x": other}, MaxInFlight: 4}
			s.ServeConnAccess(&scriptConn{r: bytes.NewReader(in)}, a)
			if len(mem.data) != 64<<10 || len(other.data) != 4096 {
				t.Fatal("export resized")
			}
			if mode > 0 && !bytes.Equal(other.data, make([]byte, 4096)) {
				t.Fatalf("mode %d: export x, not allowed, was written", mode)
			}
			if mode == 2 && !bytes.Equal(mem.data, make([]byte, 64<<10)) {
				t.Fatal("export d was written without TLS")
			}
		}
	})
}

var _ io.ReadWriteCloser = (*scriptConn)(nil)
