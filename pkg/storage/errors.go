package storage

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test with errors.Is; the CSI layer maps them to codes
// (InvalidArgument, NotFound, AlreadyExists, ResourceExhausted,
// FailedPrecondition, DeadlineExceeded).
var (
	// ErrInvalidArgument: a size, name or other input the provider rejects
	// before (or as) the tool does.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrInvalidName: a name the backing store cannot hold (LVM's name rules,
	// file name rules). Kept apart from ErrInvalidArgument because the fix is
	// a different naming, not a different request.
	ErrInvalidName = errors.New("invalid name")
	// ErrNotFound: the volume or snapshot does not exist.
	ErrNotFound = errors.New("not found")
	// ErrNotOwned: the name is taken by a volume that does not carry our
	// ownership mark for this replica. It is never reused and never deleted.
	ErrNotOwned = errors.New("exists but is not owned by this replica")
	// ErrAlreadyExists: the name is in use in a way that conflicts with the
	// request (ours but smaller than asked, or the tool reports a name clash
	// we could not resolve).
	ErrAlreadyExists = errors.New("already exists")
	// ErrInsufficientSpace: the pool cannot hold the requested size.
	ErrInsufficientSpace = errors.New("insufficient space")
	// ErrPoolNotFound: the volume group, thin pool or pool directory is missing.
	ErrPoolNotFound = errors.New("pool not found")
	// ErrInUse: the volume is open (DRBD attached, mounted, held by a process).
	ErrInUse = errors.New("in use")
	// ErrShrinkNotSupported: a resize asked for less than the current size.
	ErrShrinkNotSupported = errors.New("shrinking is not supported")
	// ErrFailedPrecondition: the volume's state forbids the operation (for
	// example a thin origin with an old-style snapshot cannot be extended).
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrTimeout: a command did not finish in time and was killed.
	ErrTimeout = errors.New("timed out")
)

// Error is what providers return: the operation, the object, the sentinel kind
// and the detail (usually the tool's own message).
type Error struct {
	Op     string // "create", "resize", "delete", "get", "list", "capacity", "snapshot", ...
	Pool   string // "vg0", "vg0/tp", "/var/lib/meshvol/pool"
	Name   string // replica or snapshot name; empty for pool-wide operations
	Kind   error  // one of the sentinels above; nil when unclassified
	Detail string // what happened, in the tool's words where there are some
	Err    error  // underlying error (command failure, syscall), may be nil
}

func (e *Error) Error() string {
	s := "storage: " + e.Op
	if e.Name != "" {
		s += fmt.Sprintf(" %q", e.Name)
	}
	if e.Pool != "" {
		s += " in " + e.Pool
	}
	if e.Kind != nil {
		s += ": " + e.Kind.Error()
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	if e.Err != nil && e.Detail == "" {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap exposes both the kind (for errors.Is on sentinels) and the cause (for
// errors.As on command or syscall errors).
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
