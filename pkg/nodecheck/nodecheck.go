// Package nodecheck checks a node's prerequisites for the meshvol agent with the
// real DRBD driver: the DRBD 9.2 kernel module and its TCP transport, drbd-utils
// 9.22 or later, device-mapper for LVM pools, and the filesystem tools the CSI node
// service runs. docs/install.md lists them and says where users get them.
//
// A missing prerequisite is a finding, not an error: the agent keeps running,
// reports the findings (readiness, a log line each, its Lease), and checks again
// later, so a module loaded after the agent started is picked up without a restart.
package nodecheck

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// Finding is the outcome of one check.
type Finding struct {
	// Name is what was checked, e.g. "drbd kernel module".
	Name string
	OK   bool
	// Detail is what was found ("9.2.18") or, when !OK, what is wrong and how to fix it.
	Detail string
}

func (f Finding) String() string {
	if f.OK {
		return fmt.Sprintf("%s: ok (%s)", f.Name, f.Detail)
	}
	return fmt.Sprintf("%s: %s", f.Name, f.Detail)
}

// Options say what to check and where.
type Options struct {
	// Root is prepended to /proc and /sys paths ("" means the real ones); tests point
	// it at a recorded tree.
	Root string
	// LVM: the node serves an LVM or LVMThin pool; Thin: an LVMThin pool.
	LVM, Thin bool
	// DRBDAdmVersion returns `drbdadm --version`'s output. Nil runs drbdadm.
	DRBDAdmVersion func(ctx context.Context) (string, error)
	// LookPath finds a program. Nil means exec.LookPath.
	LookPath func(string) (string, error)
}

// Minimum versions meshvol is built for (docs/drbd-quorum.md: 9.2's quorum rules).
var (
	MinKernelDRBD = [3]int{9, 2, 0}
	MinDRBDUtils  = [3]int{9, 22, 0}
)

// Check runs every check and returns one finding per check, in a fixed order.
func Check(ctx context.Context, o Options) []Finding {
	if o.LookPath == nil {
		o.LookPath = exec.LookPath
	}
	if o.DRBDAdmVersion == nil {
		o.DRBDAdmVersion = func(ctx context.Context) (string, error) {
			out, err := exec.CommandContext(ctx, "drbdadm", "--version").Output()
			return string(out), err
		}
	}
	fs := []Finding{kernelDRBD(o.Root), module(o.Root, "drbd_transport_tcp", "DRBD's TCP transport",
		"load it with `modprobe drbd_transport_tcp` (it comes with the DRBD 9 module)")}
	fs = append(fs, drbdUtils(ctx, o.DRBDAdmVersion))
	if o.LVM || o.Thin {
		fs = append(fs, module(o.Root, "dm_mod", "device-mapper", "load it with `modprobe dm_mod`"))
	}
	if o.Thin {
		fs = append(fs, module(o.Root, "dm_thin_pool", "device-mapper thin provisioning",
			"load it with `modprobe dm_thin_pool`"), module(o.Root, "dm_snapshot", "device-mapper snapshots",
			"load it with `modprobe dm_snapshot` (lvm2 needs it for thin snapshots)"))
	}
	for _, prog := range []string{"mkfs.ext4", "mkfs.xfs", "blkid", "losetup", "resize2fs", "xfs_growfs"} {
		f := Finding{Name: prog}
		if p, err := o.LookPath(prog); err != nil {
			f.Detail = "not found in PATH: the meshvol image ships it; a custom image must too"
		} else {
			f.OK, f.Detail = true, p
		}
		fs = append(fs, f)
	}
	return fs
}

// Missing returns the findings that failed, as strings, for a condition message.
func Missing(fs []Finding) []string {
	var out []string
	for _, f := range fs {
		if !f.OK {
			out = append(out, f.String())
		}
	}
	return out
}

func kernelDRBD(root string) Finding {
	f := Finding{Name: "drbd kernel module"}
	v := ""
	if b, err := os.ReadFile(filepath.Join(root, "/proc/drbd")); err == nil {
		// "version: 9.2.18 (api:2/proto:118-124)"
		first, _, _ := strings.Cut(string(b), "\n")
		if rest, ok := strings.CutPrefix(first, "version: "); ok {
			v, _, _ = strings.Cut(rest, " ")
		}
	} else if b, err := os.ReadFile(filepath.Join(root, "/sys/module/drbd/version")); err == nil {
		v = strings.TrimSpace(string(b))
	}
	if v == "" {
		f.Detail = "not loaded (no /proc/drbd): install DRBD 9.2 for this kernel (vendor kmod/dkms packages or a module-loader container) and `modprobe drbd`"
		return f
	}
	got, err := parseVersion(v)
	if err != nil {
		f.Detail = fmt.Sprintf("cannot read its version %q: %v", v, err)
		return f
	}
	if less(got, MinKernelDRBD) {
		f.Detail = fmt.Sprintf("version %s is loaded, meshvol needs %d.%d or later (the in-tree drbd of mainline kernels is 8.4 and does not work)", v, MinKernelDRBD[0], MinKernelDRBD[1])
		return f
	}
	f.OK, f.Detail = true, v
	return f
}

func module(root, name, what, fix string) Finding {
	f := Finding{Name: name + " (" + what + ")"}
	if _, err := os.Stat(filepath.Join(root, "/sys/module", name)); err != nil {
		f.Detail = "not loaded: " + fix
		return f
	}
	f.OK, f.Detail = true, "loaded"
	return f
}

func drbdUtils(ctx context.Context, run func(context.Context) (string, error)) Finding {
	f := Finding{Name: "drbd-utils"}
	out, err := run(ctx)
	if err != nil {
		f.Detail = fmt.Sprintf("`drbdadm --version` failed: %v (the meshvol image ships drbd-utils 9.22)", err)
		return f
	}
	v := ""
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(line, "DRBDADM_VERSION="); ok {
			v = strings.TrimSpace(rest)
		}
	}
	if v == "" {
		f.Detail = "`drbdadm --version` printed no DRBDADM_VERSION line"
		return f
	}
	got, err := parseVersion(v)
	if err != nil {
		f.Detail = fmt.Sprintf("cannot read drbdadm's version %q: %v", v, err)
		return f
	}
	if less(got, MinDRBDUtils) {
		f.Detail = fmt.Sprintf("drbdadm %s, meshvol needs %d.%d or later", v, MinDRBDUtils[0], MinDRBDUtils[1])
		return f
	}
	f.OK, f.Detail = true, "drbdadm "+v
	return f
}

func parseVersion(s string) ([3]int, error) {
	var v [3]int
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 2 {
		return v, fmt.Errorf("want MAJOR.MINOR[.PATCH]")
	}
	for i, p := range parts {
		// "18-1" or "0rc1": the leading digits count.
		end := 0
		for end < len(p) && p[end] >= '0' && p[end] <= '9' {
			end++
		}
		n, err := strconv.Atoi(p[:end])
		if err != nil {
			return v, fmt.Errorf("part %q is not a number", p)
		}
		v[i] = n
	}
	return v, nil
}

func less(a, b [3]int) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}
