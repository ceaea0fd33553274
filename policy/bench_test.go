package policy

import (
	"fmt"
	"strings"
	"testing"
)

// bigPolicy writes a policy of hosts hosts (two 10 Gbps uplinks each) and
// vms VMs spread over them, each with one reserved vNIC and one disk.
func bigPolicy(hosts, vms int) []byte {
	var b strings.Builder
	b.WriteString("cluster: big\nhosts:\n")
	for h := 0; h < hosts; h++ {
		fmt.Fprintf(&b, "  - {name: h%d, cpu: {cores: 64, mhz: 2000}, memory: 1TiB, uplinks: [{name: u0, speed: 10Gbps}, {name: u1, speed: 10Gbps}]}\n", h)
	}
	fmt.Fprintf(&b, "networkPools: [{name: p, reservation: %dGbps, portGroups: [pg]}]\n", hosts)
	b.WriteString("datastores: [{name: ds, array: {slots: 64, serviceTime: 1ms}}]\nvms:\n")
	for v := 0; v < vms; v++ {
		fmt.Fprintf(&b, "  - {name: vm%d, host: h%d, cpu: {vcpus: 2, reservationMHz: 100}, memory: 2GiB, nics: [{name: n0, portGroup: pg, reservation: 1Mbps}], disks: [{name: d0, datastore: ds, reservationIOPS: 1}]}\n", v, v%hosts)
	}
	return []byte(b.String())
}

// BenchmarkParse measures Parse (decode + validation) on policies of
// growing size; bytes/op is the file size.
func BenchmarkParse(b *testing.B) {
	for _, size := range []struct{ hosts, vms int }{{2, 3}, {10, 100}, {100, 4000}, {1000, 40000}} {
		data := bigPolicy(size.hosts, size.vms)
		b.Run(fmt.Sprintf("hosts=%d/vms=%d", size.hosts, size.vms), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for i := 0; i < b.N; i++ {
				if _, err := Parse("big.yaml", data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUplinkAssignment measures the derived vNIC → uplink view.
func BenchmarkUplinkAssignment(b *testing.B) {
	p, err := Parse("big.yaml", bigPolicy(100, 4000))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(p.UplinkAssignment()) != 4000 {
			b.Fatal("wrong assignment")
		}
	}
}
