package lab

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"sluice/virt"
)

// GuestResult is what a command run in a guest left behind.
type GuestResult struct {
	Exit   int
	Stdout []byte
	Stderr []byte
}

// GuestExec runs argv in the lab guest vm of cluster, through the QEMU guest
// agent the guest runs (GuestScript), and waits until it exits or ctx ends.
// A non-zero exit is an error that ends with the tail of its stderr; the
// result is filled in either case.
func GuestExec(ctx context.Context, cluster, vm string, argv ...string) (GuestResult, error) {
	pid, err := GuestStart(ctx, cluster, vm, argv...)
	if err != nil {
		return GuestResult{}, err
	}
	return GuestWait(ctx, cluster, vm, pid)
}

// GuestStart starts argv in the guest and returns its pid in the guest
// without waiting; its output is kept by the guest agent for GuestWait.
// It retries while the guest agent is not up yet, until ctx ends.
func GuestStart(ctx context.Context, cluster, vm string, argv ...string) (int, error) {
	if len(argv) == 0 {
		return 0, fmt.Errorf("lab: guest exec in %s: no command", vm)
	}
	cmd, err := json.Marshal(map[string]any{
		"execute": "guest-exec",
		"arguments": map[string]any{
			"path": argv[0], "arg": append([]string{}, argv[1:]...), "capture-output": true,
		},
	})
	if err != nil {
		return 0, err
	}
	var reply struct {
		Return struct {
			PID int `json:"pid"`
		} `json:"return"`
	}
	for {
		err = agentCommand(cluster, vm, string(cmd), &reply)
		if err == nil {
			return reply.Return.PID, nil
		}
		if !agentNotUp(err) {
			return 0, fmt.Errorf("lab: guest exec %q in %s: %w", strings.Join(argv, " "), vm, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("lab: guest exec %q in %s: %w (last: %v)", strings.Join(argv, " "), vm, ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// GuestWait waits for the guest command pid to exit and returns its exit
// status and output.
func GuestWait(ctx context.Context, cluster, vm string, pid int) (GuestResult, error) {
	cmd := fmt.Sprintf(`{"execute":"guest-exec-status","arguments":{"pid":%d}}`, pid)
	var reply struct {
		Return struct {
			Exited   bool   `json:"exited"`
			ExitCode int    `json:"exitcode"`
			Signal   int    `json:"signal"`
			OutData  string `json:"out-data"`
			ErrData  string `json:"err-data"`
		} `json:"return"`
	}
	poll := 20 * time.Millisecond
	for {
		if err := agentCommand(cluster, vm, cmd, &reply); err != nil {
			return GuestResult{}, fmt.Errorf("lab: guest pid %d in %s: %w", pid, vm, err)
		}
		r := reply.Return
		if r.Exited {
			out, _ := base64.StdEncoding.DecodeString(r.OutData)
			errb, _ := base64.StdEncoding.DecodeString(r.ErrData)
			res := GuestResult{Exit: r.ExitCode, Stdout: out, Stderr: errb}
			if r.Signal != 0 {
				res.Exit = 128 + r.Signal
			}
			if res.Exit != 0 {
				return res, fmt.Errorf("lab: guest pid %d in %s exited %d: %s", pid, vm, res.Exit, tail(errb, 400))
			}
			return res, nil
		}
		select {
		case <-ctx.Done():
			return GuestResult{}, fmt.Errorf("lab: guest pid %d in %s: %w", pid, vm, ctx.Err())
		case <-time.After(poll):
		}
		if poll < 500*time.Millisecond {
			poll *= 2
		}
	}
}

// agentCommand sends one guest agent command to the guest's domain and
// decodes its reply into v.
func agentCommand(cluster, vm, cmd string, v any) error {
	c, err := virt.Dial("")
	if err != nil {
		return err
	}
	defer c.Close()
	l := c.Client()
	dom, err := l.DomainLookupByName(NamespacePrefix(cluster) + vm)
	if err != nil {
		return err
	}
	const timeoutS = 10
	out, err := l.QEMUDomainAgentCommand(dom, cmd, timeoutS, 0)
	if err != nil {
		return err
	}
	if len(out) == 0 {
		return fmt.Errorf("guest agent: empty reply")
	}
	return json.Unmarshal([]byte(out[0]), v)
}

// agentNotUp tells the errors of a guest agent that has not started yet.
func agentNotUp(err error) bool {
	s := err.Error()
	return strings.Contains(s, "not responding") || strings.Contains(s, "not connected") ||
		libvirt.IsNotFound(err) && strings.Contains(s, "agent")
}

func tail(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}
