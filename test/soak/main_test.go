// Package soak_test is the fault campaign on the running system (docs/soak.md): for
// each seed, a whole meshvol cluster in one process (internal/localcluster: a real
// kube-apiserver and etcd, the controller, five agents, drbdsim with its real write
// path and a loop device per Primary) runs a seeded random mix of operations
// (create, attach, detach, move, expand, protection changes, delete) and faults (node
// crash and restart, partitions, agent stops and restarts, controller restarts, disk
// failures) while a writer process per attached volume writes files through ext4 with
// fsync and reports every write the kernel acknowledged. After every step and at the
// end it checks what meshvol promises (see check.go's comments). A failing seed prints
// its history and the command that replays it.
//
// `go test ./test/soak/` (inside `make test`) runs one short seed;
// `make soak SEEDS=100 DURATION=2m` runs the campaign.
package soak_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

var (
	flagSeeds    = flag.Int("soak.seeds", 1, "number of seeds to run, from -soak.seed on")
	flagSeed     = flag.Uint64("soak.seed", 2, "first seed, from 1 (replay one: -soak.seeds=1 -soak.seed=N); the short form runs seed 2")
	flagDuration = flag.Duration("soak.duration", 40*time.Second, "time each seed spends injecting faults and operations")
	flagLogDir   = flag.String("soak.logdir", "", "directory for each seed's controller and agent log (default none)")
)

// writerEnv names the mount point when the test binary runs as a workload writer.
const writerEnv = "MESHVOL_SOAK_WRITER"

// seedLog is the running seed's logger, nil when it has none.
var seedLog atomic.Pointer[logr.Logger]

// seedSink hands controller-runtime's log lines to seedLog.
type seedSink struct {
	names  []string
	values []any
}

func (s seedSink) logger() (logr.Logger, bool) {
	l := seedLog.Load()
	if l == nil {
		return logr.Logger{}, false
	}
	out := *l
	for _, n := range s.names {
		out = out.WithName(n)
	}
	return out.WithValues(s.values...), true
}

func (seedSink) Init(logr.RuntimeInfo)  {}
func (seedSink) Enabled(level int) bool { return level <= 1 && seedLog.Load() != nil }
func (s seedSink) Info(level int, msg string, kv ...any) {
	if l, ok := s.logger(); ok {
		l.V(level).Info(msg, kv...)
	}
}
func (s seedSink) Error(err error, msg string, kv ...any) {
	if l, ok := s.logger(); ok {
		l.Error(err, msg, kv...)
	}
}
func (s seedSink) WithValues(kv ...any) logr.LogSink {
	s.values = append(slices.Clone(s.values), kv...)
	return s
}
func (s seedSink) WithName(name string) logr.LogSink {
	s.names = append(slices.Clone(s.names), name)
	return s
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(writerEnv); dir != "" {
		os.Exit(writerMain(dir))
	}
	// controller-runtime takes the first logger it is given, for good: give it one
	// that writes to the running seed's log (the controller logs through it).
	ctrllog.SetLogger(logr.New(seedSink{}))
	klog.SetLogger(logr.New(seedSink{})) // client-go's leader election logs through klog
	flag.Parse()
	os.Exit(m.Run())
}

// needs skips when the machine cannot run the campaign: loop devices and mounts need
// root, and the workload needs ext4's tools.
func needs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("loop devices, FUSE and mounts need root")
	}
	for _, bin := range []string{"mkfs.ext4", "mount", "umount", "losetup"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
}

func TestSoak(t *testing.T) {
	needs(t)
	if *flagSeed == 0 {
		t.Fatal("-soak.seed: seeds start at 1")
	}
	var total stats
	var failed []uint64
	for i := range *flagSeeds {
		seed := *flagSeed + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			runSeed(t, seed, *flagDuration, &total)
		})
		if !ok {
			failed = append(failed, seed)
		}
	}
	t.Logf("soak: %d seeds × %s, %d failed %v: %s", *flagSeeds, *flagDuration, len(failed), failed, total.String())
}
