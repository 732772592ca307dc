package lvm

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshvol/meshvol/pkg/storage"
)

// TestClassifyRecordedFailures feeds every recorded lvm2 failure to the
// classifier with its real stderr and exit code.
func TestClassifyRecordedFailures(t *testing.T) {
	for _, tc := range []struct {
		capture   string
		innerExit int // for compound lines: the lvm2 command's own exit code; 0 = the line's
		kind      error
	}{
		{"06a-lvcreate-thick-default-config-no-udev.txt", 0, storage.ErrFailedPrecondition},
		{"06b-lvcreate-udev_sync0-only.txt", 0, storage.ErrFailedPrecondition},
		{"33-lvcreate-thin-pool-udev-defaults.txt", 5, storage.ErrFailedPrecondition},
		{"10b-lvcreate-odd-size-bytes.txt", 0, storage.ErrInvalidArgument},
		{"12b-lvextend-same-size.txt", 0, errSizeUnchanged},
		{"12c-lvextend-smaller.txt", 0, storage.ErrShrinkNotSupported},
		{"14-lvcreate-name-exists.txt", 0, storage.ErrAlreadyExists},
		{"15-lvcreate-insufficient-space.txt", 0, storage.ErrInsufficientSpace},
		{"15b-lvcreate-insufficient-space-extents.txt", 0, storage.ErrInsufficientSpace},
		{"15c-lvextend-insufficient-space.txt", 0, storage.ErrInsufficientSpace},
		{"16-lvcreate-invalid-tag-space.txt", 0, storage.ErrInvalidArgument},
		{"16b-lvcreate-invalid-tag-comma.txt", 0, storage.ErrInvalidArgument},
		{"16g-lvcreate-tag-utf8.txt", 0, storage.ErrInvalidArgument},
		{"16e-lvcreate-invalid-lv-name.txt", 0, storage.ErrInvalidName},
		{"16e2-lvcreate-reserved-lv-name.txt", 0, storage.ErrInvalidName},
		{"16f-lvcreate-missing-vg.txt", 0, storage.ErrPoolNotFound},
		{"21-lvremove-missing.txt", 0, storage.ErrNotFound},
		{"21b-lvremove-missing-vg.txt", 0, storage.ErrPoolNotFound},
		{"21c-lvs-missing-lv.txt", 0, storage.ErrNotFound},
		{"21e-lvextend-missing.txt", 0, storage.ErrNotFound},
		{"21f-lvremove-active-open.txt", 5, storage.ErrInUse},
		{"21g-lvremove-open-suppress-fd-warn.txt", 5, storage.ErrInUse},
		{"29-lvextend-thin.txt", 0, storage.ErrFailedPrecondition},
		{"29e-lvreduce-pool.txt", 0, storage.ErrShrinkNotSupported},
		{"30-lvremove-pool-with-thins-no-y.txt", 0, storage.ErrFailedPrecondition},
		{"30b-lvremove-origin-with-cow-snap-no-y.txt", 0, storage.ErrFailedPrecondition},
		{"31-lvremove-pool-while-thin-open.txt", 5, storage.ErrInUse},
		{"vm-36-lvcreate-thin-snapshot-no-dm-snapshot.txt", 0, storage.ErrFailedPrecondition},
	} {
		t.Run(tc.capture, func(t *testing.T) {
			c := loadCapture(t, tc.capture)
			markReplayed(tc.capture)
			exit := c.exit
			if tc.innerExit != 0 {
				if !strings.Contains(c.stdout, "exit: 5\n") {
					t.Fatalf("recorded stdout does not show inner exit %d", tc.innerExit)
				}
				exit = tc.innerExit
			}
			if exit == 0 {
				t.Fatalf("capture records success, not a failure")
			}
			detail, kind := classify(&CommandError{Argv: []string{"lvm"}, ExitCode: exit, Stderr: c.stderr})
			if !errors.Is(kind, tc.kind) {
				t.Fatalf("kind %v, want %v (stderr %q)", kind, tc.kind, c.stderr)
			}
			if detail == "" || strings.Contains(detail, "File descriptor") {
				t.Fatalf("detail %q", detail)
			}
		})
	}
}

// Exit 3 with an "exists" text is not a runtime clash: the exit code is part
// of the rule, so a parse error can never be mistaken for idempotent success.
func TestClassifyNeedsMatchingExitCode(t *testing.T) {
	c := loadCapture(t, "14-lvcreate-name-exists.txt")
	if _, kind := classify(&CommandError{ExitCode: 3, Stderr: c.stderr}); kind != nil {
		t.Fatalf("exit 3 classified as %v", kind)
	}
	if _, kind := classify(&CommandError{ExitCode: 5, Stderr: "  something new\n"}); kind != nil {
		t.Fatalf("unknown text classified as %v", kind)
	}
}

// lvm2's exit 3 covers both a bad command line and a kernel without the
// device-mapper target the command needs (vm-36). The two must stay apart:
// the first is the caller's fault (InvalidArgument), the second the node's
// (FailedPrecondition), and an unknown exit-3 text is neither.
func TestClassifyExit3MissingTargetIsNotAParseError(t *testing.T) {
	c := loadCapture(t, "vm-36-lvcreate-thin-snapshot-no-dm-snapshot.txt")
	markReplayed(c.file)
	if c.exit != 3 {
		t.Fatalf("capture records exit %d, want 3", c.exit)
	}
	detail, kind := classify(&CommandError{ExitCode: 3, Stderr: c.stderr})
	if !errors.Is(kind, storage.ErrFailedPrecondition) || errors.Is(kind, storage.ErrInvalidArgument) {
		t.Fatalf("kind %v, want only %v", kind, storage.ErrFailedPrecondition)
	}
	// modprobe's own line comes first; the detail keeps it, since it names the
	// module and the directory it looked in.
	if !strings.HasPrefix(detail, "modprobe: FATAL: Module dm-snapshot not found") {
		t.Fatalf("detail %q lost modprobe's line", detail)
	}
	// A thin volume without dm_thin_pool prints the same sentence for its
	// segment type; lvm2 builds it as "<segtype>: Required ...". Not recorded,
	// so only the sentence is checked, on its own.
	if _, kind := classify(&CommandError{ExitCode: 3, Stderr: "  thin-pool: Required device-mapper target(s) not detected in your kernel.\n"}); !errors.Is(kind, storage.ErrFailedPrecondition) {
		t.Fatalf("thin-pool variant: kind %v", kind)
	}
	if _, kind := classify(&CommandError{ExitCode: 3, Stderr: "  Run `lvcreate --help' for more information.\n"}); kind != nil {
		t.Fatalf("unknown exit-3 text classified as %v", kind)
	}
}

// Lines that lvm2 prints on success too (warnings, fd leak) are not the reason
// for a failure.
func TestSuccessfulCommandsWithStderr(t *testing.T) {
	for _, f := range []string{"25-lvcreate-thin.txt", "27-lvcreate-thin-snapshot.txt", "33b-lvcreate-Zn-udev-defaults.txt"} {
		c := loadCapture(t, f)
		markReplayed(f)
		if got := messageLines(c.stderr); len(got) != 0 {
			t.Errorf("%s: warnings kept as message: %q", f, got)
		}
	}
}

func TestSizeArg(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{100 << 20, "100m"},
		{10001 << 10, "10001k"},
		{1 << 30, "1g"},
		{2 << 30, "2g"},
		{1, "512b"}, // lvm2 refuses sizes that are not a multiple of 512 (10b)
		{104857601, "104858112b"},
		{1536, "1536b"},
		{3 << 9, "1536b"},
		{(1 << 20) + 512, "1049088b"},
	} {
		if got := sizeArg(tc.in); got != tc.want {
			t.Errorf("sizeArg(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The owner tag of every valid replica name is a valid lvm2 tag: only
// characters lvm2 accepted in 07/17e, and within the documented length.
func TestOwnerTagCharacters(t *testing.T) {
	for _, name := range []string{"rvr-a", "pvc-0f2a.node-1", strings.Repeat("x", 100)} {
		if err := validateLVName("replica", "vg0", name); err != nil {
			t.Fatalf("%q: %v", name, err)
		}
		tag := ownerTag(name)
		for _, c := range tag {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_+.-/=!:#&", c)) {
				t.Fatalf("tag %q has %q", tag, c)
			}
		}
	}
}
