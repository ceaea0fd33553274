// Package nbd speaks the Network Block Device protocol (fixed newstyle
// handshake, simple replies): a server that exports block devices to many
// clients with many requests in flight each, and a multiplexing client for
// upstream connections. It knows nothing about scheduling or policy; a
// misbehaving client can only ever close its own connection.
package nbd

import "errors"

// Protocol magic numbers and constants (NBD protocol document, proto.md).
const (
	nbdMagic      = 0x4e42444d41474943 // "NBDMAGIC"
	optMagic      = 0x49484156454F5054 // "IHAVEOPT"
	optReplyMagic = 0x3e889045565a9
	requestMagic  = 0x25609513
	simpleMagic   = 0x67446698

	flagFixedNewstyle = 1 << 0
	flagNoZeroes      = 1 << 1

	optExportName = 1
	optAbort      = 2
	optList       = 3
	optStartTLS   = 5
	optInfo       = 6
	optGo         = 7

	repAck        = 1
	repServer     = 2
	repInfo       = 3
	repErrUnsup   = 1<<31 + 1
	repErrPolicy  = 1<<31 + 2
	repErrInvalid = 1<<31 + 3
	repErrTLSReqd = 1<<31 + 5
	repErrUnknown = 1<<31 + 6
	repErrTooBig  = 1<<31 + 9

	infoExport    = 0
	infoName      = 1
	infoBlockSize = 3

	tflagHasFlags   = 1 << 0
	tflagSendFlush  = 1 << 2
	tflagSendFUA    = 1 << 3
	tflagSendTrim   = 1 << 5
	tflagMultiConn  = 1 << 8
	transmitFlagsRW = tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagSendTrim | tflagMultiConn

	// Command types.
	CmdRead  = 0
	CmdWrite = 1
	CmdDisc  = 2
	CmdFlush = 3
	CmdTrim  = 4

	// CmdFlagFUA asks that a write be durable before it is acknowledged.
	CmdFlagFUA = 1 << 0

	// MaxPayloadBytes is the largest READ or WRITE the server accepts (32 MiB,
	// the usual NBD maximum).
	MaxPayloadBytes = 32 << 20
	// maxOptionBytes bounds the payload of one handshake option.
	maxOptionBytes = 64 << 10
	// maxOptions bounds the options of one handshake.
	maxOptions = 256
)

// Errno values carried in NBD replies.
const (
	EPERM     = 1
	EIO       = 5
	ENOMEM    = 12
	EINVAL    = 22
	ENOSPC    = 28
	EOVERFLOW = 75
	ENOTSUP   = 95
	ESHUTDOWN = 108
)

// Error is an NBD error reply: the errno the server sent or will send.
type Error struct{ Errno uint32 }

func (e *Error) Error() string {
	switch e.Errno {
	case EPERM:
		return "nbd: operation not permitted"
	case EIO:
		return "nbd: I/O error"
	case ENOMEM:
		return "nbd: out of memory"
	case EINVAL:
		return "nbd: invalid argument"
	case ENOSPC:
		return "nbd: no space left (beyond end of export)"
	case EOVERFLOW:
		return "nbd: request too large"
	case ENOTSUP:
		return "nbd: operation not supported"
	case ESHUTDOWN:
		return "nbd: server shutting down"
	}
	return "nbd: error " + itoa(int(e.Errno))
}

// ErrClosed is returned for requests on a client connection that has closed.
var ErrClosed = errors.New("nbd: connection closed")

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// errnoOf maps a backend error to the errno sent to the client.
func errnoOf(err error) uint32 {
	var e *Error
	if errors.As(err, &e) {
		return e.Errno
	}
	return EIO
}
