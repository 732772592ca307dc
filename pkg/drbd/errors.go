package drbd

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Sentinel errors. A failed command is a *CommandError whose Kind is one of
// these, so callers write errors.Is(err, drbd.ErrNoQuorum). drbdsim returns
// the same sentinels (wrapped or inside a CommandError) for the same
// situations.
var (
	// ErrNoQuorum: promotion (or another state change) refused because the
	// node has no quorum: state change error -25, kernel detail such as
	// "No UpToDate peer with quorum" or "1 of 3 nodes visible, need 2 for quorum".
	ErrNoQuorum = errors.New("drbd: no quorum")
	// ErrNoUpToDateData: state change error -2 "Need access to UpToDate data"
	// (e.g. promotion when the promotion agreement outdated this side).
	ErrNoUpToDateData = errors.New("drbd: no access to UpToDate data")
	// ErrTwoPrimaries: -1 "Multiple primaries not allowed by config".
	ErrTwoPrimaries = errors.New("drbd: multiple primaries not allowed")
	// ErrDeviceInUse: -12 "Device is held open by someone" (demote/down of
	// a mounted device), or any refusal whose kernel detail names an
	// opener ("drbd0 opened by agent (pid 120) at …"): a Primary opened
	// read-only refuses `down` with -2 after it has already demoted and
	// dropped its connections (see SafeDown).
	ErrDeviceInUse = errors.New("drbd: device is held open")
	// ErrStateChangeRefused: any other refused state change.
	ErrStateChangeRefused = errors.New("drbd: state change refused")
	// ErrUnknownResource: the kernel (or drbdadm's config) does not know
	// the resource, or its configuration file does not exist (drbdadm exit
	// 20 "Can not open '…/r0.res'"; drbdsim says the same).
	ErrUnknownResource = errors.New("drbd: unknown resource")
	// ErrNoMetadata: the backing device has no (valid) DRBD metadata.
	ErrNoMetadata = errors.New("drbd: no valid metadata")
	// ErrTimeout: the command did not finish within its timeout and was
	// killed. The kernel may or may not have applied it; re-observe.
	ErrTimeout = errors.New("drbd: command timed out")
	// ErrInvalidConfig: drbdadm rejected the configuration file.
	ErrInvalidConfig = errors.New("drbd: invalid configuration")
	// ErrCommandFailed: a failure none of the above describes.
	ErrCommandFailed = errors.New("drbd: command failed")
)

// CommandError is a failed drbd-utils command. Its message carries the
// command line, exit code and stderr verbatim (a person debugging a stuck
// volume needs DRBD's own words), and Kind classifies it.
type CommandError struct {
	Args     []string // full argv, Args[0] the program
	ExitCode int      // -1 when the process did not exit normally (killed, not started)
	Stderr   string
	// StateCode is DRBD's numeric code when stderr reported one: negative
	// for a refused state change ("State change failed: (-25) No quorum"),
	// > 100 for a configuration failure ("Failure: (158) Unknown resource").
	// 0 when none was printed.
	StateCode int
	Kind      error
	Err       error // underlying error (exec failure, context), if any
}

// Error is the kind, the command, its exit code and DRBD's own words. A
// shared secret that a command echoed (drbdadm quoting a configuration
// line, show output in an error) is redacted here as well as where the
// error was built, so no path prints one.
func (e *CommandError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: `%s`", e.Kind, strings.Join(e.Args, " "))
	if e.ExitCode >= 0 {
		fmt.Fprintf(&b, " exited %d", e.ExitCode)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " (%v)", e.Err)
	}
	if s := strings.TrimSpace(e.Stderr); s != "" {
		fmt.Fprintf(&b, ": %s", s)
	}
	return RedactSecrets(b.String())
}

// Is makes errors.Is(err, ErrNoQuorum) work on a *CommandError.
func (e *CommandError) Is(target error) bool { return e.Kind == target }

func (e *CommandError) Unwrap() error { return e.Err }

// DRBD state change return codes (enum drbd_state_rv) that meshvol acts on.
const (
	ssTwoPrimaries   = -1
	ssNoUpToDateDisk = -2
	ssDeviceInUse    = -12
	ssNoQuorum       = -25
)

// DRBD configuration return codes (enum drbd_ret_code) that meshvol acts on.
const (
	errMDInvalid   = 119 // "No valid meta-data signature found"
	errResNotKnown = 158 // "Unknown resource"
)

// codedFormats are the two ways drbdsetup prints a numeric code. A code
// listed in kinds decides the kind; another code leaves it to the message
// (knownMessages), and failing that to the format's own kind.
var codedFormats = []struct {
	re    *regexp.Regexp
	kinds map[int]error
	other error
}{
	{ // drbdsetup: "r0: State change failed: (-25) No quorum"
		re: regexp.MustCompile(`State change failed: \((-?\d+)\)`),
		kinds: map[int]error{
			ssNoQuorum:       ErrNoQuorum,
			ssNoUpToDateDisk: ErrNoUpToDateData,
			ssTwoPrimaries:   ErrTwoPrimaries,
			ssDeviceInUse:    ErrDeviceInUse,
		},
		other: ErrStateChangeRefused,
	},
	{ // drbdsetup: "r0: Failure: (158) Unknown resource"
		re: regexp.MustCompile(`Failure: \((\d+)\)`),
		kinds: map[int]error{
			errResNotKnown: ErrUnknownResource,
			errMDInvalid:   ErrNoMetadata,
		},
		other: ErrCommandFailed,
	},
}

// knownMessages classify output that carries no numeric code (drbdadm's own
// checks, drbdmeta, kernel detail lines). Checked in order, case-insensitive.
var knownMessages = []struct {
	substr string
	kind   error
}{
	{"no uptodate peer with quorum", ErrNoQuorum},
	{"for quorum", ErrNoQuorum}, // "1 of 3 nodes visible, need 2 for quorum"
	{"minimum redundancy", ErrNoQuorum},
	{"no quorum", ErrNoQuorum},
	{"need access to uptodate data", ErrNoUpToDateData},
	{"multiple primaries not allowed", ErrTwoPrimaries},
	{"device is held open by someone", ErrDeviceInUse},
	{"no such resource", ErrUnknownResource},
	{"unknown resource", ErrUnknownResource},
	{"not defined in your config", ErrUnknownResource},
	{"no valid meta data found", ErrNoMetadata},
	{"no valid meta-data signature found", ErrNoMetadata},
	{"unrecognized meta data", ErrNoMetadata},
}

// reOpener is the kernel's detail line naming who holds a device open:
// "drbd0 opened by agent (pid 356) at 2026-11-23 18:29:18.862". It
// accompanies -12 (held open read-write) and also -2 when `down` of a
// Primary opened read-only gets as far as detaching (DRBD 9.2.18,
// down-ro-real.txt): either way the cause is the opener, so it decides the
// kind over the numeric code.
var reOpener = regexp.MustCompile(`(?m)^\S+ opened by .*\(pid \d+\)`)

// reNoConfigFile is drbdadm's "Can not open '/var/lib/meshvol/drbd.d/r0.res'."
// (exit 20) for a resource whose configuration file does not exist. The
// quote and the .res suffix tell it from "Can not open backing device".
var reNoConfigFile = regexp.MustCompile(`Can not open '[^']*\.res'`)

// classify derives DRBD's numeric code (0 if none was printed) and the
// error kind from a failed command's stderr. The exit code adds nothing:
// drbdsetup maps several state errors to the same exit code. A generic code
// can still carry a kernel detail line that says more (a quorum reason
// attached to a refused state change), hence the messages after the codes.
func classify(stderr string) (code int, kind error) {
	if reOpener.MatchString(stderr) {
		if m := codedFormats[0].re.FindStringSubmatch(stderr); m != nil {
			code, _ = strconv.Atoi(m[1])
		}
		return code, ErrDeviceInUse
	}
	if reNoConfigFile.MatchString(stderr) {
		return 0, ErrUnknownResource
	}
	for _, f := range codedFormats {
		m := f.re.FindStringSubmatch(stderr)
		if m == nil {
			continue
		}
		code, _ = strconv.Atoi(m[1])
		if k, ok := f.kinds[code]; ok {
			return code, k
		}
		if k := byMessage(stderr); k != nil {
			return code, k
		}
		return code, f.other
	}
	if k := byMessage(stderr); k != nil {
		return 0, k
	}
	return 0, ErrCommandFailed
}

func byMessage(stderr string) error {
	low := strings.ToLower(stderr)
	for _, m := range knownMessages {
		if strings.Contains(low, m.substr) {
			return m.kind
		}
	}
	return nil
}

// reSecret finds a shared secret in the ways drbd-utils print one: a .res
// or `drbdsetup show` line (shared-secret "x";), `show --json`
// ("shared-secret": "x") and a Go map print of parsed show output
// (shared-secret:x).
var reSecret = regexp.MustCompile(`(shared-secret"?\s*[:= ]\s*)("(?:[^"\\]|\\.)*"|\S+)`)

// Redacted replaces a shared secret wherever meshvol prints one.
const Redacted = "<redacted>"

// RedactSecrets replaces every shared secret in s (as drbd-utils print
// them, see reSecret) with Redacted. Anything that may hold show output or
// a configuration file passes through it before it reaches a log, an
// event, a status field or an error.
func RedactSecrets(s string) string {
	if !strings.Contains(s, "shared-secret") {
		return s
	}
	return reSecret.ReplaceAllString(s, "${1}"+Redacted)
}

// cleanStderr drops the two lines drbdadm prints whenever __DRBD_NODE__ is
// set ("found __DRBD_NODE__ in environment", "PRETENDING that I am
// >>node<<") and the blank line after them: the driver sets the variable
// on purpose (ExecConfig.NodeName), so they say nothing about a failure
// and would open every error message. Secrets are redacted too.
func cleanStderr(b []byte) string {
	s := string(b)
	if strings.Contains(s, "__DRBD_NODE__") || strings.Contains(s, "PRETENDING that I am") {
		var keep []string
		for _, l := range strings.Split(s, "\n") {
			t := strings.TrimSpace(l)
			if strings.HasPrefix(t, "found __DRBD_NODE__ in environment") || strings.HasPrefix(t, "PRETENDING that I am >>") {
				continue
			}
			keep = append(keep, l)
		}
		s = strings.TrimLeft(strings.Join(keep, "\n"), "\n")
	}
	return RedactSecrets(s)
}
