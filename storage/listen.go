package storage

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Listen opens the listener a gateway serves its VMs on. addr is
// "HOST:PORT" (TCP) or "unix:PATH" (a Unix socket, for VMs on the same
// host: no TCP/IP stack on the VM→gateway leg; fio reaches it as
// nbd+unix:///EXPORT?socket=PATH). For a Unix socket the directory is
// created if missing, and a socket file left behind by a gateway that died
// (nobody accepts on it) is replaced; a socket somebody listens on, or a
// file that is not a socket, is an error. The socket file is removed when
// the listener closes.
func Listen(addr string) (net.Listener, error) {
	path, isUnix := strings.CutPrefix(addr, "unix:")
	if !isUnix {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, unwrapOp(err))
		}
		return l, nil
	}
	if path == "" {
		return nil, errors.New("listen unix:: want unix:PATH")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("listen %s: %s exists and is not a socket", addr, path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		switch {
		case err == nil:
			c.Close()
			return nil, fmt.Errorf("listen %s: another server listens on %s", addr, path)
		case errors.Is(err, syscall.ECONNREFUSED):
			_ = os.Remove(path) // stale: its server is gone
		default:
			return nil, fmt.Errorf("listen %s: %w", addr, unwrapOp(err))
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, unwrapOp(err))
	}
	return l, nil
}

// unwrapOp drops net.OpError's repetition of the operation and address
// (the caller's message names them).
func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		return oe.Err
	}
	return err
}

// listenName is how a listener's address appears in the Status: the form
// Listen accepts ("unix:PATH" or "HOST:PORT").
func listenName(l net.Listener) string {
	if a := l.Addr(); a.Network() == "unix" {
		return "unix:" + a.String()
	}
	return l.Addr().String()
}
