package agent

import "github.com/prometheus/client_golang/prometheus/testutil"

// ReleaseFinalizer is releaseFinalizer, for the tests of its two ways against a real
// apiserver.
var ReleaseFinalizer = releaseFinalizer

// CollectorPasses is how many collector passes the agents of this process have run
// (meshvol_agent_collector_passes_total).
func CollectorPasses() int { return int(testutil.ToFloat64(collectorPasses)) }
