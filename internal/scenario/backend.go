// Package scenario is the product's scenario list written once and run on two
// backends: the in-process cluster on drbdsim (internal/localcluster, in `make
// test`) and the VM tier on real DRBD 9.2.18 (test/vm/drbd, `make test-drbd-vm`).
// Each scenario drives meshvol as Kubernetes would — CSI calls as
// external-provisioner, external-attacher and the kubelet make them — and after
// every step records what each replica's ReplicatedVolumeReplica status says and
// what DRBD itself runs, so that the two runs can be compared step by step
// (Compare). test/vm/README.md describes the VM side; test/vm/FINDINGS.md lists
// the differences between the two and their reasons.
package scenario

import (
	"context"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/meshvol/meshvol/pkg/drbd"
)

// Backend is a running meshvol: an apiserver with the controller and its CSI
// controller service, and on each node an agent, its CSI node service and DRBD
// underneath (simulated or the kernel's).
type Backend interface {
	// Name says which DRBD runs underneath: "drbdsim" or "drbd 9.2.18".
	Name() string
	// Client reaches the apiserver with every right.
	Client() client.Client
	// Namespace holds the per-volume Secrets.
	Namespace() string
	// Pool is the ReplicatedStoragePool every scenario's classes use.
	Pool() string
	// Nodes are the nodes' names, sorted.
	Nodes() []string
	// Controller is the CSI controller service, as the sidecars reach it.
	Controller() csipb.ControllerClient
	// NodeService is node's CSI node service, as its kubelet reaches it.
	NodeService(node string) csipb.NodeClient
	// Dir is an existing directory on node under which a scenario creates
	// its staging and target paths (the kubelet's directory).
	Dir(node string) string
	// Shell runs a sh script on node and returns its standard output.
	Shell(ctx context.Context, node, script string) (string, error)
	// DRBD is node's DRBD, for reading only (Status, Show).
	DRBD(node string) drbd.Driver
	// Leftovers lists what of volume is left on node outside the apiserver:
	// a configuration file, a backing volume.
	Leftovers(ctx context.Context, node, volume string) ([]string, error)
	// Crash stops node hard, as pulling its power would: no process on it
	// says goodbye. It stays down for the rest of the run.
	Crash(ctx context.Context, node string) error
	// RestartAgent kills node's `meshvol node` (SIGKILL) and starts it again;
	// DRBD keeps running.
	RestartAgent(ctx context.Context, node string) error
	// Partition cuts node off as a broken cable would: its DRBD from every
	// other node's and its agent from the apiserver (its Lease lapses). The
	// node keeps running; the scenario still reaches it (Shell, DRBD) as it
	// would its console.
	Partition(ctx context.Context, node string) error
	// Heal undoes Partition.
	Heal(ctx context.Context) error
}
