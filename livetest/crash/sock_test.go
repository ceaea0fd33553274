package crash

import (
	"time"

	"sluice/livetest/livelab"
	"sluice/storage/nbd"
)

// serving polls until a server accepts on the Unix socket of an nbd+unix
// URI (livelab.AcceptsOn).
func serving(uri string, within time.Duration, exited <-chan struct{}) error {
	network, addr, _, err := nbd.ParseURI(uri)
	if err != nil {
		return err
	}
	return livelab.AcceptsOn(network, addr, within, exited)
}
