package throttlelive

import (
	"os"
	"testing"

	"sluice/livetest/livelab"
)

// sluiceBin is the sluice binary built for this run (the agent, the
// controller, ctl; the lab's gateway in the overhead bench).
var sluiceBin string

func TestMain(m *testing.M) { os.Exit(livelab.RunWithSluice(m, &sluiceBin)) }
