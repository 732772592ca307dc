// Package v1alpha1 holds the meshvol storage API, group storage.meshvol.io.
//
// Five cluster-scoped kinds describe a replicated volume and where it lives:
//
//   - ReplicatedStoragePool (rsp): where backing volumes come from on each node.
//   - ReplicatedStorageClass (rsc): the protection and placement policy.
//   - ReplicatedVolume (rv): one volume. Its spec is the user's intent; its status is the
//     datamesh — the replica set, quorum settings and the transitions in flight — that the
//     controller publishes and the node agents converge to.
//   - ReplicatedVolumeReplica (rvr): one replica of a volume on one node. Its spec is
//     placement (written by the controller); its status is what that node's agent observes.
//   - ReplicatedVolumeAttachment (rva): a request to make a volume usable on a node,
//     one per CSI ControllerPublish.
//
// Every object half has exactly one writer, and writers use server-side apply with their
// own field manager, so no writer can clobber another's fields (see docs/architecture.md).
//
// +kubebuilder:object:generate=true
// +groupName=storage.meshvol.io
package v1alpha1
