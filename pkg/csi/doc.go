// Package csi serves meshvol's CSI Identity, Controller and Node services (CSI spec
// v1.x; docs/contract.md, "CSI") over a unix socket.
//
// The services are thin. The controller service (in `meshvol controller`) turns RPCs
// into ReplicatedVolume and ReplicatedVolumeAttachment specs and waits, bounded by the
// RPC's deadline, for the statuses the controller writes (docs/contract.md). The node
// service (in `meshvol node`) stages and publishes the DRBD device its own node's
// replica reports once the agent has made it Primary. Both read from informer caches;
// the only writes are the controller service's creates, deletes and its one
// server-side apply of spec.size.
//
// Every RPC is idempotent, a second call for a volume while one runs is Aborted
// (inflight.go), and every error carries the spec's code and names the field or the
// cause.
package csi
