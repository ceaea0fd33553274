package inputfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	ok := filepath.Join(dir, "ok")
	big := filepath.Join(dir, "big")
	fifo := filepath.Join(dir, "fifo")
	os.WriteFile(ok, []byte("hello"), 0o644)
	os.WriteFile(big, make([]byte, 101), 0o644)
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, want string
	}{
		{ok, ""},
		{big, big + ": larger than 100 bytes"},
		{fifo, fifo + ": not a regular file"},
		{dir, dir + ": not a regular file (a directory)"},
		{"/dev/zero", "/dev/zero: not a regular file"},
		{filepath.Join(dir, "none"), filepath.Join(dir, "none") + ": no such file or directory"},
	} {
		b, err := Read(c.path, 100)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want || (err == nil && string(b) != "hello") {
			t.Errorf("Read(%s) = %q, %q; want error %q", c.path, b, got, c.want)
		}
		if strings.Contains(got, "\n") {
			t.Errorf("Read(%s): error of more than one line", c.path)
		}
	}
	if _, err := Read(filepath.Join(dir, "none"), 100); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file's error does not unwrap to fs.ErrNotExist: %v", err)
	}
	if sizeText(16<<20) != "16 MiB" {
		t.Errorf("sizeText(16 MiB) = %s", sizeText(16<<20))
	}
}

func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o644)
		return p
	}
	var v struct {
		A []struct{} `json:"a"`
		B int        `json:"b"`
	}
	many := write("many", `{"a": [`+strings.Repeat("{},", MaxJSONValues)+`{}]}`)
	for _, c := range []struct{ path, want string }{
		{write("ok", `{"a": [{}], "b": 1}`), ""},
		{write("syntax", "{\n\"a\": [}"), "syntax:2: invalid JSON: invalid character '}' looking for beginning of value"},
		{write("type", "{\n\n\"b\": \"x\"}"), "type:3: invalid JSON: cannot unmarshal string into Go struct field .b of type int"},
		{many, "many:1: more than 200000 JSON values"},
	} {
		err := ReadJSON(c.path, 16<<20, &v)
		got := ""
		if err != nil {
			got = strings.TrimPrefix(err.Error(), dir+"/")
		}
		if got != c.want {
			t.Errorf("ReadJSON(%s) = %q, want %q", filepath.Base(c.path), got, c.want)
		}
	}
}
