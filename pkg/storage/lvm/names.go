package lvm

import (
	"fmt"
	"strings"
)

// Tags mark what the provider created. lvm2 accepts '/', '=' and '.' in tags and
// rejects space, ',' and non-ASCII (README finding 4, captures 16, 16b, 16g), so
// a Kubernetes-style "domain/key=value" tag is stored verbatim (07, 08) and can
// be selected on (17, 17c, 17d). A leading '@' would be stripped (16c2); none of
// our tags starts with one.
const (
	// ownerKey marks a volume as the backing volume of the replica named after
	// '=': meshvol.io/owner=rvr-a.
	ownerKey = "meshvol.io/owner="
	// snapshotKey and originKey mark a thin snapshot we took, and of which
	// replica's volume. The snapshot keeps them when its origin is removed
	// (lvm2 then clears the origin column, 30f), so ownership and provenance
	// do not depend on the origin still existing.
	snapshotKey = "meshvol.io/snapshot="
	originKey   = "meshvol.io/origin="

	// maxTagLen is lvm2's documented tag limit (lvm(8)). The recorded build
	// accepted 1117 characters (16d); we stay within the documented bound.
	maxTagLen = 1024
	// maxDMNameLen: the device-mapper name "vg-lv" (with '-' doubled) must fit
	// DM_NAME_LEN (128, including the NUL).
	maxDMNameLen = 127
)

func ownerTag(replica string) string    { return ownerKey + replica }
func snapshotTag(name string) string    { return snapshotKey + name }
func originTag(replica string) string   { return originKey + replica }
func tagValue(lv LV, key string) string { return firstTagValue(lv.Tags, key) }

func firstTagValue(tags []string, key string) string {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, key); ok {
			return v
		}
	}
	return ""
}

// reservedSubstrings are the name parts lvm2 keeps for its hidden LVs (lvm(8),
// "_tdata" refused in capture 16e2).
var reservedSubstrings = []string{
	"_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage",
	"_mlog", "_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
}

// validateName checks a VG, LV or snapshot name against lvm2's rules, so a bad
// name is refused with the rule it breaks instead of lvm2's exit 3 (16e). The
// LV name is the replica name unchanged: Kubernetes object names
// ([a-z0-9.-]) are valid LV names except for the prefixes below, and a name
// that equals the replica is what lets a restarted agent find its volumes
// without a lookup table.
func validateName(field, name string) error {
	if name == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if name == "." || name == ".." {
		return fmt.Errorf("%s %q: lvm2 does not allow \".\" or \"..\"", field, name)
	}
	if name[0] == '-' {
		return fmt.Errorf("%s %q: lvm2 names must not start with '-'", field, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '+' || c == '_' || c == '.' || c == '-'
		if !ok {
			return fmt.Errorf("%s %q: character %q is not allowed (lvm2 names use A-Z a-z 0-9 + _ . -)", field, name, c)
		}
	}
	return nil
}

// validateLVName adds the rules for LV names: reserved prefixes and
// substrings, and the device-mapper name length in this VG.
func validateLVName(field, vg, name string) error {
	if err := validateName(field, name); err != nil {
		return err
	}
	for _, p := range []string{"snapshot", "pvmove"} {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("%s %q: lvm2 reserves names starting with %q", field, name, p)
		}
	}
	for _, s := range reservedSubstrings {
		if strings.Contains(name, s) {
			return fmt.Errorf("%s %q: lvm2 reserves names containing %q", field, name, s)
		}
	}
	dm := strings.ReplaceAll(vg, "-", "--") + "-" + strings.ReplaceAll(name, "-", "--")
	if len(dm) > maxDMNameLen {
		return fmt.Errorf("%s %q: device-mapper name %q is %d characters, the limit is %d", field, name, dm, len(dm), maxDMNameLen)
	}
	if len(ownerKey)+len(name) > maxTagLen || len(snapshotKey)+len(name) > maxTagLen {
		return fmt.Errorf("%s %q: too long for an lvm2 tag (limit %d)", field, name, maxTagLen)
	}
	return nil
}

// sizeArg formats a byte count for -L/-V. lvm2 refuses byte counts that are
// not a multiple of 512 (10b), so the size is first rounded up to 512; it is
// then written in the largest binary unit that divides it exactly (lvm2's
// k/m/g are KiB/MiB/GiB for sizes), which keeps the exact value and reads like
// the recorded commands ("100m", "10001k", "1g"). lvm2 rounds further up to a
// whole extent (10, 12d); the provider reports the size lvs shows afterwards.
func sizeArg(bytes int64) string {
	const sector = 512
	if r := bytes % sector; r != 0 {
		bytes += sector - r
	}
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}} {
		if bytes%u.size == 0 {
			return fmt.Sprintf("%d%s", bytes/u.size, u.suffix)
		}
	}
	return fmt.Sprintf("%db", bytes)
}
