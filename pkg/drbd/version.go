package drbd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// VersionInfo is what drbd-utils and the kernel module report about
// themselves.
type VersionInfo struct {
	UtilsVersion      string // DRBDADM_VERSION, e.g. 9.22.0
	UtilsVersionCode  int    // DRBDADM_VERSION_CODE, 0x091600
	UtilsAPIVersion   int    // DRBDADM_API_VERSION
	UtilsBuildTag     string // DRBDADM_BUILDTAG, unescaped
	KernelVersion     string // DRBD_KERNEL_VERSION; "" when no module is loaded
	KernelVersionCode int    // DRBD_KERNEL_VERSION_CODE, 0 when no module is loaded

	// From /proc/drbd (empty when the module is not loaded):
	ProcVersion     string   // "version: 9.2.18 (api:2/proto:118-124)": 9.2.18
	ProcAPI         int      // … 2
	ProtoMin        int      // … 118
	ProtoMax        int      // … 124
	ProcGitHash     string   // "GIT-hash: a7afc67e…"
	Transports      []string // "Transports (api:21): tcp (9.2.18)": tcp, rdma, ...
	TransportAPIVer int      // … 21
}

// KernelLoaded reports whether a DRBD kernel module answered.
func (v VersionInfo) KernelLoaded() bool { return v.KernelVersionCode != 0 || v.ProcVersion != "" }

// ParseDrbdadmVersion parses `drbdadm --version` (shell-style KEY=value
// lines, values with backslash escapes).
func ParseDrbdadmVersion(out []byte) (VersionInfo, error) {
	var v VersionInfo
	seen := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		key, val, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(key, "DRBD") {
			continue // e.g. "sh: 1: modinfo: not found" on a machine without the module tools
		}
		val = unescapeShell(val)
		var err error
		switch key {
		case "DRBDADM_BUILDTAG":
			v.UtilsBuildTag = val
		case "DRBDADM_API_VERSION":
			v.UtilsAPIVersion, err = strconv.Atoi(val)
		case "DRBD_KERNEL_VERSION_CODE":
			v.KernelVersionCode, err = parseHexCode(val)
		case "DRBD_KERNEL_VERSION":
			if val != "0" {
				v.KernelVersion = val
			}
		case "DRBDADM_VERSION_CODE":
			v.UtilsVersionCode, err = parseHexCode(val)
		case "DRBDADM_VERSION":
			v.UtilsVersion = val
			seen = true
		}
		if err != nil {
			return v, fmt.Errorf("drbdadm --version: %s=%q: %w", key, val, err)
		}
	}
	if !seen {
		return v, errors.New("drbdadm --version: no DRBDADM_VERSION line")
	}
	return v, nil
}

func parseHexCode(s string) (int, error) {
	n, err := strconv.ParseInt(strings.TrimPrefix(strings.ToLower(s), "0x"), 16, 32)
	return int(n), err
}

func unescapeShell(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

var (
	reProcVersion    = regexp.MustCompile(`^version: (\S+) \(api:(\d+)/proto:(\d+)-(\d+)\)`)
	reProcGit        = regexp.MustCompile(`^GIT-hash: ([0-9a-f]+)`)
	reProcTransports = regexp.MustCompile(`^Transports \(api:(\d+)\): (.*)$`)
	reTransport      = regexp.MustCompile(`(\S+) \([^)]*\)`)
)

// ParseProcDRBD fills the /proc/drbd fields of v.
func ParseProcDRBD(data []byte, v *VersionInfo) error {
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		if m := reProcVersion.FindStringSubmatch(line); m != nil {
			v.ProcVersion = m[1]
			v.ProcAPI, _ = strconv.Atoi(m[2])
			v.ProtoMin, _ = strconv.Atoi(m[3])
			v.ProtoMax, _ = strconv.Atoi(m[4])
			found = true
		} else if m := reProcGit.FindStringSubmatch(line); m != nil {
			v.ProcGitHash = m[1]
		} else if m := reProcTransports.FindStringSubmatch(line); m != nil {
			v.TransportAPIVer, _ = strconv.Atoi(m[1])
			v.Transports = nil
			for _, t := range reTransport.FindAllStringSubmatch(m[2], -1) {
				v.Transports = append(v.Transports, t[1])
			}
		}
	}
	if !found {
		return errors.New("/proc/drbd: no version line")
	}
	return nil
}

// Version runs `drbdadm --version` and reads /proc/drbd (absent when the
// module is not loaded; that is not an error, KernelLoaded says so).
func (d *ExecDriver) Version(ctx context.Context) (VersionInfo, error) {
	res, err := d.run(ctx, d.cfg.Timeout, d.cfg.Drbdadm, "--version")
	if err != nil {
		return VersionInfo{}, err
	}
	v, err := ParseDrbdadmVersion(res.Stdout)
	if err != nil {
		return v, err
	}
	data, err := os.ReadFile(d.cfg.ProcDRBD)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return v, nil
	case err != nil:
		return v, err
	}
	return v, ParseProcDRBD(data, &v)
}

// ProbeFeatures asks drbdsetup which disk options it knows. It needs no
// kernel module: drbdsetup's option tables are compiled in, and drbdadm
// accepts exactly those keywords in a .res file.
func (d *ExecDriver) ProbeFeatures(ctx context.Context) (Features, error) {
	res, err := d.run(ctx, d.cfg.Timeout, d.cfg.Drbdsetup, "help", "disk-options")
	if err != nil {
		return Features{}, err
	}
	return Features{NonVoting: bytes.Contains(res.Stdout, []byte("--non-voting"))}, nil
}
