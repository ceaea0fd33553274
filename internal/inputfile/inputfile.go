// Package inputfile is the one way sluice reads a file it is given:
// policies, scenarios and the state files of the daemons. It reads only
// regular files, refuses those above a size cap before reading them and
// never blocks (a FIFO or a device given as a file is refused, not waited
// on). Its errors are one line that starts with the file's name.
package inputfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// Caps on the files sluice reads, in bytes.
const (
	MaxPolicyBytes = 8 << 20  // a policy or scenario file
	MaxStateBytes  = 16 << 20 // a state file written by a daemon (agent, gateway, lab)
	// MaxJSONValues is how many JSON objects, arrays and list items a
	// state file may hold; counted before decoding, so that a file of
	// millions of empty objects costs no memory.
	MaxJSONValues = 200_000
)

// Error is a file that could not be read, as one line `FILE: MSG`. It
// unwraps to the cause, so errors.Is(err, fs.ErrNotExist) works.
type Error struct {
	Path string
	Msg  string
	Err  error // cause; nil for a refusal (not a regular file, too large)
}

func (e *Error) Error() string { return e.Path + ": " + e.Msg }

func (e *Error) Unwrap() error { return e.Err }

// ErrNotRegular and ErrTooLarge are the causes of the two refusals.
var (
	ErrNotRegular = errors.New("not a regular file")
	ErrTooLarge   = errors.New("file too large")
)

// Read returns the contents of the regular file at path, at most max bytes.
// A directory, FIFO, socket or device is refused with `PATH: not a regular
// file`, a larger file with `PATH: larger than N MiB`; the file is opened
// without blocking and its size checked before anything is read.
func Read(path string, max int64) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, &Error{Path: path, Msg: errnoText(err), Err: &fs.PathError{Op: "open", Path: path, Err: err}}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &Error{Path: path, Msg: errnoText(err), Err: err}
	}
	if !st.Mode().IsRegular() {
		what := "not a regular file"
		if st.IsDir() {
			what = "not a regular file (a directory)"
		}
		return nil, &Error{Path: path, Msg: what, Err: ErrNotRegular}
	}
	if st.Size() > max {
		return nil, tooLarge(path, max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, &Error{Path: path, Msg: errnoText(err), Err: err}
	}
	if int64(len(data)) > max { // grew while we read it, or a size-less file
		return nil, tooLarge(path, max)
	}
	return data, nil
}

func tooLarge(path string, max int64) error {
	return &Error{Path: path, Msg: "larger than " + sizeText(max), Err: ErrTooLarge}
}

// sizeText renders a cap: "8 MiB", "512 KiB", "100 bytes".
func sizeText(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// errnoText is the message of an error without the Go wrapping that
// repeats the path ("open PATH: no such file or directory" → "no such file
// or directory").
func errnoText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err.Error()
}

// ReadJSON reads the state file at path with Read (at most max bytes) and
// decodes it into v. A file with more than MaxJSONValues values is refused
// before decoding; a decoding error is one line `PATH:LINE: message`.
func ReadJSON(path string, max int64, v any) error {
	data, err := Read(path, max)
	if err != nil {
		return err
	}
	if n, off := countJSON(data); n > MaxJSONValues {
		return &Error{Path: fmt.Sprintf("%s:%d", path, lineAt(data, int64(off))), Msg: fmt.Sprintf("more than %d JSON values", MaxJSONValues)}
	}
	if err := json.Unmarshal(data, v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		off := int64(0)
		switch {
		case errors.As(err, &se):
			off = se.Offset
		case errors.As(err, &te):
			off = te.Offset
		}
		msg := strings.TrimPrefix(err.Error(), "json: ")
		return &Error{Path: fmt.Sprintf("%s:%d", path, lineAt(data, off)), Msg: "invalid JSON: " + msg, Err: err}
	}
	return nil
}

// countJSON counts the objects, arrays and separators of data outside
// strings (an upper bound of the values less one), stopping past
// MaxJSONValues; off is where it stopped.
func countJSON(data []byte) (n int, off int) {
	in := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == '{' || c == '[' || c == ','):
			if n++; n > MaxJSONValues {
				return n, i
			}
		}
	}
	return n, len(data)
}

// lineAt is the 1-based line of byte offset off in data.
func lineAt(data []byte, off int64) int {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	if off < 0 {
		off = 0
	}
	return 1 + bytes.Count(data[:off], []byte("\n"))
}
