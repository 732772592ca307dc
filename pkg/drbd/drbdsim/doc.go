// Package drbdsim simulates the DRBD 9.2 kernel module (and the drbd-utils
// commands that drive it) for many nodes in one process, behind the same
// drbd.Driver interface as the real driver, so that the node agent cannot
// tell them apart.
//
// # Shape
//
// A Cluster holds the simulated nodes, the network between them and a
// virtual clock. Cluster.Node(name) is a *Node, which implements drbd.Driver.
// All state lives under one mutex. Every operation — a Driver command, a
// fault injection, Advance — changes some state and then runs settle(),
// which drives the cluster to a fixpoint: connections come up or go down,
// handshakes compare generation UUIDs and start resyncs or detect split
// brain, every node recomputes its quorum with pkg/drbd/quorum, and the
// differences are published as events2 lines. Nothing happens between
// operations, so tests are deterministic and never sleep.
//
// Time is virtual: only Advance(d) moves it, and only time-based processes
// (resync progress, the bitmap exchange before a resync) depend on it. A
// sandbox that wants wall-clock behaviour calls RunClock, which advances
// the virtual clock in real time from a goroutine.
//
// # What is modelled (see the captures in pkg/drbd/internal/captures)
//
//   - Per node and resource: role, disk state (Diskless, Attaching,
//     Inconsistent, Outdated, Consistent, UpToDate, Failed; Negotiating
//     only for an attach that lost a peer's handshake), connection
//     state per peer (StandAlone, Unconnected, Connecting, Connected,
//     NetworkFailure, TearDown as transient loss states), replication state
//     (Off, Established, WFBitMapS/T, SyncSource/Target).
//   - A connection comes up only if both ends run the resource, each is
//     configured for the other (node-id, addresses) and the network lets
//     them through, at a connect attempt: each side tries once when it
//     starts Connecting and then every connect-int (Options.ConnectInt,
//     DRBD's default 10 s), so a link that comes back is used only at the
//     next attempt. Different shared secrets, HMAC or verify algorithms
//     put both ends StandAlone without retry; adjust connects them again.
//   - Event order as DRBD 9.2.18 prints it (pkg/drbd/drbdsim's
//     TestEventOrderMatchesRealDRBD compares with a real recording): up
//     creates the connections and paths before it attaches; a handshake
//     reports the connection with its resync state (WFBitMapS/T) at once;
//     before-resync-source/target and after-resync-target helpers run, and
//     the target goes Inconsistent with SyncTarget; a Secondary that loses
//     its Primary shows Consistent for one state change; down disconnects
//     each peer (Disconnecting, StandAlone) and destroys no peer device.
//   - Generation UUIDs per replica (current, bitmap UUID per peer, history)
//     and a per-peer bitmap of 4 KiB blocks. The handshake decides like
//     DRBD's uuid_compare: no sync, sync only the bitmap (a replica that
//     came back), full sync (a new replica, or a lost bitmap), split brain
//     (both sides changed since they parted: StandAlone + message), or
//     unrelated data.
//   - A connect is refused, both ends StandAlone until adjust, when the
//     handshake would make a Primary the SyncTarget ("I shall become
//     SyncTarget, but I am primary!", rr-conflict disconnect) or when it
//     would put two Primaries in one connected cluster without
//     allow-two-primaries (SS_TWO_PRIMARIES, also through a diskless
//     node): a Primary cut off by a partition does not rejoin a side that
//     promoted meanwhile. The initiator (lower node-id) outdates its own
//     disk if the peer has newer data and it is a Secondary, or a Primary
//     whose IO is suspended under on-no-data-accessible io-error; that
//     Primary then fails its IO with EIO.
//   - Resync at Options.ResyncRate bytes per virtual second, copying the
//     real bytes between the replicas' backing files. new-current-uuid
//     --clear-bitmap at formation skips it.
//   - Quorum via pkg/drbd/quorum with each node's OWN q/qmr, the members
//     set (updated on cluster-wide agreements only: a connection coming up,
//     a promotion, a demotion, and the lost-peer agreement after a
//     connection lost without a goodbye, which a quorate Primary refuses
//     when it would lose its quorum by it), outdated peers, the tiebreaker (keeps,
//     never gains), quorate-peer for diskless nodes, non-voting peers (the
//     non-upstream option; such a node counts itself like a diskless one).
//     A node recomputes its displayed quorum when its own view changes; a
//     peer's graceful departure (down) is absorbed without recomputing, so
//     the displayed quorum can be stale, while a promotion always computes
//     afresh (docs/drbd-quorum.md, "quorum 2" and "qmr 2" rows).
//   - Promotion: refused without quorum (-25 with DRBD's "X of Y nodes
//     visible" detail), without UpToDate data in reach (-2), with another
//     Primary in the connected component (-1, unless allow-two-primaries).
//     The promotion is a cluster-wide agreement through every reachable
//     node; diskful nodes that are reachable only indirectly are outdated
//     (docs/drbd-quorum.md row 1). Such a node that later connects to a
//     diskless Primary is resynced from an UpToDate peer it is connected to,
//     as DRBD 9.2.18 does (TRY_TO_GET_RESYNC; resyncOnDisklessPrimary).
//   - Writes through Node.Write: refused (EIO) or suspended without quorum
//     per on-no-quorum (under io-error reads fail too, as every request of
//     a device without quorum does in DRBD 9.2.18), EIO on a diskless
//     Primary without reachable data; resource-options
//     --on-no-quorum=io-error on a running resource (FailIOWithoutQuorum)
//     fails the writes it held;
//     acknowledged once every connected diskful peer has them (protocol C).
//     A writer outdates reachable diskful replicas its write cannot reach
//     (DRBD's weak nodes). The cluster remembers acknowledged writes;
//     LostAckedWrites reports an UpToDate, quorate replica that lacks one,
//     StaleUpToDate any UpToDate one (an isolated replica keeps calling
//     itself UpToDate; only quorum stops it from serving). Diverged reports
//     a split brain.
//   - Graceful down outdates a leaving UpToDate replica while an UpToDate
//     peer stays, so the survivor is the last man standing. Like DRBD
//     9.2.18 it is not atomic: a device held open read-only (a process, a
//     mount; see drbd.DeviceOpeners) lets down demote and disconnect, then
//     fail to detach (-2 with the kernel's "opened by" line); held for
//     writing it refuses at once (-12).
//   - Online verify (needs a verify-alg, -14 otherwise): VerifyS/VerifyT
//     while it compares the blocks at the resync rate, differing blocks
//     marked out of sync and resynced at the next handshake.
//   - Faults: partition (any set of links) and heal, crash and restart
//     (disks and metadata kept, resources down until Up/Adjust), disk
//     failure (detach), a command that hangs until its context ends (then
//     drbd.ErrTimeout) or fails, a slower resync, and an attach beside
//     connected peers that loses one peer's handshake and stays Negotiating
//     until the connection to that peer drops (LoseAttachHandshake; DRBD
//     9.2.18's race, test/vm/FINDINGS.md, "The product on real DRBD", 16).
//   - disconnect and connect of one peer (Disconnect, Connect, Reconnect):
//     the connection goes StandAlone and stays configured, the peer sees a
//     graceful departure.
//   - Output: events2 lines in the real text format (exists/create/change/
//     destroy, --timestamps, --statistics), status and show JSON in the
//     real shape, parsed back by pkg/drbd's parsers. Addresses print as
//     drbdsetup's address_str() does: "ipv4:10.99.0.1:7000" and
//     "ipv6:[fd00::1]:7000" in events2, "ipv4 10.99.0.1:7000" and
//     "ipv6 [fd00::1]:7000" in show (the IPv6 form is taken from
//     drbd-utils' source, not captured).
//
// # Block device
//
// Each attached replica's data is its backing device itself (a file or a
// block device path from the Resource), opened while the simulator reads or
// writes it (a write, a read, a resync step, a verify step, a hash) and
// closed after, so that an attached replica holds no file descriptor: a
// process may simulate more replicas than it may open files (10,000 3D
// volumes are 30,000 replicas, docs/scale.md, "Seventh pass: 10,000 3D
// volumes held").
//
// An attached backing file is claimed, as DRBD claims its backing device
// exclusively: attach refuses a claimed file ((114) Lower device is already
// claimed), and a file pool of plain files (pkg/storage/file, NewFiles)
// refuses to delete one. The protocol the two share, in
// internal/backingclaim: a lock file .drbd-claims in the file's directory,
// and a write lock by an open file description (fcntl F_OFD_SETLK) on its
// byte at the file's inode number. Each node holds its claims of a directory
// through one descriptor of that lock file, opened with its first claim there
// and closed with its last; detach and down release one claim, a crash all
// the node's claims, as a crashed machine's DRBD holds nothing (and the end of
// the process all of them, drbdsimd's included). Descriptions conflict with each other in one
// process too, so two nodes never claim one file; a node refuses a second
// claim of a file through its own description by its own account. A block
// device is held open while attached instead, as the kernel's DRBD holds it:
// the loop devices of a file pool tell whether they are in use by their open
// count. With Options.LoopDevices, a
// Primary has a real block device at DevicePath(res) —
// <Options.Dir>/dev/<node>/drbd<minor>, the minor of the configuration as
// drbdsetup status reports it — which the agent formats and mounts and
// pods use. It is a symlink to a loop device over a file that the cluster
// serves through FUSE (one mount, <Options.Dir>/fuse, file
// drbd<minor>@<node>), and it exists while the node is Primary.
//
// Every request the kernel sends to that device runs through the simulated
// DRBD, under the cluster lock that also orders replicated writes:
//
//   - a write (and a discard or write-zeroes, which arrive as fallocate
//     punch-hole and zero-range) is on every connected diskful replica
//     before it completes (protocol C), exactly like Node.Write: refused
//     with EIO without quorum under on-no-quorum io-error, blocked until
//     quorum returns under suspend-io, EIO without UpToDate data in reach;
//     acknowledged writes are what LostAckedWrites checks, so the oracle
//     covers a filesystem's writes;
//   - a flush (the block layer's cache flush arrives as FSYNC) passes the
//     same checks; nothing is buffered;
//   - a read comes from the local replica if UpToDate, else from a
//     connected UpToDate peer (a diskless Primary reads and writes through
//     its peers);
//   - the loop device uses direct IO, so a reader sees what the simulator
//     changes underneath (a resync, a Node.Write) and nothing is cached
//     twice; the FUSE file is write-through (no writeback cache).
//
// Resize grows the connected resource to its smallest diskful replica's
// backing size, on every connected replica at once, as drbdadm resize does,
// and syncs the grown area from one replica (the Primary's if attached) to
// the others, as DRBD's resync after an online grow does; a configured
// diskful peer that is not connected caps the size (no
// --assume-peer-has-space);
// every connected Primary's device grows with it, diskless ones included
// (the loop device re-reads the file's size). Demotion refuses (-12) while the device is mounted or
// open for writing; a read-only opener keeps the device, and its reads,
// after demotion until it closes it (down fails -2 meanwhile). A crash
// fails every later request with EIO, like a dead machine's disk; the
// filesystem on it stays mounted until someone unmounts it. Cluster.Close
// shuts the devices down in the only order that cannot hang: fail the
// requests suspended (suspend-io or no quorum) with EIO, unmount the
// filesystems on the devices, detach the loop devices, abort the FUSE
// connection and unmount it, stop the server. The abort is what ends the
// server when a mount namespace made meanwhile (unshare --mount) holds a
// copy of the FUSE mount that no unmount here reaches. drbdsim never does IO on a device or its filesystem while it
// holds the cluster lock (the kernel would wait for a handler that waits
// for the lock); a watchdog aborts the FUSE connection if a request waits
// for the lock longer than Options.DeviceWatchdog, turning such a
// deadlock into EIO (Cluster.DeviceAborted). A request suspended without
// quorum or by suspend-io fails with EIO when its device goes (demotion,
// crash, Close).
// The FUSE descriptor is close-on-exec, so the connection dies with the
// simulator's process and nothing blocked on a device outlives it; the
// next cluster on the same Options.Dir removes the dead mount, the loop
// devices over it and the filesystems on them. In tests, a writer that is
// meant to block in the kernel must be another process (dd): a thread of
// the simulator's own process blocked on its device keeps the process
// from exiting if it is killed meanwhile.
//
// Cost (Benchmark*Fsync4K, *SeqWrite; two shared cores under load 16–30,
// so best of runs): a 4 KiB write + fdatasync on ext4 takes 0.7 ms on the
// replicated device against 0.06 ms on a loop device over tmpfs (each
// fsync is 3–4 FUSE round trips: the data write, the flush, journal
// writes); sequential 1 MiB O_DIRECT writes run at about 480 MB/s against
// 1,270 MB/s. Fine for tests and the sandbox, not for load tests.
//
// Without LoopDevices, DevicePath is the same path but nothing is there;
// Node.Write and Node.Read are the write path. Either way only a Primary's
// device opens: Node.Read on a Secondary fails with EMEDIUMTYPE and
// Node.Write with EROFS, as DRBD 9.2's drbd_open refuses them with
// auto-promote no. (A reader that opened the device while it was Primary
// keeps it across the demotion, as above; drbdsim cannot refuse a new open
// of that loop device, which real DRBD would.)
//
// # Approximations
//
// may_promote and promotion_score follow a formula that reproduces every
// capture (10100 for an UpToDate local disk, plus one per connected peer
// that is not Inconsistent; 0 without quorum or data), not the kernel's
// code. The layout of create and destroy events2 lines, and of a status
// with several resources or no connections, is inferred, not captured.
// Timestamps within one operation are equal (virtual time does not move
// inside an operation).
//
// # What is not modelled
//
// Protocols A and B (everything behaves as C), rr-conflict and
// on-suspended-primary-outdated other than their defaults (disconnect), the
// refusal of two Primaries that allow-two-primaries lets connect but that
// would not be directly connected (SS_WEAKLY_CONNECTED), multiple volumes, online
// verify's status details (ov-left and friends), the soft-transition refusal of a graceful down
// that would drop a Primary's quorum (a disconnect's is modelled: Node.Disconnect), a forced
// disconnect seen by the Primary as a lost connection, fencing policies and handlers other than the
// quorum-lost and disconnected notifications, congestion, the activity log
// beyond crash recovery, two-phase-commit failures and timeouts, and the
// exact statistics counters (read/written/sent/received are counted in
// KiB of simulated IO, not the kernel's exact numbers). Metadata is held
// in memory per node (it survives a simulated crash, not the process).
package drbdsim
