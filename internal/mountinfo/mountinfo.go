// Package mountinfo reads /proc/self/mountinfo for the packages that look for
// mounts themselves (drbd's openers, drbdsim, kubecluster, localcluster).
// k8s.io/mount-utils' ParseMountInfo does the field parsing; what it leaves
// undone is the kernel's octal escapes in the paths (\040 for a space), which
// this package undoes so that callers compare paths as they gave them.
package mountinfo

import (
	"strconv"
	"strings"

	mount "k8s.io/mount-utils"
)

// Self is this process's mount table.
const Self = "/proc/self/mountinfo"

// Mount is one line of mountinfo, with Root, MountPoint and Source unescaped.
type Mount = mount.MountInfo

// Read parses the mount table of this process.
func Read() ([]Mount, error) { return ReadFile(Self) }

// ReadFile parses a mountinfo file (a test may give a recorded one).
func ReadFile(path string) ([]Mount, error) {
	ms, err := mount.ParseMountInfo(path)
	if err != nil {
		return nil, err
	}
	for i := range ms {
		ms[i].Root = Unescape(ms[i].Root)
		ms[i].MountPoint = Unescape(ms[i].MountPoint)
		ms[i].Source = Unescape(ms[i].Source)
	}
	return ms, nil
}

// Under lists the mount points at dir or below it, in mount order (a point
// stacked twice is listed twice).
func Under(ms []Mount, dir string) []string {
	var out []string
	for _, m := range ms {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m.MountPoint)
		}
	}
	return out
}

// Unescape undoes mountinfo's octal escapes (space, tab, newline and
// backslash as three octal digits) in a path field.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
