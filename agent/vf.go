package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sluice/entitle"
)

// SR-IOV virtual functions. A passthrough vNIC on a VF (policy
// `passthrough: vf`) bypasses the host's qdiscs: its packets leave through
// the NIC's own switch. The agent gives it its reservation and limit as
// the VF's min_tx_rate and max_tx_rate (whole Mbit/s), set on the PF with
// RTM_SETLINK (IFLA_VFINFO_LIST / IFLA_VF_INFO / IFLA_VF_RATE), reading
// before writing. Before its first write to a VF it records the rates the
// VF had (the VF originals file, VFOriginalsPath); a VF no running VM of
// the policy uses any more (its VM stopped or left) gets them back at the
// next step, and so does every recorded VF at `sluice agent uninstall`
// (UninstallVFs). The VF belongs to the host, not to the VM.

// VF is an SR-IOV virtual function as the host knows it.
type VF struct {
	PCI   string // its PCI address, 0000:03:10.1
	PF    string // its PF's network device, e.g. enp3s0f0
	Index int    // its index on the PF (the PF's virtfnN link)
}

// VFInventory is an Inventory that knows which VF a passthrough vNIC of a
// running VM uses (libvirt's domain XML and sysfs: virt.Inventory.VF).
type VFInventory interface {
	// VF returns the VF of the port VM/NIC, or why it cannot be found.
	VF(port string) (VF, error)
}

// VFRate is a VF's transmit rates, whole Mbit/s as IFLA_VF_RATE takes
// them; MaxTxMbps 0 is no limit, MinTxMbps 0 no guarantee.
type VFRate struct {
	MinTxMbps uint32 `json:"min_tx_mbps"`
	MaxTxMbps uint32 `json:"max_tx_mbps"`
}

func (r VFRate) String() string {
	return fmt.Sprintf("min_tx_rate %d, max_tx_rate %d Mbit/s", r.MinTxMbps, r.MaxTxMbps)
}

// VFKernel reads and sets the rates of a PF's VFs: NetlinkVF on a host,
// FakeVF in tests.
type VFKernel interface {
	// VFRates returns the rates of every VF of the PF device pf, by index.
	VFRates(pf string) (map[int]VFRate, error)
	// SetVFRate sets the rates of VF vf of pf.
	SetVFRate(pf string, vf int, r VFRate) error
}

// VFStat is one VF vNIC of the host in the agent's status.
type VFStat struct {
	Port  string `json:"port"`
	PF    string `json:"pf,omitempty"`
	Index int    `json:"vf"`
	PCI   string `json:"pci,omitempty"`
	// Uplink is the policy's uplink (the PF it names).
	Uplink string `json:"uplink"`
	Want   VFRate `json:"want"`
	// Have is what the kernel reported before this step's write.
	Have VFRate `json:"have"`
	// Error says why the VF is not enforced (not found, the write
	// failed); "" when its rates are in place.
	Error string `json:"error,omitempty"`
}

// vfKey names a VF in the originals file: PF/index.
func vfKey(pf string, index int) string { return pf + "/" + strconv.Itoa(index) }

// VFOriginalsPath is where a host's agent records the rates each VF had
// before sluice set its own.
func VFOriginalsPath(dir, cluster, host string) string {
	return filepath.Join(dir, fmt.Sprintf("vf-originals-%s-%s.json", cluster, host))
}

// writeVFOriginals writes the originals file, or removes it when empty.
func writeVFOriginals(path string, m map[string]VFRate) error {
	if path == "" {
		return nil
	}
	if len(m) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return writeJSON(path, m)
}

// vfWant is a VF to set: its port's spec and where it was found.
type vfWant struct {
	spec   entitle.VFSpec
	uplink string
}

// reconcileVFs sets every VF of the trees' VF vNICs to its rates (read
// before write), records a VF's rates before the first write, and gives
// each recorded VF that no running VM uses any more its recorded rates
// back. A VF that cannot be found is reported in the statistics and
// skipped: everything else is still enforced.
func (a *Agent) reconcileVFs(ch *Changes) ([]VFStat, error) {
	var wants []vfWant
	for _, t := range a.trees {
		for _, v := range t.VFs {
			wants = append(wants, vfWant{spec: v, uplink: t.Uplink})
		}
	}
	if a.cfg.VF == nil || (len(wants) == 0 && len(a.vfOrig) == 0) {
		return nil, nil
	}
	if a.vfOrig == nil {
		orig, err := readOriginals[VFRate](a.cfg.VFOriginalsPath)
		if err != nil {
			return nil, fmt.Errorf("VF originals: %w", err)
		}
		a.vfOrig = orig
	}
	inv, _ := a.cfg.Inventory.(VFInventory)
	var stats []VFStat
	var errs []error
	used := map[string]bool{}
	rates := map[string]map[int]VFRate{} // read once per PF and step
	readPF := func(pf string) (map[int]VFRate, error) {
		if r, ok := rates[pf]; ok {
			return r, nil
		}
		r, err := a.cfg.VF.VFRates(pf)
		if err != nil {
			return nil, fmt.Errorf("VFRates %s: %w", pf, err)
		}
		rates[pf] = r
		return r, nil
	}
	for _, w := range wants {
		want := VFRate{MinTxMbps: w.spec.MinTxMbps, MaxTxMbps: w.spec.MaxTxMbps}
		st := VFStat{Port: w.spec.Port, Uplink: w.uplink, Want: want, Index: -1}
		if inv == nil {
			st.Error = "the inventory does not know VFs (use --inventory libvirt)"
			stats = append(stats, st)
			continue
		}
		vf, err := inv.VF(w.spec.Port)
		st.PF, st.PCI = vf.PF, vf.PCI
		if err != nil {
			st.Error = "VF not found: " + err.Error()
			stats = append(stats, st)
			continue
		}
		st.Index = vf.Index
		key := vfKey(vf.PF, vf.Index)
		used[key] = true
		have, err := readPF(vf.PF)
		if err != nil {
			st.Error = err.Error()
			errs = append(errs, err)
			stats = append(stats, st)
			continue
		}
		cur, ok := have[vf.Index]
		if !ok {
			st.Error = fmt.Sprintf("PF %s reports no VF %d", vf.PF, vf.Index)
			stats = append(stats, st)
			continue
		}
		st.Have = cur
		if dev, err := a.cfg.Inventory.UplinkDevice(w.uplink); err == nil && dev != vf.PF {
			st.Error = fmt.Sprintf("the VF is on PF %s, the policy's uplink %s is device %s: admission counted it there", vf.PF, w.uplink, dev)
		}
		if cur == want {
			stats = append(stats, st)
			continue
		}
		if _, ok := a.vfOrig[key]; !ok {
			a.vfOrig[key] = cur
			if err := writeVFOriginals(a.cfg.VFOriginalsPath, a.vfOrig); err != nil {
				// Not recorded: not changed, so that uninstall can give it back.
				delete(a.vfOrig, key)
				err = fmt.Errorf("VF originals: %w", err)
				st.Error, errs = err.Error(), append(errs, err)
				stats = append(stats, st)
				continue
			}
		}
		if err := a.cfg.VF.SetVFRate(vf.PF, vf.Index, want); err != nil {
			err = fmt.Errorf("SetVFRate %s vf %d: %w", vf.PF, vf.Index, err)
			st.Error, errs = err.Error(), append(errs, err)
		} else {
			ch.VFs++
		}
		stats = append(stats, st)
	}
	// VFs sluice set that no running VM of the policy uses now.
	var gone []string
	for key := range a.vfOrig {
		if !used[key] {
			gone = append(gone, key)
		}
	}
	sort.Strings(gone)
	n, err := giveBackVFs(a.cfg.VF, a.vfOrig, gone, nil)
	ch.VFs += n
	errs = append(errs, err)
	errs = append(errs, writeVFOriginals(a.cfg.VFOriginalsPath, a.vfOrig))
	return stats, errors.Join(errs...)
}

// giveBackVFs sets each VF of keys (PF/index) in orig back to its
// recorded rates (read before write) and forgets it; a PF or VF that is
// gone is forgotten too (nothing is left to give back). It returns how
// many VFs it wrote, and says what it did in done when not nil.
func giveBackVFs(k VFKernel, orig map[string]VFRate, keys []string, done *[]string) (int, error) {
	var errs []error
	wrote := 0
	for _, key := range keys {
		pf, idx, _ := strings.Cut(key, "/")
		i, err := strconv.Atoi(idx)
		if err != nil {
			delete(orig, key)
			continue
		}
		have, err := k.VFRates(pf)
		if err != nil {
			if isNoDevice(err) {
				delete(orig, key)
				if done != nil {
					*done = append(*done, fmt.Sprintf("VF %s: PF gone, skipped", key))
				}
				continue
			}
			errs = append(errs, fmt.Errorf("VFRates %s: %w", pf, err))
			continue
		}
		cur, ok := have[i]
		if !ok {
			delete(orig, key) // the PF has fewer VFs now (sriov_numvfs changed)
			continue
		}
		if cur != orig[key] {
			if err := k.SetVFRate(pf, i, orig[key]); err != nil {
				errs = append(errs, fmt.Errorf("SetVFRate %s vf %d: %w", pf, i, err))
				continue
			}
			wrote++
		}
		if done != nil {
			*done = append(*done, fmt.Sprintf("VF %s: %s given back", key, orig[key]))
		}
		delete(orig, key)
	}
	return wrote, errors.Join(errs...)
}

// UninstallVFs gives every VF recorded in the originals file path the
// rates it had before sluice (read before write) and removes the file.
// It returns a line per VF; running it again does nothing.
func UninstallVFs(k VFKernel, path string) ([]string, error) {
	orig, err := readOriginals[VFRate](path)
	if err != nil || len(orig) == 0 {
		return nil, err
	}
	keys := make([]string, 0, len(orig))
	for key := range orig {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var done []string
	_, err = giveBackVFs(k, orig, keys, &done)
	return done, errors.Join(err, writeVFOriginals(path, orig))
}

// VFLog remembers which problems of the VF vNICs were logged, so that
// each is logged once while it lasts.
type VFLog struct {
	said map[string]string // port → problem
}

// Fresh returns the VF problems of s not logged yet and forgets those
// that are gone.
func (l *VFLog) Fresh(s Stats) []string {
	now := map[string]string{}
	var out []string
	for _, v := range s.VFs {
		if v.Error == "" {
			continue
		}
		now[v.Port] = v.Error
		if l.said[v.Port] != v.Error {
			out = append(out, fmt.Sprintf("VF vNIC %s: %s (the rest is enforced)", v.Port, v.Error))
		}
	}
	l.said = now
	return out
}
