package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// memoryCgroup is a memory cgroup of the run's own, limited as the chart limits
// the controller's container (charts/meshvol/values.yaml, controller
// `resources.limits.memory`), which the controller runs in (-controller-memory-limit):
// the kernel enforces the limit as it would on the pod, and `meshvol controller`
// reads it and sets its runtime's soft limit from it (internal/memlimit), as it does
// in its container.
type memoryCgroup struct {
	dir   string // its directory under the cgroup file system
	procs string // the file a process joins it through
}

// newMemoryCgroup makes the cgroup under /sys/fs/cgroup (the memory hierarchy of
// cgroup v1, else the unified one of v2) and limits it to limit bytes.
func newMemoryCgroup(limit int64) (*memoryCgroup, error) {
	name := "meshvol-bench-" + strconv.Itoa(os.Getpid())
	dir, file := filepath.Join("/sys/fs/cgroup/memory", name), "memory.limit_in_bytes"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir, file = filepath.Join("/sys/fs/cgroup", name), "memory.max"
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("a memory cgroup for the controller: %w", err)
	}
	cg := &memoryCgroup{dir: dir, procs: filepath.Join(dir, "cgroup.procs")}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = cg.remove()
		return nil, fmt.Errorf("limiting the controller's memory cgroup: %w", err)
	}
	return cg, nil
}

// wrap returns the command line that runs bin with args inside the cgroup: a
// shell joins it and then becomes bin, so that the controller is in the cgroup
// from its first instruction (it reads its limit at start).
func (cg *memoryCgroup) wrap(bin string, args []string) (string, []string) {
	return "/bin/sh", append([]string{"-c", `echo $$ > "$0" && exec "$@"`, cg.procs, bin}, args...)
}

// oomKills is how many times the kernel killed a process of the cgroup for
// going over its limit (v2's memory.events, v1's memory.oom_control), "-" when
// neither says.
func (cg *memoryCgroup) oomKills() string {
	for _, file := range []string{"memory.events", "memory.oom_control"} {
		b, err := os.ReadFile(filepath.Join(cg.dir, file))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
				return v
			}
		}
	}
	return "-"
}

// remove removes the cgroup once no process is left in it.
func (cg *memoryCgroup) remove() error { return os.Remove(cg.dir) }
