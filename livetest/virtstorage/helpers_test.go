// Package virtstorage tests the storage path with real QEMU guests under the
// machine's libvirtd, the way a VM uses it: the lab (`lab: {kind: qemu}`)
// attaches each guest's disks to its host's gateway over NBD on a Unix
// socket, the guest sees them as virtio-blk disks (/dev/vda, …), and fio
// runs inside the guest (lab.GuestExec, through the QEMU guest agent) with
// direct I/O on the block device. The tests need root, libvirtd, nbdkit,
// fio and what scripts/deps.sh installs; a missing piece fails them with
// its reason. Each run uses a fresh cluster name (vs…-) and removes its lab
// when it ends, also when it fails; guests power themselves off after a
// few minutes in any case.
package virtstorage

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"sluice/lab"
	"sluice/livetest/livelab"
	"sluice/storage"
)

// sluiceBin is the sluice binary built for this run (TestMain): the lab's
// gateways run it.
var sluiceBin string

func TestMain(m *testing.M) { os.Exit(livelab.RunWithSluice(m, &sluiceBin)) }

// guestLab is a lab whose VMs are QEMU guests (livelab.GuestLab), with
// the storage tests' own helpers.
type guestLab struct{ *livelab.GuestLab }

// guestTTL is how long a test's guests live at most (they power themselves
// off: a killed test leaves no guest running for long).
var guestTTL = 4 * time.Minute

// upLab brings up the lab of policyYAML (livelab.UpGuestLab) with this
// run's sluice binary as the gateway.
func upLab(t *testing.T, prefix, policyYAML string) *guestLab {
	t.Helper()
	return &guestLab{livelab.UpGuestLab(t, prefix, policyYAML, lab.Options{Gateway: sluiceBin, GuestTTL: guestTTL})}
}

// fioResult and fioJob are fio's report of a guest's run.
type (
	fioResult = livelab.GuestFioResult
	fioJob    = livelab.GuestFioJob
)

func loadavg() string { return livelab.Loadavg() }

func tail(s string, n int) string { return livelab.Tail(s, n) }

// process returns the lab's recorded process named name ("gateway:h1",
// "nbdkit:ds1").
func (l *guestLab) process(name string) lab.Process {
	l.T.Helper()
	st, err := lab.ReadState(l.Dir, l.P.Cluster)
	if err != nil || st == nil {
		l.T.Fatalf("lab state: %v", err)
	}
	found, ok := st.Process(name)
	if !ok {
		l.T.Fatalf("lab state lists no %s: %+v", name, st.Processes)
	}
	return found
}

// restartGateway starts the recorded gateway pr again with the same command
// line in the same namespace, as a supervisor would, and waits until its
// socket accepts (and restarts the datastore *ds if nbdkit's known abort
// took it down: livelab.RestartGateway). The lab's Down kills them with
// the namespaces' processes.
func (l *guestLab) restartGateway(pr lab.Process, socket string, ds *lab.Process) {
	l.T.Helper()
	f, err := os.OpenFile(filepath.Join(l.Dir, "gateway-restarted.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		l.T.Fatal(err)
	}
	defer f.Close()
	start := func() <-chan struct{} {
		cmd := exec.Command("ip", append([]string{"netns", "exec", pr.Namespace}, pr.Args...)...)
		cmd.Stdout, cmd.Stderr = f, f
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			l.T.Fatalf("restart gateway: %v", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		return done
	}
	err = livelab.RestartGateway(l.T, ds, start, func(exited <-chan struct{}) error {
		return livelab.AcceptsOn("unix", socket, 10*time.Second, exited)
	})
	if err != nil {
		log, _ := os.ReadFile(f.Name())
		l.T.Fatalf("the restarted gateway: %v; its log:\n%s", err, log)
	}
}

// gatewayStatus reads host's gateway status file (written every period).
func (l *guestLab) gatewayStatus(host string) (storage.Status, error) {
	return storage.ReadStatusFile(l.statusFile(host))
}

// statusFile is host's gateway status file.
func (l *guestLab) statusFile(host string) string {
	return filepath.Join(lab.DefaultStateDir, "gateway-"+l.P.Cluster+"-"+host+".json")
}
