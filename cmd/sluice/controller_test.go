package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"sluice/controller"
)

// TestControllerSIGHUP runs the controller in process: SIGHUP reads the
// tokens file again (a host's token added works at once, with its
// host's rights only), and a file that does not parse leaves the tokens
// as they were; SIGTERM stops it.
func TestControllerSIGHUP(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const op = "operator-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte(op+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	exit := make(chan int, 1)
	go func() {
		exit <- runController([]string{"--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--tokens", tokens, "--drs-interval", "0"}, outW, errW)
		outW.Close()
		errW.Close()
	}()
	stdout := bufio.NewScanner(outR)
	// The log is read as it comes (the controller must never wait on its
	// log); waitLog takes its lines until one contains want.
	logLines := make(chan string, 1024)
	go func() {
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			logLines <- sc.Text()
		}
		close(logLines)
	}()
	waitLog := func(want string) {
		t.Helper()
		for l := range logLines {
			if strings.Contains(l, want) {
				return
			}
		}
		t.Fatalf("no log line with %q", want)
	}
	// waitLine reads sc until a line containing want (failing at its end).
	waitLine := func(sc *bufio.Scanner, want string) string {
		t.Helper()
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				return sc.Text()
			}
		}
		t.Fatalf("no line with %q", want)
		return ""
	}
	ready := waitLine(stdout, "ready")
	go io.Copy(io.Discard, outR)
	_, rest, _ := strings.Cut(ready, "API on ")
	server, cert, _ := strings.Cut(rest, " (certificate ")
	cert = strings.TrimSuffix(cert, ")")
	client := func(tok string) *controller.Client {
		cl, err := controller.NewClient(server, tok, cert)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	ctx := context.Background()
	line, err := controller.NewHostToken("h1")
	if err != nil {
		t.Fatal(err)
	}
	h1, _, _ := strings.Cut(line, " ")
	if _, err := client(h1).WatchDesired(ctx, "h1", 0, 0); controller.StatusOf(err) != http.StatusUnauthorized {
		t.Fatalf("h1's token before it is in the file: %v, want 401", err)
	}
	if err := os.WriteFile(tokens, []byte(op+"\n"+line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitLog("SIGHUP: 2 tokens read (1 of hosts)")
	if _, err := client(h1).WatchDesired(ctx, "h1", 0, 0); err != nil {
		t.Errorf("h1's token after SIGHUP, on h1: %v", err)
	}
	if _, err := client(h1).Hosts(ctx); controller.StatusOf(err) != http.StatusForbidden {
		t.Errorf("h1's token after SIGHUP, on /v1/hosts: %v, want 403", err)
	}
	// A file that does not parse: the tokens stay as they were.
	if err := os.WriteFile(tokens, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitLog("SIGHUP: tokens kept as they were")
	if _, err := client(op).Hosts(ctx); err != nil {
		t.Errorf("the operator's token after a bad file: %v", err)
	}
	go func() {
		for range logLines {
		}
	}()
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	if code := <-exit; code != exitOK {
		t.Errorf("exit %d after SIGTERM", code)
	}
}
