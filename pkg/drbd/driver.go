package drbd

import (
	"context"
	"io"
)

// ForceReason says why a command must be forced. The empty reason means "do
// not force"; anything else is logged and turns into --force. Forcing is how
// data gets lost, so the type makes the caller write down why.
type ForceReason string

// NoForce is the zero ForceReason.
const NoForce ForceReason = ""

// Driver is everything the node agent does to DRBD. Two implementations:
// ExecDriver (drbd-utils on a real kernel) and drbdsim.Node (one node of
// a simulated cluster).
//
// Every method takes a context; implementations must return when it is
// done. Errors are *CommandError (or wrap one of the Err* sentinels), so
// callers branch with errors.Is(err, ErrNoQuorum) and friends.
type Driver interface {
	// WriteConfig validates r and makes it the resource's configuration.
	// Real: atomic write of <confdir>/<name>.res (temp file, fsync, rename,
	// fsync dir). Sim: stores the model. Nothing is applied to the kernel
	// until Up or Adjust.
	WriteConfig(ctx context.Context, r *Resource) error
	// RemoveConfig deletes the configuration; removing a missing one is not
	// an error.
	RemoveConfig(ctx context.Context, name string) error
	// HasMetadata reports whether the backing device carries DRBD metadata.
	HasMetadata(ctx context.Context, name string) (bool, error)
	// CreateMetadata runs `drbdadm create-md --max-peers=N --force name`.
	// (That --force only answers create-md's "really overwrite?" prompt; the
	// caller checks HasMetadata first.)
	CreateMetadata(ctx context.Context, name string, maxPeers int) error
	Up(ctx context.Context, name string) error
	Adjust(ctx context.Context, name string) error
	Down(ctx context.Context, name string) error
	// Primary promotes; a non-empty force is logged and passed as --force.
	Primary(ctx context.Context, name string, force ForceReason) error
	Secondary(ctx context.Context, name string) error
	// NewCurrentUUIDClearBitmap skips the initial sync. Only at formation,
	// when every replica is empty (docs/architecture.md, "Safety rules the code relies on").
	NewCurrentUUIDClearBitmap(ctx context.Context, name string) error
	Resize(ctx context.Context, name string) error
	// SuspendIO is `drbdadm suspend-io`: new IO on the device waits until
	// ResumeIO; what is in flight completes first. Snapshots across
	// replicas are taken while it holds (docs/snapshots.md).
	SuspendIO(ctx context.Context, name string) error
	// ResumeIO is `drbdadm resume-io`; a success when nothing is suspended.
	ResumeIO(ctx context.Context, name string) error
	// FailIOWithoutQuorum is `drbdsetup resource-options <name>
	// --on-no-quorum=io-error`: from now on the resource fails writes with
	// EIO while it has no quorum instead of suspending them, and the writes
	// it holds suspended for lack of quorum fail with EIO too (DRBD 9.2
	// recomputes its state when on-no-quorum changes and completes a
	// request with an error while it has no quorum under io-error). Only
	// that option changes; the configuration file is left as it is.
	FailIOWithoutQuorum(ctx context.Context, name string) error
	// RecomputeQuorum makes DRBD compute the resource's quorum afresh:
	// `drbdsetup resource-options <name> --quorum=<q±1>`, then `--quorum=<q>`,
	// where q is the explicit count the resource runs with. DRBD 9.2 computes
	// quorum only in a state change that changes something, and a state
	// change of the option forces one (drbd_main.c set_resource_options,
	// CS_FORCE_RECALC). A node without a disk is quorate through a connected
	// UpToDate peer whose last state report said it has quorum, and a report
	// that changes only that is no state change: the node shows quorum:no
	// until something else changes (docs/drbd-quorum.md, "A peer's quorum
	// reaches a diskless node late"). The intermediate count must decide as q
	// does: callers use it where no node can count that many votes (a
	// diskless member's q=32). Only the quorum option changes; the
	// configuration file is left as it is.
	RecomputeQuorum(ctx context.Context, name string, q Quorum) error
	ForgetPeer(ctx context.Context, name string, peerNodeID int) error
	// Reconnect drops the connection to one peer and starts connecting to it
	// again at once: `drbdsetup disconnect <name> <peer>`, then `drbdsetup
	// connect <name> <peer>`. Unforced, the disconnect is a cluster-wide
	// state change the peers vote on, and a quorate Primary refuses one that
	// would take its quorum (drbd_state.c, "prevent graceful
	// disconnect/detach that would kill quorum"; docs/drbd-quorum.md): the
	// error is then ErrStateChangeRefused. A non-empty force is logged and
	// passed as --force: a hard disconnect nobody can refuse, which the peer
	// takes as a lost connection. The connection keeps its configuration
	// (peer, paths, options), so the connect needs nothing from the file.
	// What it is for: an attach that lost a peer's handshake stays
	// Negotiating until the connection to that peer drops
	// (test/vm/FINDINGS.md, "The product on real DRBD", 16; pkg/agent's
	// attach-stall watchdog).
	Reconnect(ctx context.Context, name string, peerNodeID int, force ForceReason) error
	Verify(ctx context.Context, name string, peerNodeID int) error
	// Status is `drbdsetup status --json --verbose --statistics <name>`;
	// name "" or "all" means every resource.
	Status(ctx context.Context, name string) ([]StatusResource, error)
	// Show is `drbdsetup show --json <name>`; "" or "all" means every resource.
	Show(ctx context.Context, name string) ([]ShowResource, error)
	// Events starts `drbdsetup events2 --timestamps --statistics --full all`
	// and returns its stdout. It runs until ctx is done or the stream is
	// closed; the Observer restarts it when it ends.
	Events(ctx context.Context) (io.ReadCloser, error)
	// DevicePath is the block device of the resource (/dev/drbd<minor>).
	DevicePath(name string) string
}

// Features says what the DRBD in use supports beyond upstream 9.2.
type Features struct {
	// NonVoting: the kernel and drbd-utils understand the disk option
	// `non-voting` (upstream DRBD 9.2.18 / drbd-utils 9.22 do not).
	NonVoting bool
}
