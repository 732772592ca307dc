package storage

import (
	"errors"
	"os"
	"testing"
)

func TestErrorKindsAndCause(t *testing.T) {
	cause := os.ErrPermission
	err := error(&Error{Op: "create", Pool: "vg0", Name: "rvr-a", Kind: ErrInsufficientSpace,
		Detail: `Volume group "vg0" has insufficient free space (201 extents): 512 required.`, Err: cause})
	if !errors.Is(err, ErrInsufficientSpace) || !errors.Is(err, os.ErrPermission) || errors.Is(err, ErrNotFound) {
		t.Fatalf("errors.Is broken for %v", err)
	}
	want := `storage: create "rvr-a" in vg0: insufficient space: Volume group "vg0" has insufficient free space (201 extents): 512 required.`
	if err.Error() != want {
		t.Fatalf("got  %s\nwant %s", err, want)
	}
	bare := &Error{Op: "list", Pool: "/pool", Err: cause}
	if got := bare.Error(); got != "storage: list in /pool: permission denied" {
		t.Fatalf("got %s", got)
	}
}
