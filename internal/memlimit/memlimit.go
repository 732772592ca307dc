// Package memlimit gives the Go runtime a soft memory limit below the memory
// limit of the cgroup the process runs in: a container's, as the chart sets
// for each of meshvol's pods (charts/meshvol/values.yaml, `resources`).
//
// Without it the runtime lets the heap grow to twice what is live before it
// collects (GOGC=100), whatever the container allows: a controller holding
// 10,000 3D volumes has about 300 MB live and reached 628 MB resident, over
// its 512Mi limit, where the kernel would have killed it (docs/scale.md,
// "Seventh pass: 10,000 3D volumes held"). With a soft limit the runtime
// collects more often as the heap nears it instead.
//
// GOMEMLIMIT, when set, is the operator's choice and is left alone.
package memlimit

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Fraction of the cgroup's limit given to the runtime as its soft limit. The
// rest is for what the runtime does not count (the binary's pages, memory the
// runtime has released but the kernel has not yet taken back) and for the
// heap overshooting the soft limit while a collection runs.
const Fraction = 0.9

// unlimited: cgroup v1 shows no limit as the largest page-aligned int64, and
// no real limit comes near it.
const unlimited = 1 << 62

// Apply sets the runtime's soft memory limit to Fraction of the memory limit of
// the process's cgroup, unless GOMEMLIMIT is set or the cgroup has no limit.
// It returns the cgroup's limit and the soft limit set (0 and 0 when none was
// set).
func Apply() (cgroup, soft int64, err error) {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return 0, 0, nil
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, 0, fmt.Errorf("memlimit: %w", err)
	}
	cgroup, err = Limit(self, "/sys/fs/cgroup")
	if err != nil || cgroup == 0 {
		return 0, 0, err
	}
	soft = Soft(cgroup)
	debug.SetMemoryLimit(soft)
	return cgroup, soft, nil
}

// Soft is the soft limit Apply sets for a cgroup limited to cgroup bytes.
func Soft(cgroup int64) int64 { return int64(float64(cgroup) * Fraction) }

// Limit is the memory limit, in bytes, of the cgroup that procCgroup (the
// content of /proc/<pid>/cgroup) names, under the cgroup file systems mounted
// at root; 0 when it has none. A limit on an ancestor bounds its descendants,
// so it is the smallest limit on the way from the process's cgroup up to the
// root that can be read. Under cgroup v1 it is the memory controller's
// hierarchy (root/memory), under v2 the unified one (root). In a container
// with its own cgroup namespace the process's cgroup is "/": the container's
// own, which is then mounted at root.
func Limit(procCgroup []byte, root string) (int64, error) {
	dir, file, err := memoryCgroup(procCgroup)
	if err != nil {
		return 0, err
	}
	base := root
	if file == "memory.limit_in_bytes" {
		base = filepath.Join(root, "memory")
	}
	var limit int64
	for p := dir; ; p = path.Dir(p) {
		b, err := os.ReadFile(filepath.Join(base, p, file))
		if err == nil {
			v := strings.TrimSpace(string(b))
			if v != "max" {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("memlimit: %s: %w", filepath.Join(base, p, file), err)
				}
				if n < unlimited && (limit == 0 || n < limit) {
					limit = n
				}
			}
		}
		if p == "/" {
			return limit, nil
		}
	}
}

// memoryCgroup finds the process's memory cgroup in the lines of
// /proc/<pid>/cgroup ("hierarchy:controllers:path"): the hierarchy that lists
// the memory controller (cgroup v1), else the unified one (v2, hierarchy 0,
// no controllers listed); and the file of its limit.
func memoryCgroup(procCgroup []byte) (dir, file string, err error) {
	unified := ""
	sc := bufio.NewScanner(bytes.NewReader(procCgroup))
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 3)
		if len(fields) != 3 {
			continue
		}
		for _, c := range strings.Split(fields[1], ",") {
			if c == "memory" {
				return path.Clean("/" + fields[2]), "memory.limit_in_bytes", nil
			}
		}
		if fields[0] == "0" && fields[1] == "" {
			unified = path.Clean("/" + fields[2])
		}
	}
	if unified == "" {
		return "", "", fmt.Errorf("memlimit: no memory cgroup in /proc/self/cgroup")
	}
	return unified, "memory.max", nil
}
