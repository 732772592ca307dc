package kubectlmeshvol

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/meshvol/meshvol/pkg/apis/storage/v1alpha1"
)

const usage = `kubectl meshvol: meshvol's volumes and nodes as an operator sees them.

Usage:
  kubectl meshvol status (PVC|RV) [flags]   one volume: members, protection, transitions, why it is not Ready
  kubectl meshvol nodes [flags]             every node: agent liveness, pool capacity, replicas, attached volumes
  kubectl meshvol drain NODE [flags]        take a node out of service: refused (naming the volumes) when a volume
                                            would lose quorum or its guaranteed redundancy; returns once it may go down
                                            (--max-downtime: fail the maintenance if the node is away longer)
  kubectl meshvol uncordon NODE [flags]     bring it back: returns once every replica on it is in sync again

Flags:
`

// Run is the plugin's main: args without the program name; it writes the view to
// stdout and returns an error for the caller to print.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kubectl-meshvol", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		kubeconfig = fs.String("kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
		kubeCtx    = fs.String("context", "", "the kubeconfig context to use")
		namespace  = fs.String("namespace", "", "the namespace of a PVC (default: the context's)")
		meshvolNS  = fs.String("meshvol-namespace", v1.DefaultNamespace, "the namespace of meshvol's controller and agent Leases")
		output     = fs.String("output", "", "output format: wide, yaml or json")
		timeout    = fs.Duration("timeout", 10*time.Minute, "how long drain and uncordon follow the maintenance")
		downtime   = fs.Duration("max-downtime", 0, "drain: how long the node may be away before the maintenance fails and the node counts as lost (spec.maxDowntime; 0: no bound)")
	)
	fs.StringVar(namespace, "n", "", "shorthand for --namespace")
	fs.StringVar(output, "o", "", "shorthand for --output")
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	out, err := ParseOutput(*output)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		fs.Usage()
		return errors.New("a command is required: status, nodes, drain or uncordon")
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: *kubeCtx})
	restCfg, err := cc.ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	ns := *namespace
	if ns == "" {
		if ns, _, err = cc.Namespace(); err != nil {
			return fmt.Errorf("kubeconfig namespace: %w", err)
		}
	}
	cl, err := client.NewWithWatch(restCfg, client.Options{Scheme: scheme()})
	if err != nil {
		return err
	}
	r := Reader{Client: cl, Namespace: ns, MeshvolNamespace: *meshvolNS}
	if pos[0] == "drain" || pos[0] == "uncordon" {
		if len(pos) != 2 {
			return fmt.Errorf("%s takes one argument: a node name", pos[0])
		}
		m := &Maintainer{Client: cl, Reader: r, Out: stdout, Timeout: *timeout, MaxDowntime: *downtime}
		if pos[0] == "drain" {
			return m.Drain(ctx, pos[1])
		}
		return m.Uncordon(ctx, pos[1])
	}
	return r.Run(ctx, pos, out, stdout, time.Now())
}

// scheme holds the kinds the plugin reads (PVCs, PVs, Nodes, agent Leases, meshvol's
// own) and no others: the plugin stays a small binary.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(coordinationv1.AddToScheme(s))
	utilruntime.Must(v1.AddToScheme(s))
	return s
}

// Run runs one command (pos[0]) with its arguments against the reader.
func (r Reader) Run(ctx context.Context, pos []string, out Output, stdout io.Writer, now time.Time) error {
	switch pos[0] {
	case "status":
		if len(pos) != 2 {
			return errors.New("status takes one argument: a PVC or ReplicatedVolume name")
		}
		o, err := r.Volume(ctx, pos[1])
		if err != nil {
			return err
		}
		return RenderVolume(stdout, BuildVolume(o, now), out)
	case "nodes":
		if len(pos) != 1 {
			return errors.New("nodes takes no arguments")
		}
		o, err := r.Nodes(ctx)
		if err != nil {
			return err
		}
		return RenderNodes(stdout, BuildNodes(o, now), out)
	}
	return fmt.Errorf("unknown command %q: status, nodes, drain or uncordon", pos[0])
}

// parseInterspersed parses flags anywhere among the arguments, as kubectl does
// (`kubectl meshvol status data -o wide`), and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
