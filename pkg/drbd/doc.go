// Package drbd is meshvol's boundary with DRBD 9.
//
// It holds the desired configuration of one resource on one node (Resource,
// with options resolved through a nil-means-inherit override chain), renders it
// into the .res text drbdadm understands, and hides the drbd-utils commands
// behind the Driver interface. ExecDriver is the real implementation
// (drbdadm/drbdsetup/drbdmeta with a timeout on every call); drbdsim, a
// sub-package, is the simulated one. The parsers for `drbdsetup events2`,
// `status --json` and `show --json` and the Observer that keeps a per-resource
// snapshot from the event stream live here too, so that both drivers are read
// back the same way.
package drbd
